"""Asks the GPU vLLM's own code about our command lines and request bodies.

    python -m tests.gpu_engine.probe SRC QUESTIONS.json ANSWERS.json

SRC is the folder `tests.gpu_engine.wheel` made from the GPU `vllm` wheel; it goes first on
``sys.path``, so ``import vllm`` is that version's code (with this venv's other packages:
torch for CPU, transformers, pydantic, ...). Two things cannot come from the wheel here:

* its compiled CUDA extensions (``vllm._C_stable_libtorch`` and the rest: the wheel's
  ``.so`` files, listed in ``native-modules.txt``) are replaced by empty modules, since
  nothing here can load them. Parsing and request validation call none of them;
* the platform: vLLM finds none on a machine without a GPU, and its argument defaults need
  one, so its own ``vllm.platforms.cuda.CudaPlatform`` is installed as the current platform.

QUESTIONS holds ``argvs`` (lists: the engine command lines the launcher builds) and
``bodies`` (``{"path", "body"}``: what the server sends the engine). For each argv, the answer
is what ``python -m vllm.entrypoints.openai.api_server`` itself does before loading a model:
``make_arg_parser`` + ``parse_args``, ``validate_parsed_serve_args``,
``validate_api_server_args`` (the tool parser's name), ``AsyncEngineArgs.from_cli_args`` - and
one check more: every ``--flag`` must be an option's full name (argparse would take a prefix
of a longer option; a renamed flag must not pass as an abbreviation). For each body: the
version's request model (``ChatCompletionRequest``/``CompletionRequest``) validates it, every
key we send is one of that model's fields (vLLM's models accept and silently drop unknown
keys), nested ``structured_outputs``/``stream_options``/``response_format`` alike, and
``to_sampling_params`` builds the engine's sampling parameters from it.
Answers are written to ANSWERS.json (vLLM logs to stdout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import io
import json
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENTRY = ["-m", "vllm.entrypoints.openai.api_server"]


class _NativeStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for the wheel's compiled extensions, and for nothing else."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in self.names:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(src: Path) -> dict[str, Any]:
    """Make ``import vllm`` the wheel's code on a (stub) CUDA platform; what was done."""
    sys.path.insert(0, str(src))
    natives = set((src / "native-modules.txt").read_text().split())
    sys.meta_path.insert(0, _NativeStubs(natives))
    import vllm
    import vllm.platforms
    from vllm.platforms import cuda

    if not str(Path(vllm.__file__)).startswith(str(src)):
        raise RuntimeError(f"vllm imported from {vllm.__file__}, not from {src}")
    vllm.platforms._current_platform = cuda.CudaPlatform()  # type: ignore[attr-defined]
    return {
        "vllm": vllm.__version__,
        "vllm_file": vllm.__file__,
        "platform": type(vllm.platforms._current_platform).__name__,  # type: ignore[attr-defined]
        "stubbed_native_modules": sorted(n for n in natives if n in sys.modules),
    }


def _option_name(token: str) -> str | None:
    if not token.startswith("--"):
        return None
    return token.split("=", 1)[0].split(".", 1)[0]


def check_argv(argv: Sequence[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import (
        make_arg_parser,
        validate_api_server_args,
        validate_parsed_serve_args,
    )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if list(argv[1:3]) != ENTRY:
        return {"ok": False, "error": f"not the api_server entry point: {argv[:3]}"}
    args = list(argv[3:])
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm-api-server"))
    known = set(parser._option_string_actions)
    unknown = [t for t in args if (n := _option_name(t)) is not None and n not in known]
    if unknown:
        return {"ok": False, "error": f"not the full name of any option: {unknown}"}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(args)
        validate_parsed_serve_args(ns)
        validate_api_server_args(ns)
        engine = AsyncEngineArgs.from_cli_args(ns)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if not ln.startswith((" ", "usage"))]
        return {"ok": False, "error": "\n".join(lines)[-2000:]}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    return {
        "ok": True,
        "values": {
            "model": engine.model,
            "tensor_parallel_size": engine.tensor_parallel_size,
            "gpu_memory_utilization": engine.gpu_memory_utilization,
            "max_model_len": engine.max_model_len,
            "enable_prefix_caching": engine.enable_prefix_caching,
            "structured_outputs_backend": engine.structured_outputs_config.backend,
            "enable_auto_tool_choice": ns.enable_auto_tool_choice,
            "tool_call_parser": ns.tool_call_parser,
            "enable_prompt_tokens_details": ns.enable_prompt_tokens_details,
            "disable_uvicorn_access_log": ns.disable_uvicorn_access_log,
            "enforce_eager": engine.enforce_eager,
            "reasoning_parser": engine.reasoning_parser or None,
            "default_chat_template_kwargs": getattr(ns, "default_chat_template_kwargs", None),
        },
    }


def unknown_keys(obj: Any, data: Any, where: str = "") -> list[str]:
    """Keys of `data` that `obj` (the model validated from it) has no field for, recursively."""
    found: list[str] = []
    if isinstance(data, dict):
        fields: set[str] | None = None
        if hasattr(type(obj), "model_fields"):
            fields = set()
            for name, info in type(obj).model_fields.items():
                fields |= {name, info.alias} - {None}  # type: ignore[arg-type]
        elif dataclasses.is_dataclass(obj):
            fields = {f.name for f in dataclasses.fields(obj)}
        if fields is None:
            return found
        for key, value in data.items():
            if key not in fields:
                found.append(f"{where}{key}")
            elif isinstance(value, dict | list):
                found += unknown_keys(getattr(obj, key, None), value, f"{where}{key}.")
    elif isinstance(data, list) and isinstance(obj, list) and len(obj) == len(data):
        for i, (o, d) in enumerate(zip(obj, data, strict=True)):
            found += unknown_keys(o, d, f"{where}{i}.")
    return found


def check_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    models: dict[str, Any] = {
        "/v1/chat/completions": ChatCompletionRequest,
        "/v1/completions": CompletionRequest,
    }
    if path not in models:
        return {"ok": False, "error": f"no request model for {path}"}
    try:
        req = models[path].model_validate(body)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    unknown = unknown_keys(req, body)
    if unknown:
        return {"ok": False, "error": f"fields {models[path].__name__} does not have: {unknown}"}
    try:
        params = req.to_sampling_params(int(body.get("max_tokens") or 16), {})
    except Exception as exc:
        return {"ok": False, "error": f"to_sampling_params: {type(exc).__name__}: {exc}"[:2000]}
    so = params.structured_outputs
    kinds = [] if so is None else [f.name for f in dataclasses.fields(so)
                                   if f.name in ("json", "regex", "choice", "grammar",
                                                 "json_object", "structural_tag")
                                   and getattr(so, f.name) is not None]  # fmt: skip
    return {"ok": True, "structured_outputs": kinds}


def main(argv: Sequence[str] | None = None) -> int:
    src, questions, answers = (Path(a) for a in (argv or sys.argv[1:]))
    q = json.loads(questions.read_text())
    out: dict[str, Any] = {"installed": install(src)}
    out["argvs"] = [check_argv(a) for a in q.get("argvs", [])]
    out["bodies"] = [check_body(b["path"], b["body"]) for b in q.get("bodies", [])]
    answers.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
