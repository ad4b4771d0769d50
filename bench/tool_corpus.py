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

Run: ``python -m bench.tool_corpus`` (see docs/bench-serving.md).
"""

from __future__ import annotations

import argparse
import gzip
import html
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
from typing import Any

JSON = dict[str, Any]

DEFAULT_OUT = Path(__file__).parent / "data" / "tool_schemas.jsonl"
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_STRING_LENGTH = 1024
MAX_PATTERN_LENGTH = 48
MAX_DESCRIPTION = 300
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
# text helpers


_TAG_RE = re.compile(r"<[^>]+>")
_WS_RE = re.compile(r"\s+")


_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "approx", "Inc", "Ltd", "No")


def strip_html(text: str) -> str:
    plain = _WS_RE.sub(" ", html.unescape(_TAG_RE.sub(" ", text))).strip()
    return re.sub(r"\s+([.,;:!?)])", r"\1", plain)


def first_sentence(text: str, cap: int = MAX_DESCRIPTION) -> str:
    """First sentence of (HTML) documentation, capped at ``cap`` characters."""
    plain = strip_html(text)
    sentence = plain
    for match in re.finditer(r"(?<=[a-z0-9)\]\"'`])\.(\s|$)", plain):
        if not plain[: match.start()].endswith(_ABBREVIATIONS):
            sentence = plain[: match.start() + 1]
            break
    sentence = sentence.strip()
    if len(sentence) > cap:
        sentence = sentence[: cap - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    return sentence


def snake_case(name: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    s = re.sub(r"[^a-zA-Z0-9]+", "_", s)
    return s.strip("_").lower()


def tool_name(service: str, operation: str) -> str:
    name = f"{snake_case(service)}_{snake_case(operation)}"
    return name[:64].rstrip("_")


def humanize(param: str) -> str:
    return snake_case(param).replace("_", " ")


def imperative(sentence: str) -> str:
    """'Creates a new bucket.' -> 'create a new bucket'."""
    s = sentence.rstrip(".… ").strip()
    if not s:
        return s
    words = s.split(" ", 1)
    verb = words[0]
    rest = words[1] if len(words) > 1 else ""
    low = verb.lower()
    if low.endswith("ies") and len(low) > 4:
        low = low[:-3] + "y"
    elif re.search(r"(ss|sh|ch|x|z)es$", low):
        low = low[:-2]
    elif low.endswith("s") and not low.endswith("ss") and len(low) > 3:
        low = low[:-1]
    if verb[:1].isupper() and verb[1:2].isupper():  # acronym such as "AWS"
        low = verb
    return f"{low} {rest}".strip()


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
# schema features


def iter_subschemas(schema: Any, depth: int = 0) -> Iterator[tuple[JSON, int]]:
    """Yield (subschema, object-depth) for every dict subschema."""
    if not isinstance(schema, dict):
        return
    yield schema, depth
    for key in ("properties", "$defs", "definitions"):
        for sub in (schema.get(key) or {}).values():
            yield from iter_subschemas(sub, depth + (1 if key == "properties" else 0))
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, dict):
            yield from iter_subschemas(sub, depth + (1 if key == "additionalProperties" else 0))
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            yield from iter_subschemas(sub, depth)


def schema_features(params: JSON) -> dict[str, Any]:
    """Which constraint kinds a tool's parameters schema exercises."""
    top_props = params.get("properties") or {}
    required = set(params.get("required") or [])
    feats = {
        "n_params": len(top_props),
        "n_required": len(required),
        "enum": False,
        "numeric_bounds": False,
        "string_length": False,
        "pattern": False,
        "format": False,
        "nested_object": False,
        "array": False,
        "array_of_objects": False,
        "map": False,
        "optional": len(top_props) > len(required),
        "max_depth": 0,
    }
    for sub, depth in iter_subschemas(params):
        feats["max_depth"] = max(feats["max_depth"], depth)
        if "enum" in sub or "const" in sub:
            feats["enum"] = True
        if any(k in sub for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            feats["numeric_bounds"] = True
        if "minLength" in sub or "maxLength" in sub:
            feats["string_length"] = True
        if "pattern" in sub:
            feats["pattern"] = True
        if "format" in sub:
            feats["format"] = True
        if sub.get("type") == "array":
            feats["array"] = True
            items = sub.get("items")
            if isinstance(items, dict) and items.get("type") == "object":
                feats["array_of_objects"] = True
        if sub.get("type") == "object" and depth >= 1 and sub.get("properties"):
            feats["nested_object"] = True
        if isinstance(sub.get("additionalProperties"), dict):
            feats["map"] = True
    return feats


FEATURE_KEYS = (
    "enum",
    "numeric_bounds",
    "string_length",
    "pattern",
    "format",
    "nested_object",
    "array",
    "array_of_objects",
    "map",
    "optional",
)


# ---------------------------------------------------------------------------
# concrete values for prompts

_WORDS = [
    "orders",
    "billing",
    "analytics",
    "checkout",
    "inventory",
    "payments",
    "search",
    "reports",
    "webapp",
    "ingest",
    "metrics",
    "archive",
]
_ENVS = ["prod", "staging", "dev", "eu", "blue", "2024"]


def _slug(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}-{rng.choice(_ENVS)}"


def example_value(name: str, schema: JSON, rng: random.Random, service: str = "svc") -> Any:
    """A plausible concrete value for a parameter (for prompt text)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind is None and "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return example_value(name, options[0] if options else {}, rng, service)
    if kind in ("integer", "number"):
        lo = schema.get("minimum", 1)
        hi = schema.get("maximum", max(lo, 100))
        nice = [v for v in (5, 10, 20, 25, 30, 50, 60, 100, 300, 3600) if lo <= v <= hi]
        return rng.choice(nice) if nice else int(lo)
    if kind == "boolean":
        return rng.choice([True, False])
    if kind == "array":
        item = schema.get("items") or {"type": "string"}
        n = max(int(schema.get("minItems", 1)), 1)
        n = max(min(n + rng.randint(0, 1), int(schema.get("maxItems", 2)), 3), 1)
        if "enum" in item:
            return rng.sample(item["enum"], min(n, len(item["enum"])))
        return [example_value(name.rstrip("s"), item, rng, service) for _ in range(n)]
    if kind == "object":
        return None
    low = name.lower()
    fmt = schema.get("format")
    if fmt == "date-time" or ("time" in low and ("start" in low or "end" in low or "date" in low)):
        return rng.choice(["2024-05-01T09:00:00Z", "2024-06-15T18:30:00Z"])
    if fmt == "uri" or low.endswith(("url", "uri")):
        return rng.choice(["https://example.com/docs/intro", "https://news.example.org/feed"])
    if "timezone" in low:
        return rng.choice(["Europe/Berlin", "Asia/Tokyo", "America/Chicago"])
    if low == "time":
        return rng.choice(["14:30", "09:15"])
    if "repo" in low and "path" in low:
        return "/home/dev/projects/webapp"
    value: str
    if "arn" in low:
        value = f"arn:aws:{service}:us-east-1:123456789012:{snake_case(name)[:12]}/{_slug(rng)}"
    elif "email" in low:
        value = "ops@example.com"
    elif "region" in low:
        value = rng.choice(["us-west-2", "eu-central-1"])
    elif "account" in low:
        value = "123456789012"
    elif "bucket" in low:
        value = f"acme-{_slug(rng)}"
    elif low in ("key", "objectkey") or low.endswith("path") or low.endswith("file"):
        value = rng.choice(["reports/2024/q1.csv", "src/app/main.py"])
    elif "message" in low or "description" in low or "comment" in low:
        value = rng.choice(["Nightly batch job", "Fix login redirect"])
    elif "branch" in low:
        value = rng.choice(["feature/search", "release-2.1"])
    elif "version" in low:
        value = rng.choice(["2", "1.4.0"])
    elif low.endswith("id") or low.endswith("ids") or "identifier" in low:
        value = f"{rng.choice(_WORDS)[:3]}-{rng.randrange(16**8):08x}"
    else:
        value = _slug(rng)
    lo, hi = int(schema.get("minLength", 0)), int(schema.get("maxLength", 10**6))
    if len(value) > hi:
        value = value[:hi]
    if len(value) < lo:
        value = value + "x" * (lo - len(value))
    return value


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return ", ".join(_render(v) for v in value)
    return str(value)


_TEMPLATES = [
    "Please {action}{where}. Use {args}.",
    "Can you {action}{where}? {Args}.",
    "I need you to {action}{where} with {args}.",
    "{Action}{where} — {args}.",
]


def make_prompt(
    action: str,
    params: JSON,
    rng: random.Random,
    where: str = "",
    service: str = "svc",
    max_required: int = 3,
) -> str:
    """Templated user request naming concrete values for some parameters."""
    props: JSON = params.get("properties") or {}
    required = [r for r in params.get("required") or [] if r in props]
    chosen: list[str] = []
    for name in required:
        if props[name].get("type") != "object" and len(chosen) < max_required:
            chosen.append(name)
    extras = [
        n
        for n, s in props.items()
        if n not in required and ("enum" in s or "minimum" in s or "maximum" in s)
    ]
    if extras:
        chosen.append(rng.choice(extras))
    parts = []
    for name in chosen:
        value = example_value(name, props[name], rng, service)
        if value is None:
            continue
        parts.append(f"{humanize(name)} {_render(value)}")
    if not parts:
        args = "whatever defaults make sense"
    elif len(parts) == 1:
        args = parts[0]
    else:
        args = ", ".join(parts[:-1]) + " and " + parts[-1]
    template = rng.choice(_TEMPLATES)
    action = action or "run this operation"
    return template.format(
        action=action,
        Action=action[:1].upper() + action[1:],
        where=where,
        args=args,
        Args=args[:1].upper() + args[1:],
    )


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--botocore-target", type=int, default=400, help="botocore tools to keep")
    ap.add_argument("--botocore-data", help="botocore/data dir (default: find botocore)")
    ap.add_argument("--max-depth", type=int, default=3, help="object nesting kept from shapes")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--mcp-pythonpath",
        help="PYTHONPATH holding mcp-server-time/-git/-fetch (pip install --target DIR ...)",
    )
    ap.add_argument(
        "--mcp-server",
        action="append",
        default=[],
        metavar="PKG=COMMAND",
        help="extra/override MCP server to list (stdio), e.g. mcp-server-time='python3 -m ...'",
    )
    ap.add_argument("--skip-mcp", action="store_true", help="keep MCP entries of --out as-is")
    args = ap.parse_args(argv)

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
            fh.write(json.dumps(e, ensure_ascii=False, sort_keys=False) + "\n")
    stats = summarize(entries)
    print(json.dumps(stats, indent=2))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
