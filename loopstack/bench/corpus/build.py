"""Build the real-world tool-schema corpus used by the serving benchmarks.

Sources (all offline):

* **botocore service models** (the AWS SDK's own API descriptions, shipped in the
  ``botocore`` wheel): each selected operation's input shape becomes a tool whose
  ``parameters`` is a JSON Schema converted from the Smithy-style shape (rules below).
* **MCP reference servers from PyPI** (``mcp-server-time``, ``mcp-server-git``,
  ``mcp-server-fetch``): started over stdio and asked ``tools/list``; their
  ``inputSchema`` is used verbatim.  When they cannot be started (not installed),
  the MCP entries already present in the output file are kept as they are.

Shape conversion rules (botocore → JSON Schema):

* structure → ``object`` with ``properties``/``required`` (``additionalProperties`` left
  open, as the AWS APIs ignore nothing but do not forbid it either); past ``--max-depth``
  a nested structure becomes a bare ``{"type": "object"}``;
* list → ``array`` (``min``/``max`` → ``minItems``/``maxItems``);
* map → ``object`` with ``additionalProperties``;
* string → ``string`` with ``enum``, ``minLength``/``maxLength`` (a ``maxLength`` above
  ``MAX_STRING_LENGTH`` is dropped) and ``pattern`` only when short, ASCII and valid for
  Python's ``re`` (long Java-style patterns are dropped);
* integer/long → ``integer``, float/double → ``number``, with ``min``/``max`` →
  ``minimum``/``maximum``; boolean → ``boolean``; timestamp → ``string`` +
  ``format: date-time``; blob → ``string``; document → ``object``.
* operations whose input shape is recursive are skipped.

Prompts are **templated**: the operation's first documentation sentence turned into an
imperative, plus concrete values for up to three required scalar parameters and, when
present, one optional enum or bounded-number parameter.

Run: ``loopstack bench corpus build`` (see docs/bench-serving.md).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shlex
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from loopstack.bench.commandline import benchmark_app, run_command
from loopstack.bench.common import CORPUS_PATH
from loopstack.bench.corpus.text import (
    FEATURE_KEYS,
    first_sentence,
    imperative,
    make_prompt,
    schema_features,
    tool_name,
)

JSON = dict[str, Any]

DEFAULT_OUT = CORPUS_PATH
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_STRING_LENGTH = 1024
MAX_PATTERN_LENGTH = 48
MAX_PARAM_DESCRIPTION = 160
MAX_SCHEMA_CHARS = 5000

DEFAULT_MCP_SERVERS = {
    "mcp-server-time": "python3 -m mcp_server_time",
    "mcp-server-git": "python3 -m mcp_server_git",
    "mcp-server-fetch": "python3 -m mcp_server_fetch",
}


class Recursive(Exception):
    """The shape refers to itself: the operation is skipped."""


# ---------------------------------------------------------------------------
# botocore shapes -> JSON Schema


def _pattern_ok(pattern: str) -> bool:
    if len(pattern) > MAX_PATTERN_LENGTH or not pattern.isascii():
        return False
    if "\\p" in pattern or "\\P" in pattern or "(?" in pattern:
        return False
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


@dataclass
class ShapeConverter:
    shapes: dict[str, JSON]
    max_depth: int = 3

    def convert(self, shape_name: str, depth: int = 0, stack: tuple[str, ...] = ()) -> JSON:
        if shape_name in stack:
            raise Recursive(shape_name)
        shape = self.shapes[shape_name]
        kind = shape["type"]
        stack = (*stack, shape_name)
        out: JSON
        if kind == "structure":
            if shape.get("document"):
                return {"type": "object"}
            if depth >= self.max_depth:
                return {"type": "object"}
            props: JSON = {}
            for member, ref in shape.get("members", {}).items():
                sub = self.convert(ref["shape"], depth + 1, stack)
                doc = ref.get("documentation") or self.shapes[ref["shape"]].get("documentation")
                if doc:
                    text = first_sentence(doc, MAX_PARAM_DESCRIPTION)
                    if text:
                        sub = {"description": text, **sub}
                props[member] = sub
            out = {"type": "object", "properties": props}
            required = [r for r in shape.get("required", []) if r in props]
            if required:
                out["required"] = required
            return out
        if kind == "list":
            out = {"type": "array", "items": self.convert(shape["member"]["shape"], depth, stack)}
            if "min" in shape and int(shape["min"]) > 0:
                out["minItems"] = int(shape["min"])
            if "max" in shape:
                out["maxItems"] = int(shape["max"])
            return out
        if kind == "map":
            value = self.convert(shape["value"]["shape"], depth + 1, stack)
            return {"type": "object", "additionalProperties": value}
        if kind == "string":
            out = {"type": "string"}
            if "enum" in shape:
                out["enum"] = list(dict.fromkeys(shape["enum"]))
                return out
            if int(shape.get("min", 0)) > 0:
                out["minLength"] = int(shape["min"])
            if "max" in shape and int(shape["max"]) <= MAX_STRING_LENGTH:
                out["maxLength"] = int(shape["max"])
            pattern = shape.get("pattern")
            if isinstance(pattern, str) and _pattern_ok(pattern):
                out["pattern"] = pattern
            return out
        if kind in ("integer", "long", "float", "double"):
            out = {"type": "integer" if kind in ("integer", "long") else "number"}
            if "min" in shape:
                out["minimum"] = shape["min"]
            if "max" in shape:
                out["maximum"] = shape["max"]
            return out
        if kind == "boolean":
            return {"type": "boolean"}
        if kind == "timestamp":
            return {"type": "string", "format": "date-time"}
        if kind == "blob":
            return {"type": "string"}
        raise ValueError(f"unknown shape type {kind!r}")


# ---------------------------------------------------------------------------
# sources


@dataclass
class Candidate:
    source: str
    group: str  # service / server: distractor siblings come from the same group
    name: str
    description: str
    parameters: JSON
    action: str
    where: str
    provenance: JSON
    features: dict[str, Any] = field(default_factory=dict)


def botocore_data_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    try:
        import botocore  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return Path(botocore.__file__).parent / "data"
    except ImportError:
        pass
    out = subprocess.run(
        [
            "python3",
            "-c",
            "import botocore, os; print(os.path.join(os.path.dirname(botocore.__file__), 'data'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def botocore_version(data_dir: Path) -> str:
    init = data_dir.parent / "__init__.py"
    match = re.search(r"__version__ = '([^']+)'", init.read_text()) if init.exists() else None
    return match.group(1) if match else "unknown"


def _latest_model(service_dir: Path) -> Path | None:
    versions = sorted(p for p in service_dir.iterdir() if p.is_dir())
    for version in reversed(versions):
        for fname in ("service-2.json.gz", "service-2.json"):
            if (version / fname).exists():
                return version / fname
    return None


def botocore_candidates(data_dir: Path, max_depth: int = 3) -> Iterator[Candidate]:
    version = botocore_version(data_dir)
    for service_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        model_path = _latest_model(service_dir)
        if model_path is None:
            continue
        opener = gzip.open if model_path.suffix == ".gz" else open
        with opener(model_path, "rt", encoding="utf-8") as fh:
            model = json.load(fh)
        meta = model.get("metadata", {})
        conv = ShapeConverter(model.get("shapes", {}), max_depth=max_depth)
        full_name = meta.get("serviceFullName", service_dir.name)
        for op_name, op in sorted(model.get("operations", {}).items()):
            if op.get("deprecated") or "input" not in op:
                continue
            input_shape = model["shapes"][op["input"]["shape"]]
            members = input_shape.get("members", {})
            if not 1 <= len(members) <= 8 or not input_shape.get("required"):
                continue
            if any(model["shapes"][m["shape"]].get("streaming") for m in members.values()):
                continue
            if input_shape.get("union"):
                continue
            try:
                params = conv.convert(op["input"]["shape"])
            except (Recursive, KeyError, ValueError):
                continue
            desc = first_sentence(op.get("documentation", ""))
            if len(desc) < 10 or len(json.dumps(params)) > MAX_SCHEMA_CHARS:
                continue
            yield Candidate(
                source="botocore",
                group=service_dir.name,
                name=tool_name(service_dir.name, op_name),
                description=desc,
                parameters=params,
                action=imperative(desc),
                where=f" in {full_name}",
                provenance={
                    "package": f"botocore=={version}",
                    "file": f"botocore/data/{service_dir.name}/{model_path.parent.name}/"
                    f"{model_path.name}",
                    "service": service_dir.name,
                    "operation": op_name,
                    "input_shape": op["input"]["shape"],
                },
            )


def mcp_list_tools(command: list[str], env: dict[str, str], timeout: float = 60.0) -> JSON:
    """Start an MCP server over stdio and return its serverInfo and tools/list."""
    requests: list[JSON] = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "loopstack-bench", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
    ]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        answers: dict[int, JSON] = {}
        for req in requests:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
            if "id" not in req:
                continue
            while req["id"] not in answers:
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"MCP server exited: {command}")
                msg = json.loads(line)
                if "id" in msg:
                    answers[msg["id"]] = msg
        return {
            "serverInfo": answers[1]["result"].get("serverInfo", {}),
            "tools": answers[2]["result"]["tools"],
        }
    finally:
        proc.kill()
        proc.wait(timeout=timeout)


def mcp_candidates(servers: dict[str, str], pythonpath: str | None) -> list[Candidate]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    out: list[Candidate] = []
    for package, command in servers.items():
        listing = mcp_list_tools(shlex.split(command), env)
        info = listing["serverInfo"]
        for tool in listing["tools"]:
            desc = first_sentence(tool.get("description", ""))
            out.append(
                Candidate(
                    source="mcp",
                    group=package,
                    name=tool["name"],
                    description=desc,
                    parameters=tool["inputSchema"],
                    action=imperative(desc),
                    where="",
                    provenance={
                        "package": f"{package}=={info.get('version', '?')}",
                        "server": info.get("name"),
                        "method": "tools/list over stdio",
                    },
                )
            )
    return out


# ---------------------------------------------------------------------------
# selection and assembly


def validate_parameters(params: JSON) -> None:
    """Raise if ``params`` is not a valid object JSON Schema (Draft 2020-12)."""
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(params)
    if params.get("type") != "object":
        raise ValueError("parameters must be an object schema")


def select_botocore(cands: Iterable[Candidate], target: int, rng: random.Random) -> list[Candidate]:
    """Two operations from each of ``target // 2`` random services.

    Within a service one pick favours feature-rich schemas (most constraint kinds), the
    other is uniform, so the corpus keeps a natural share of plain schemas.
    """
    by_service: dict[str, list[Candidate]] = defaultdict(list)
    for cand in cands:
        by_service[cand.group].append(cand)
    services = sorted(s for s, c in by_service.items() if len(c) >= 2)
    rng.shuffle(services)
    picked: list[Candidate] = []
    for service in services:
        if len(picked) >= target:
            break
        pool = by_service[service]
        for c in pool:
            c.features = schema_features(c.parameters)
        rich = max(
            pool, key=lambda c: (sum(bool(c.features[k]) for k in FEATURE_KEYS), rng.random())
        )
        rest = [c for c in pool if c is not rich]
        picked.extend([rich, rng.choice(rest)][: target - len(picked)])
    return picked


def assemble(cands: list[Candidate], rng: random.Random) -> list[JSON]:
    names = Counter(c.name for c in cands)
    dupes = [n for n, k in names.items() if k > 1]
    if dupes:
        raise ValueError(f"duplicate tool names: {dupes[:5]}")
    by_group: dict[str, list[str]] = defaultdict(list)
    for c in cands:
        by_group[c.group].append(c.name)
    all_names = [c.name for c in cands]
    entries = []
    for i, c in enumerate(cands):
        if not NAME_RE.match(c.name):
            raise ValueError(f"bad tool name {c.name!r}")
        validate_parameters(c.parameters)
        siblings = [n for n in by_group[c.group] if n != c.name]
        distractors = [rng.choice(siblings)] if siblings else []
        while len(distractors) < 2:
            other = rng.choice(all_names)
            if other != c.name and other not in distractors:
                distractors.append(other)
        entries.append(
            {
                "id": f"{c.source}-{i:04d}-{c.name}",
                "source": c.source,
                "provenance": c.provenance,
                "features": c.features or schema_features(c.parameters),
                "tool": {
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "description": c.description,
                        "parameters": c.parameters,
                    },
                },
                "prompt": make_prompt(c.action, c.parameters, rng, where=c.where, service=c.group),
                "distractors": distractors,
            }
        )
    return entries


def _existing_mcp(path: Path) -> list[Candidate]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["source"] != "mcp":
            continue
        fn = e["tool"]["function"]
        out.append(
            Candidate(
                source="mcp",
                group=e["provenance"]["package"].split("==")[0],
                name=fn["name"],
                description=fn["description"],
                parameters=fn["parameters"],
                action=imperative(fn["description"]),
                where="",
                provenance=e["provenance"],
            )
        )
    return out


def summarize(entries: list[JSON]) -> JSON:
    feats: Counter[str] = Counter()
    for e in entries:
        for k in FEATURE_KEYS:
            feats[k] += bool(e["features"][k])
    return {
        "count": len(entries),
        "sources": dict(Counter(e["source"] for e in entries)),
        "groups": len(
            {e["provenance"]["package"] + e["provenance"].get("service", "") for e in entries}
        ),
        "features": {k: feats[k] for k in FEATURE_KEYS},
        "params_mean": round(sum(e["features"]["n_params"] for e in entries) / len(entries), 2),
    }


def corpus_line(entry: dict[str, Any]) -> str:
    """One entry as a line of the corpus file (without the newline)."""
    return json.dumps(entry, ensure_ascii=False)


app = benchmark_app(__doc__.split("\n\n")[0])


@app.command()
def build(
    out: Path = typer.Option(DEFAULT_OUT),
    botocore_target: int = typer.Option(400, help="botocore tools to keep"),
    botocore_data: str | None = typer.Option(
        None, help="botocore/data dir (default: find botocore)"
    ),
    max_depth: int = typer.Option(3, help="object nesting kept from shapes"),
    seed: int = typer.Option(7),
    mcp_pythonpath: str | None = typer.Option(
        None, help="PYTHONPATH holding mcp-server-time/-git/-fetch (pip install --target DIR ...)"
    ),
    mcp_server: list[str] = typer.Option(
        [],
        metavar="PKG=COMMAND",
        help="extra/override MCP server to list (stdio), e.g. mcp-server-time='python3 -m ...'",
    ),
    skip_mcp: bool = typer.Option(False, "--skip-mcp", help="keep MCP entries of --out as-is"),
) -> int:
    """Rebuild the corpus."""
    args = SimpleNamespace(**locals())
    rng = random.Random(args.seed)
    data_dir = botocore_data_dir(args.botocore_data)
    boto = select_botocore(botocore_candidates(data_dir, args.max_depth), args.botocore_target, rng)
    servers = dict(DEFAULT_MCP_SERVERS)
    for spec in args.mcp_server:
        pkg, _, cmd = spec.partition("=")
        servers[pkg] = cmd
    mcp: list[Candidate] = []
    if not args.skip_mcp:
        try:
            mcp = mcp_candidates(servers, args.mcp_pythonpath)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            print(f"MCP servers unavailable ({exc}); keeping MCP entries of {args.out}")
    if not mcp:
        mcp = _existing_mcp(args.out)
    entries = assemble(boto + mcp, rng)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for e in entries:
            fh.write(corpus_line(e) + "\n")
    stats = summarize(entries)
    print(json.dumps(stats, indent=2))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(app, argv)
