"""Text side of the tool corpus: descriptions and names from AWS docs, schema features, and the
templated user prompts (with plausible argument values) for each tool."""

from __future__ import annotations

import html
import random
import re
from collections.abc import Iterator
from typing import Any

JSON = dict[str, Any]
MAX_DESCRIPTION = 300

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
