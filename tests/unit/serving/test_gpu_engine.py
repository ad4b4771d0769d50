"""The GPU engine's own code judges what we send it: its argument parser our command lines,
its request models our request bodies, its dependency pins our grammar libraries.

The GPU `vllm` wheel of the version requirements/engine-gpu.txt pins is fetched once (by
version, from the registry: `tests.gpu_engine.wheel`, cached under ~/.cache/loopstack) and
asked by `tests.gpu_engine.probe` in a subprocess (its compiled CUDA extensions stubbed, its
CUDA platform installed: no GPU is needed to parse or validate). Every command line is the one
`loopstack.serving.engine.hardware.vllm_launch` builds for a GPU box; every body is one the real
ChatService sent a fake engine. A flag or field the GPU version does not know fails here, as the
deliberately misspelt ones show.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from loopstack.serving.config import GPU_DEFAULT, GPU_DEFAULT_ARCHITECTURE, ServerSettings
from loopstack.serving.constraint.factory import make_backend
from loopstack.serving.engine.hardware import Hardware, vllm_launch
from loopstack.serving.engine.model_files import facts_from_config
from tests.gpu_engine import wheel
from tests.gpu_engine.lock import CONSTRAINTS, ROOT, canonical, parse_pins
from tests.unit.serving.serving_fakes import Harness
from tests.unit.serving.serving_helpers import ADD, USER, WEATHER, call
from tests.unit.serving.test_gpu_launch import QWEN_7B

pytestmark = pytest.mark.timeout(900)  # a cold cache fetches the wheel (~340 MB) first

BACKENDS = ("guidance", "xgrammar", "outlines")
# What a GPU user plausibly adds through LOOPSTACK_ENGINE_ARGS
ENGINE_ARGS = "--max-num-seqs 256 --kv-cache-dtype fp8 --max-num-batched-tokens 8192"
GRAMMAR_LIBRARIES = ("llguidance", "xgrammar")


def launches(model_dir: Path) -> dict[str, list[str]]:
    """Every engine command line of a GPU box: each backend, 1 and 4 GPUs, with and without
    LOOPSTACK_ENGINE_ARGS; the default model (hub id) and a local folder."""
    out = {}
    for backend in BACKENDS:
        for gpus in (1, 4):
            for extra in ("", ENGINE_ARGS):
                settings = ServerSettings(constraint_backend=backend, engine_args=extra)  # type: ignore[arg-type]
                hw = Hardware("cuda", gpus, 32, 256.0)
                for model in (GPU_DEFAULT, str(model_dir)):
                    launch = vllm_launch(settings, hw, model, "served",
                                         facts_from_config(QWEN_7B))  # fmt: skip
                    kind = "default" if model == GPU_DEFAULT else "folder"
                    name = f"{backend}-{gpus}gpu{'-args' if extra else ''}-{kind}"
                    out[name] = launch.argv
    return out


async def _record() -> list[tuple[str, str, dict[str, Any]]]:
    """What the server sends the engine, one sample of each kind, from the real ChatService."""
    sent: list[tuple[str, str, dict[str, Any]]] = []
    tools = [WEATHER, ADD]
    named = {"type": "function", "function": {"name": "get_weather"}}
    turn = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for backend in BACKENDS:
        h = Harness(backend=make_backend(backend, None, mode="thread"))  # type: ignore[arg-type]
        h.engine.constrained = [
            turn if backend != "outlines" else call("get_weather", {"city": "Paris"})
        ]
        for choice in ("auto", "required", named):
            for stream in (False, True):
                label = choice if isinstance(choice, str) else "named"
                before = len(h.engine.requests)
                await h.client.post("/v1/chat/completions", json={
                    "model": "test-model", "messages": USER, "tools": tools,
                    "tool_choice": choice, "stream": stream, "max_tokens": 64,
                    "temperature": 0.2, "seed": 7, "parallel_tool_calls": True,
                })  # fmt: skip
                for path, body in h.engine.requests[before:]:
                    sent.append((f"{backend} tools {label} stream={stream}", path, body))
        await h.client.aclose()
    h = Harness()
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("chat plain", "/v1/chat/completions", {"messages": USER, "max_tokens": 16}),
        ("chat plain stream", "/v1/chat/completions",
         {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}),
        ("response_format json_schema", "/v1/chat/completions",
         {"messages": USER, "response_format": rf}),
        ("response_format json_object", "/v1/chat/completions",
         {"messages": USER, "response_format": {"type": "json_object"}}),
        ("completions plain", "/v1/completions", {"prompt": "Hi", "max_tokens": 8}),
        ("completions stream", "/v1/completions", {"prompt": "Hi", "stream": True,
                                                   "stream_options": {"include_usage": True}}),
        ("completions regex", "/v1/completions",
         {"prompt": "Hi", "structured_outputs": {"regex": "[a-z]{1,8}"}}),
        ("completions json", "/v1/completions",
         {"prompt": "Hi", "structured_outputs": {"json": schema}}),
        ("completions choice", "/v1/completions",
         {"prompt": "Hi", "structured_outputs": {"choice": ["yes", "no"]}}),
        ("completions json_object", "/v1/completions",
         {"prompt": "Hi", "structured_outputs": {"json_object": True}}),
        ("completions response_format", "/v1/completions",
         {"prompt": "Hi", "response_format": rf}),
    ]  # fmt: skip
    h.engine.free = ['{"answer": 42}']
    h.engine.constrained = ['{"answer": 42}']
    for label, path, body in requests:
        before = len(h.engine.requests)
        await h.client.post(path, json={"model": "test-model", **body})
        for sent_path, sent_body in h.engine.requests[before:]:
            sent.append((label, sent_path, sent_body))
    await h.client.aclose()
    return sent


@pytest.fixture(scope="module")
def gpu_vllm() -> Path:
    return wheel.ensure()


@pytest.fixture(scope="module")
def recorded() -> list[tuple[str, str, dict[str, Any]]]:
    return asyncio.run(_record())


def misspelt(argv: list[str]) -> list[str]:
    return [("--enable-prefix-cacheing" if a == "--enable-prefix-caching" else a) for a in argv]


@pytest.fixture(scope="module")
def answers(
    gpu_vllm: Path,
    recorded: list[tuple[str, str, dict[str, Any]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """One probe run answers every question (importing vLLM takes ~15 s)."""
    tmp = tmp_path_factory.mktemp("gpu-engine")
    model_dir = tmp / "Qwen2.5-7B-Instruct"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN_7B))
    argvs = launches(model_dir)
    good = argvs["guidance-4gpu-folder"]
    argvs["MISSPELT flag"] = misspelt(good)
    argvs["ABBREVIATED flag"] = [a.replace("--enable-prompt-tokens-details",
                                           "--enable-prompt-tokens") for a in good]  # fmt: skip
    bodies = [{"path": p, "body": b} for _, p, b in recorded]
    bad = next(b for label, _, b in recorded if label == "completions regex")
    bodies.append({"path": "/v1/completions", "body": {**bad, "cache_salts": "x"}})
    so = {"regx": bad["structured_outputs"]["regex"]}
    bodies.append({"path": "/v1/completions", "body": {**bad, "structured_outputs": so}})
    questions, out = tmp / "questions.json", tmp / "answers.json"
    questions.write_text(json.dumps({"argvs": list(argvs.values()), "bodies": bodies}))
    # HF_HUB_OFFLINE (make test sets it) makes vLLM swap a hub id for its cached snapshot at
    # argument time (not found here: no model is on disk); a GPU box is online, and parsing
    # needs nothing from the hub
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    run = subprocess.run(
        [sys.executable, "-m", "tests.gpu_engine.probe", str(gpu_vllm), str(questions), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    data["argv_names"] = list(argvs)
    data["argv_list"] = list(argvs.values())
    data["body_labels"] = [label for label, _, _ in recorded] + ["MISSPELT field", "MISSPELT key"]
    return data


def test_the_probe_ran_the_pinned_gpu_vllm(answers: dict[str, Any], gpu_vllm: Path) -> None:
    installed = answers["installed"]
    assert installed["vllm"] == wheel.pinned_version()
    assert installed["vllm_file"].startswith(str(gpu_vllm))
    assert installed["platform"].endswith("CudaPlatform")


def test_every_gpu_command_line_parses_with_the_gpu_vllms_own_parser(
    answers: dict[str, Any],
) -> None:
    results = dict(zip(answers["argv_names"], answers["argvs"], strict=True))
    argvs = dict(zip(answers["argv_names"], answers["argv_list"], strict=True))
    failed = {n: r["error"] for n, r in results.items() if not r["ok"] and "MIS" not in n
              and "ABBREV" not in n}  # fmt: skip
    assert not failed, json.dumps(failed, indent=1)
    assert len(results) == 2 + 3 * 2 * 2 * 2
    for name, r in results.items():
        if "MIS" in name or "ABBREV" in name:
            continue
        v, argv = r["values"], argvs[name]
        assert v["structured_outputs_backend"] == name.split("-")[0]
        assert v["tool_call_parser"] == "hermes" and v["enable_auto_tool_choice"]
        assert v["enable_prefix_caching"] is True and v["enable_prompt_tokens_details"] is True
        assert v["gpu_memory_utilization"] == 0.9 and v["max_model_len"] == 32768
        # the default model: one GPU; the 7B from a folder: 4 GPUs divide its 28 heads
        want_tp = 4 if "4gpu" in name and GPU_DEFAULT not in argv else 1
        assert v["tensor_parallel_size"] == want_tp, name
        if GPU_DEFAULT in argv:  # a thinking model: thinking off, its thinking parsed out
            assert v["reasoning_parser"] == "qwen3", name
            assert v["default_chat_template_kwargs"] == {"enable_thinking": False}, name
        else:
            assert v["reasoning_parser"] is None and not v["default_chat_template_kwargs"]


def test_the_gpu_default_is_an_architecture_the_pinned_vllm_serves(gpu_vllm: Path) -> None:
    """The GPU default's architecture is in the pinned GPU vLLM's model registry, and the
    parsers its command line names are registered there."""
    root = gpu_vllm / "vllm"
    registry = (root / "model_executor" / "models" / "registry.py").read_text()
    assert f'"{GPU_DEFAULT_ARCHITECTURE}":' in registry
    assert '"qwen3":' in (root / "reasoning" / "__init__.py").read_text()
    assert '"hermes":' in (root / "tool_parsers" / "__init__.py").read_text()


def test_a_misspelt_or_abbreviated_flag_fails_the_parser(answers: dict[str, Any]) -> None:
    results = dict(zip(answers["argv_names"], answers["argvs"], strict=True))
    assert results["MISSPELT flag"] == {
        "ok": False,
        "error": "not the full name of any option: ['--enable-prefix-cacheing']",
    }
    # argparse would take the prefix of a longer option: our check does not
    assert not results["ABBREVIATED flag"]["ok"]
    assert "--enable-prompt-tokens'" in results["ABBREVIATED flag"]["error"]


def test_every_request_body_validates_against_the_gpu_vllms_request_models(
    answers: dict[str, Any], recorded: list[tuple[str, str, dict[str, Any]]]
) -> None:
    labels = answers["body_labels"]
    results = dict(zip(labels, answers["bodies"], strict=True))
    failed = {label: r["error"] for label, r in zip(labels, answers["bodies"], strict=True)
              if not r["ok"] and "MISSPELT" not in label}  # fmt: skip
    assert not failed, json.dumps(failed, indent=1)
    kinds = {label.split(" stream=")[0] for label, _, _ in recorded}
    for backend in BACKENDS:  # every tool mode of every backend reached the engine
        assert {f"{backend} tools {m}" for m in ("auto", "required", "named")} <= kinds
    constraints = set()
    for label, r in results.items():
        constraints |= {f"{label.split(' ')[0]}:{k}" for k in r.get("structured_outputs", [])}
    # what each backend's turn is in the engine's terms
    assert {"guidance:grammar", "xgrammar:structural_tag", "outlines:regex"} <= constraints, (
        constraints
    )
    assert results["MISSPELT field"]["ok"] is False
    assert "does not have: ['cache_salts']" in results["MISSPELT field"]["error"]
    assert results["MISSPELT key"]["ok"] is False


def test_one_grammar_library_the_gpu_pins_are_the_gpu_vllms_and_the_cpu_tests(
    gpu_vllm: Path,
) -> None:
    """The compile worker imports llguidance / xgrammar from the venv make install makes:
    on GPU that is constraints-gpu.txt's pins, which must be what the GPU vLLM requires (so
    our check and the engine's compile are the same library) and what the CPU tests run."""
    requires = {}
    env = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux",
           "python_version": "3.11", "extra": ""}  # fmt: skip
    for line in wheel.metadata(gpu_vllm).splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                requires[canonical(req.name)] = req
    gpu = parse_pins(CONSTRAINTS.read_text())
    cpu = parse_pins((ROOT / "requirements" / "constraints-cpu.txt").read_text())
    for lib in (*GRAMMAR_LIBRARIES, "outlines-core", "transformers", "torch", "tokenizers"):
        assert lib in gpu, f"constraints-gpu.txt does not pin {lib}"
        assert requires[lib].specifier.contains(gpu[lib], prereleases=True), (
            f"{lib}=={gpu[lib]} is not what vllm {wheel.pinned_version()} requires "
            f"({requires[lib]})"
        )
    for lib in GRAMMAR_LIBRARIES:
        assert gpu[lib] == cpu[lib], f"{lib}: GPU {gpu[lib]}, CPU tests {cpu[lib]}"
