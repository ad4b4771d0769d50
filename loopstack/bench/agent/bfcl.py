"""Tool selection on a published set: BFCL's multiple-function and irrelevance requests.

    loopstack bench agent bfcl --base-url URL [--n 40] [--sets multiple,irrelevance]
        [--arms given,given+abstain,defaults] [--data DIR] [--out DIR]

Our selection bench (`loopstack.bench.agent.selection`) and the server's shipped selection defaults
were chosen on the same requests. This asks the same questions of requests none of them was tuned
on: the Berkeley Function Calling Leaderboard's (BFCL, Apache-2.0), as `bfcl-eval` publishes them on
PyPI. The wheel is fetched once with ``pip download --no-deps`` (the pinned version, its sha256
checked: nothing of it is installed), and only its data files are kept, under
``~/.cache/loopstack/bfcl/VERSION`` (``--data DIR``: a folder holding the wheel's ``bfcl_eval/data``
files, for a box without an index).

* ``multiple`` (200): a request and 2-4 functions, one of which fits. Right tool: the first
  call names it; right call: its arguments pass BFCL's own check (`args_ok`: each argument one
  of the possible answers, strings compared as BFCL standardizes them, an int where a float is
  asked accepted, an optional parameter may be left out, no parameter beyond the answer's).
* ``irrelevance`` (240): a request and one function that does not fit it: any call is false.
* ``live_multiple`` / ``live_irrelevance``: the user-contributed sets, the same way (only
  requests of one user message are asked).

A seeded sample of ``--n`` of each set. Functions are converted as BFCL converts them for
OpenAI-style APIs (a dot in a name becomes ``_``; ``dict`` -> object, ``float`` -> number,
``tuple`` -> array, ``any`` -> string; BFCL's non-schema ``optional`` key dropped). Arms are
`loopstack.bench.agent.selection`'s (``given``, ``ranked``, ``topK``, with ``+abstain``, ``+floor``,
``+decide``; ``defaults``: no ``loopstack`` field). Reported per set and arm, in that bench's
summary: right tool, right call (``args_accuracy``), calls kept, false calls.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import typer

from loopstack.bench.agent.selection import (
    API_KEY,
    BASE_URL,
    CONCURRENCY,
    MAX_TOKENS,
    MIN_SCORE,
    MODEL,
    OUT,
    RANK_ONLY,
    SEED,
    Item,
    arm_request,
    known_arm,
    make_ranker,
    quantiles,
    save,
    send_all,
    summarize,
)
from loopstack.bench.commandline import benchmark_app, parse_command

VERSION = "2026.3.23"
WHEEL = f"bfcl_eval-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
CACHE = Path.home() / ".cache" / "loopstack" / "bfcl" / VERSION
SETS = ("multiple", "irrelevance", "live_multiple", "live_irrelevance")
# BFCL's type names, as its OpenAI-style handlers map them (`GORILLA_TO_OPENAPI`)
OPENAPI_TYPE = {
    "integer": "integer", "number": "number", "float": "number", "string": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
    "dict": "object", "object": "object", "tuple": "array", "any": "string",
}  # fmt: skip
# ... and as its checker reads a Python answer (`PYTHON_TYPE_MAPPING`)
PYTHON_TYPE: dict[str, type] = {
    "string": str, "integer": int, "float": float, "boolean": bool,
    "array": list, "tuple": list, "dict": dict, "any": str,
}  # fmt: skip


# --- the data --------------------------------------------------------------------------------


def _files(name: str) -> list[str]:
    files = [f"BFCL_v4_{name}.json"]
    return files if "irrelevance" in name else [*files, f"possible_answer/BFCL_v4_{name}.json"]


def fetch(dest: Path = CACHE) -> Path:
    """The folder of BFCL's data files: `dest` when it holds them all, else the pinned wheel
    downloaded by pip into a temporary folder, its sha256 checked, the data files unpacked into
    `dest` (written beside, then renamed: a half-written folder is never read)."""
    wanted = [f for name in SETS for f in _files(name)]
    if all((dest / f).is_file() for f in wanted):
        return dest
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, f"bfcl-eval=={VERSION}"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheel = Path(tmp) / WHEEL
        if proc.returncode != 0 or not wheel.is_file():
            raise SystemExit(f"could not download bfcl-eval=={VERSION}: {proc.stderr[-400:]}")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise SystemExit(f"{WHEEL}: sha256 {digest}, expected {WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as z:
            for f in wanted:
                out = part / f
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(f"bfcl_eval/data/{f}"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    return dest


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def openai_name(name: str) -> str:
    return re.sub(r"\.", "_", name)


def _schema(node: dict[str, Any]) -> dict[str, Any]:
    """One BFCL parameter schema as JSON Schema (BFCL's `_cast_to_openai_type`, recursive)."""
    out = {k: v for k, v in node.items() if k not in ("optional", "properties", "items")}
    out["type"] = OPENAPI_TYPE.get(str(node.get("type", "string")), "string")
    if isinstance(node.get("properties"), dict):
        out["properties"] = {k: _schema(v) for k, v in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        out["items"] = _schema(node["items"])
    return out


def to_tool(fn: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function as an OpenAI tool object."""
    params = _schema(fn.get("parameters") or {"type": "dict", "properties": {}})
    params["type"] = "object"
    params.setdefault("properties", {})
    return {
        "type": "function",
        "function": {
            "name": openai_name(fn["name"]),
            "description": fn.get("description", ""),
            "parameters": params,
        },
    }


def items(data: Path, name: str, n: int, seed: int) -> list[Item]:
    """A seeded sample of `n` requests of set `name` (those of one user message)."""
    rows = _lines(data / f"BFCL_v4_{name}.json")
    answers = {}
    if "irrelevance" not in name:
        answers = {a["id"]: a["ground_truth"] for a in _lines(data / _files(name)[1])}
    usable = []
    for r in rows:
        turn = r["question"][0] if r["question"] else []
        if len(r["question"]) != 1 or len(turn) != 1 or turn[0].get("role") != "user":
            continue
        if answers and len(answers.get(r["id"], [])) != 1:  # one call expected
            continue
        usable.append(r)
    random.Random(f"{seed}:{name}").shuffle(usable)
    out = []
    for r in usable[:n]:
        tools = tuple(to_tool(f) for f in r["function"])
        right: str | None = None
        check: Callable[[dict[str, Any]], bool] | None = None
        if answers:
            [(fname, accept)] = answers[r["id"]][0].items()
            fn = next(f for f in r["function"] if f["name"] == fname)
            right = openai_name(fname)
            check = functools.partial(args_ok, fn, accept)
        prompt = r["question"][0][0]["content"]
        out.append(Item(r["id"], prompt, right, {}, tools, check, group=name))
    return out


# --- BFCL's argument check (its ast_checker, for a Python answer) ----------------------------


def standardize(text: str) -> str:
    """BFCL's `standardize_string`: no spaces or ``,./-_*^``, lower case, ' as "."""
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def _one_of(value: Any, answers: list[Any]) -> bool:
    """`value` among `answers`, strings compared standardized (BFCL's string check)."""
    return _std(value) in [_std(a) for a in answers]


def _dict_ok(value: dict[str, Any], possible: list[Any]) -> bool:
    for answer in possible:
        if answer == "" or not isinstance(answer, dict):
            continue
        given = all(k in answer and _one_of(v, answer[k]) for k, v in value.items())
        if given and all(k in value or "" in vals for k, vals in answer.items()):
            return True
    return False


def _value_ok(value: Any, schema: dict[str, Any], possible: list[Any]) -> bool:
    kind = str(schema.get("type", "string"))
    expected = PYTHON_TYPE.get(kind, str)
    if kind == "float" and type(value) is int:
        value = float(value)
    typed = [a for a in possible if a != ""]
    if type(value) is not expected:
        # BFCL's "variable" case: the answers are of another type (a name given as a string)
        if not typed or type(value) is not type(typed[0]):
            return False
        return _one_of(value, typed)
    if isinstance(value, dict):  # the type the schema asks (checked above)
        return _dict_ok(value, possible)
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict) and str(items.get("type")) == "dict":
            return any(
                isinstance(a, list)
                and len(a) == len(value)
                and all(
                    isinstance(v, dict) and _dict_ok(v, [d]) for v, d in zip(value, a, strict=True)
                )
                for a in typed
            )
        return [_std(v) for v in value] in [
            [_std(x) for x in a] for a in typed if isinstance(a, list)
        ]
    if isinstance(value, str):  # "" stands for "left out", and BFCL accepts it written too
        return _one_of(value, possible)
    return value in typed


def args_ok(fn: dict[str, Any], accept: dict[str, list[Any]], args: dict[str, Any]) -> bool:
    """Whether a call's `args` to BFCL function `fn` pass its possible answers `accept`."""
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    if any(p not in args for p in params.get("required") or []):
        return False
    for p, v in args.items():
        if p not in props or p not in accept or not _value_ok(v, props[p], accept[p]):
            return False
    return all(p in args or "" in vals for p, vals in accept.items())


# --- running ---------------------------------------------------------------------------------


async def run(args: SimpleNamespace) -> dict[str, Any]:
    data = args.data or await asyncio.to_thread(fetch)
    jobs: list[tuple[Item, str, list, dict]] = []
    for name in args.sets:
        for item in items(data, name, args.n, args.seed):
            for arm in args.arms:
                jobs.append((item, arm, *arm_request(item, arm, args.seed, args.min_score)))
    rows = await send_all(args, jobs)
    summary = summarize(rows)
    summary["source"] = {"bfcl_eval": VERSION, "sets": args.sets, "n": args.n, "seed": args.seed}
    save(args.out, rows, summary)
    return summary


async def rank_only(args: SimpleNamespace) -> dict[str, Any]:
    """No model: the server's ranking on the sample (as `loopstack.bench.agent.selection`'s
    ``--rank-only``): the right tool's place and score, and what a floor keeps and leaves."""
    from loopstack.serving.selection.rank import floor_applies

    data = args.data or await asyncio.to_thread(fetch)
    ranker = make_ranker()
    out: dict[str, Any] = {}
    for name in args.sets:
        sample = items(data, name, args.n, args.seed)
        best, right, first = [], [], 0
        for item in sample:
            ranking = await ranker.rank(item.prompt, list(item.tools))
            if item.right is None:
                best.append(ranking[0].score)
                continue
            first += ranking[0].name == item.right
            right.append(next(r.score for r in ranking if r.name == item.right))
        scores = right or best
        out[name] = {
            "n": len(sample),
            "floor_applies_to": sum(floor_applies(i.prompt) for i in sample),
            **({"right_tool_first": f"{first}/{len(right)}"} if right else {}),
            "score_quantiles": quantiles(scores, (0.05, 0.25, 0.5)) if scores else {},
            ("right_kept" if right else "left_without_tools"): {
                str(f): f"{sum((x >= f) if right else (x < f) for x in scores)}/{len(scores)}"
                for f in (0.2, 0.25, 0.3, 0.35, 0.4)
            },
        }  # fmt: skip
    return out


app = benchmark_app(__doc__)


@app.command()
def options(
    base_url: str = BASE_URL,
    api_key: str = API_KEY,
    model: str | None = MODEL,
    min_score: float = MIN_SCORE,
    concurrency: int = CONCURRENCY,
    max_tokens: int = MAX_TOKENS,
    seed: int = SEED,
    out: Path | None = OUT,
    rank_only: bool = RANK_ONLY,
    sets: str = typer.Option("multiple,irrelevance", help="comma-separated"),
    n: int = typer.Option(40, help="requests drawn from each set"),
    arms: str = typer.Option("given,given+abstain,defaults", help="comma-separated"),
    data: Path | None = typer.Option(None, help="BFCL's data folder (no download)"),
) -> SimpleNamespace:
    args = SimpleNamespace(**locals())
    args.sets, args.arms = sets.split(","), arms.split(",")
    for name in args.sets:
        if name not in SETS:
            raise typer.BadParameter(f"unknown set {name!r}: {', '.join(SETS)}")
    for arm in args.arms:
        if not known_arm(arm):
            raise typer.BadParameter(
                f"unknown arm {arm!r}: given, ranked, topK, defaults, or composed with +"
            )
    return args


def parse_args(argv: list[str] | None = None) -> SimpleNamespace:
    return cast(SimpleNamespace, parse_command(app, argv))


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.rank_only:
        print("RESULT " + json.dumps(asyncio.run(rank_only(args))))
        return 0
    summary = asyncio.run(run(args))
    print("RESULT " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
