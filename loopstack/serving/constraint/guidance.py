"""The ``guidance`` constraint backend: a turn as one llguidance Lark grammar.

vLLM's guidance backend takes a Lark grammar (``structured_outputs.grammar``) with embedded
JSON schemas (``%json``). llguidance builds token masks lazily (no ahead-of-time compile) and
enforces JSON Schema broadly (numeric bounds, lengths, enums, patterns without lookaround).

* ``auto`` - free text (``TEXT``) until a *lazy* lexeme ends with a trigger naming an offered
  tool (`envelope.triggers`); then ``, "arguments": `` and the tool's schema; then free text.
  Qwen's ``<tool_call>``/``</tool_call>`` are special tokens that no text lexeme matches, so
  the free text allows them by id.
* ``required`` / named - ``{"name": "<tool>", "arguments": <schema>}`` calls joined by the
  separator, nothing else.
* a tool whose one string carries a client's Lark grammar (a Responses ``custom`` tool):
  ``{"input": "<text>"}``, the text held to that grammar as a JSON string's body
  (`loopstack.serving.constraint.lark_string`);
* ``auto`` with a client's ``response_format`` beside the tools (the Agents SDK's
  ``output_type``): the answer as one JSON value under that schema, or calls in the Hermes
  tags (`_answer_grammar`);
* a client's JSON schema (``response_format``, ``structured_outputs.json``) - the same
  ``%json`` lexeme alone (`json_grammar`), tightened the same way; a client's regex goes to
  the engine as it is. Neither makes a regex of ours.

Every payload is compiled first in the sandbox (`make_checker`, in the worker: llguidance
with the model's vocabulary) before vLLM sees it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopstack.serving.constraint import envelope
from loopstack.serving.constraint.backend import BackendName, GrammarBackend, Payload, TurnSpec
from loopstack.serving.constraint.decision import DECISION_HEAD, DECISION_MAX_TOKENS
from loopstack.serving.constraint.lark_string import (
    LARK_KEY,
    STRING_HEAD,
    STRING_TAIL,
    LarkUnsupported,
    json_string_rules,
)
from loopstack.serving.constraint.sandbox import CompilePool
from loopstack.serving.constraint.schemas import SchemaCache
from loopstack.serving.constraint.walker import map_schema

# One line, with the separators the model writes everywhere else (``{"city": "Paris", "days":
# 5}``): whitespace left free let a small model loop on it (llguidance repeats its whitespace
# lexeme, so a bounded `whitespace_pattern` does not bound it); with no whitespace at all
# (``","``/``":"``) the model lost its usual tokens (``", "``) and wrote separators as strings.
_JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


_OPEN_OBJECT_KEYS = frozenset(
    {"additionalProperties", "patternProperties", "unevaluatedProperties", "propertyNames",
     "minProperties", "maxProperties", "allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas"}
)  # fmt: skip
NUMBER_STEP = 0.000001  # numbers get at most 6 decimals: a model cannot write 0.000... forever
# integers get at most 19 digits (int64 but its last 2.5 %; llguidance reads bounds as f64, in
# which 2**63 - 1 is not exact): unbounded, the 0.5B wrote `"MaximumLength": 1000000…` until
# max_tokens
INTEGER_BOUND = 9 * 10**18


def _finite_numbers(node: Any) -> Any:
    """A copy of `node` whose numbers have a finite number of decimals (``multipleOf``,
    which llguidance enforces): under ``exclusiveMinimum: 0`` a small model wanting 0 wrote
    ``0.000…`` until ``max_tokens``; integers at most 19 digits; objects with listed
    properties take only those; a ``pattern`` must match the whole string. A sound subset:
    the output is validated against the client's schema anyway."""
    return map_schema(node, _tighten)


def _tighten(node: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    is_number = kind == "number" or (isinstance(kind, list) and "number" in kind)
    if is_number and "multipleOf" not in node:
        out["multipleOf"] = NUMBER_STEP
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind and not is_number):
        if "maximum" not in node and "exclusiveMaximum" not in node:
            out["maximum"] = INTEGER_BOUND
        if "minimum" not in node and "exclusiveMinimum" not in node:
            out["minimum"] = -INTEGER_BOUND
    props, required = node.get("properties"), node.get("required", [])
    listed = set(props) if isinstance(props, dict) else None
    closable = listed is not None and isinstance(required, list) and set(required) <= listed
    if closable and not node.keys() & _OPEN_OBJECT_KEYS:
        # the listed properties only, as the outlines path writes objects: left open, the
        # 0.5B wandered into invented keys (`"additionalProperties": false` as a value)
        # until max_tokens
        out["additionalProperties"] = False
    pattern = node.get("pattern")
    if isinstance(pattern, str) and "^" not in pattern and "$" not in pattern:
        # JSON Schema's pattern is a search: under `[a-zA-Z0-9]{30,40}` any string holding 30
        # alphanumerics in a row is valid, so once the model had written some, the rest of
        # the string was free and the 0.5B filled it (hex, copies of the other arguments)
        # until max_tokens. A whole-string match is a subset of the search, as the outlines
        # path reads patterns and as most schema authors mean them (botocore's do). Patterns
        # that name an anchor themselves keep their own reading.
        out["pattern"] = f"^(?:{pattern})$"
    return out


def _schema(schema: Any) -> str:
    body = _finite_numbers(schema) if isinstance(schema, dict) else {}
    body["x-guidance"] = _JSON_OPTIONS
    return "%json " + json.dumps(body, ensure_ascii=False)


def json_grammar(schema: Any) -> str:
    """The Lark grammar of one JSON value under a client's schema."""
    return "%llguidance {}\nstart: " + _schema(schema) + "\n"


def _regex(pattern: str) -> str:
    return "/" + pattern.replace("/", "\\/") + "/"


def _arguments(schema: Any, prefix: str, rules: list[str]) -> str:
    """A call's arguments: its schema's ``%json``, or - for a tool whose one string
    ``input`` carries a client's Lark grammar (`lark_string.LARK_KEY`, a Responses custom
    tool) - ``{"input": "<text>"}`` with the text held to that grammar (its rules added to
    `rules`, their names prefixed with `prefix`)."""
    definition = schema.get(LARK_KEY) if isinstance(schema, dict) else None
    if isinstance(definition, str):
        try:
            text = json_string_rules(definition, prefix)
        except LarkUnsupported:  # the text is free; said to the client at translation
            return _schema(schema)
        rules.append(text.rules)
        return f"{_lit(STRING_HEAD)} {text.start} {_lit(STRING_TAIL)}"
    return _schema(schema)


def lark_grammar(spec: TurnSpec, tag_ids: dict[str, int] | None = None) -> str:
    """The Lark grammar of one turn. `tag_ids`: token ids of `envelope.CALL_TAGS` when they
    are special tokens (the free text of ``auto`` must allow them)."""
    if spec.mode == "auto" and spec.answer is not None:
        return _answer_grammar(spec, tag_ids)
    lines = ["%llguidance {}"]
    custom: list[str] = []  # the rules of tools' Lark grammars (`_arguments`)
    names = []
    if spec.mode == "auto":
        for i, (stem, group) in enumerate(envelope.stem_groups(list(spec.tools)).items()):
            rule = f"call_{i}"
            names.append(rule)
            trigger = "|".join(_escape_re(t) for t in envelope.triggers(stem))
            rests = [f"{_lit(envelope.name_rest(n, stem))} ARGS "
                     f"{_arguments(spec.tools[n], f'x{i}_{j}_', custom)}"
                     for j, n in enumerate(group)]  # fmt: skip
            lines.append(f"{rule}_trig[lazy]: TEXT /({trigger})/")
            lines.append(f"{rule}: {rule}_trig ({' | '.join(rests)})")
    else:
        names = _exact_calls(spec, lines, custom)
    calls = " | ".join(names)
    opened, closed = (f"<[{tag_ids[t]}]>" for t in envelope.CALL_TAGS) if tag_ids else ("", "")
    if spec.mode == "auto":
        # Free text, or text then a call; after a call only its tail (the envelope's `}`, a
        # closing fence or tag), then the end: a small model that loops on calls would
        # otherwise have each loop enforced as another call. More calls only where parallel
        # calls are on and the model opens another <tool_call> tag (the Hermes form).
        # Qwen's tags are special tokens (no TEXT lexeme matches them): referenced by id.
        opened = opened or _lit(envelope.CALL_TAGS[0])
        closed = closed or _lit(envelope.CALL_TAGS[1])
        tagged = f" | TEXT {opened} first tail" if tag_ids else ""  # else TEXT holds the tag
        if spec.decide:
            lines += _decision_rules(spec, opened)
        else:
            lines.append(f"start: TEXT | first tail{tagged}")
        lines.append(f"first: {calls}")
        more = f" (NL {opened} first tail)?" if spec.parallel else ""
        lines.append(f"tail: TAIL | TAIL {closed}{more} END")
        lines.append(r"TEXT: /(.|\n)*/")
        lines.append(f"TAIL: {_regex(envelope.CALL_TAIL)}")
        lines.append(r"NL: /\n?/")
        lines.append(r"END: /[ \t\n]{0,16}/")
        lines.append(f"ARGS: {_regex(envelope.ARGUMENTS_LEAD)}")
    else:
        opened = opened or _lit(envelope.CALL_TAGS[0])  # one lexeme each: `</tool_call>`
        closed = closed or _lit(envelope.CALL_TAGS[1])  # may end the turn or lead to another
        sep, close = f'"\\n" {closed} "\\n" {opened} "\\n"', f'"\\n" {closed}'
        rest = f" ({sep} call)*" if spec.parallel else ""
        # after the last call the model may close its tag (and a newline), and must then end;
        # without the newline a model writing one after the tag was forced into another call
        lines.append(f'start: call{rest} ({close} "\\n"?)?')
        lines.append(f"call: {calls}")
    return "\n".join(lines + custom) + "\n"


def _exact_calls(spec: TurnSpec, lines: list[str], custom: list[str]) -> list[str]:
    """One rule per offered tool, ``call_<i>``: its call from ``{"name": ...`` to the closing
    brace (added to `lines`, a Lark text's rules to `custom`); the rules' names."""
    names = []
    for i, (name, schema) in enumerate(spec.tools.items()):
        names.append(f"call_{i}")
        args = _arguments(schema, f"x{i}_", custom)
        lines.append(f'call_{i}: {_lit(envelope.call_head(name))} {args} "}}"')
    return names


def _answer_grammar(spec: TurnSpec, tag_ids: dict[str, int] | None) -> str:
    """``auto`` with a client's ``response_format`` (the Agents SDK's ``output_type`` beside
    its tools): the turn is either the answer - one JSON value under that schema, no text
    around it - or calls in the Hermes tags, each under its tool's schema, then the end. No
    free text: it would leave the answer unheld (a call found in it is the only way out)."""
    opened, closed = (f"<[{tag_ids[t]}]>" for t in envelope.CALL_TAGS) if tag_ids else (
        _lit(envelope.CALL_TAGS[0]), _lit(envelope.CALL_TAGS[1]))  # fmt: skip
    custom: list[str] = []
    lines = ["%llguidance {}"]
    names = _exact_calls(spec, lines, custom)
    more = f' ("\\n" {closed} "\\n" {opened} "\\n" call)*' if spec.parallel else ""
    calls = f'{opened} "\\n" call{more} ("\\n" {closed})? END'
    if spec.decide:
        lines += _decision_rules(spec, opened, answer=True)
        lines.append(f"calls: {calls}")
    else:
        lines.append(f"start: answer | {calls}")
    # A call may also come bare (``{"name": ..., "arguments": ...}``, no tag), as the small
    # models often write one: it is a branch of the answer's own JSON value (a literal call
    # head beside the ``%json`` is not a grammar llguidance can lex). Without it a bare call's
    # `{"` could only continue as the answer: the 1.5B, asked for the weather with a tool,
    # answered a made-up report in 6 of 6 samples.
    bare = [
        {"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
         "required": ["name", "arguments"], "additionalProperties": False}
        for name, schema in spec.tools.items()
        if not (isinstance(schema, dict) and LARK_KEY in schema)  # a Lark text: tagged only
    ]  # fmt: skip
    lines.append(f"answer: {_schema({'anyOf': [spec.answer, *bare]} if bare else spec.answer)}")
    lines.append(f"call: {' | '.join(names)}")
    lines.append(r"END: /[ \t\n]{0,16}/")
    return "\n".join(lines + custom) + "\n"


def _decision_rules(spec: TurnSpec, opened: str, *, answer: bool = False) -> list[str]:
    """``loopstack.decide``: the turn starts with ``Decision: <tool | none> <a few words>``
    and a newline (`loopstack.serving.constraint.decision`); after ``none`` only text, after a
    tool's name that tool's call (then the usual tail: more calls where parallel calls are on)."""
    names = ['"none" note LF ' + ("answer" if answer else "PLAIN")]
    rules = []
    for i, (name, schema) in enumerate(spec.tools.items()):
        names.append(f"d_{i}")
        head = _lit(envelope.call_head(name))
        if answer:  # `answer`/`calls`/`call_i` are `_answer_grammar`'s rules
            rules.append(f"d_{i}: {_lit(name)} note LF calls")
        else:
            rules.append(f"d_{i}: {_lit(name)} note LF {opened} NL {head} {_schema(schema)} tail")
    return [
        f"start: {_lit(DECISION_HEAD)} decision",
        f"decision: {' | '.join(names)}",
        *rules,
        f"note[max_tokens={DECISION_MAX_TOKENS}]: NOTE",
        r"NOTE: /( [^\n]{1,80})?/",
        r"LF: /\n/",
        # after `none`: text that starts no call (neither an envelope's `"name"` nor the tag)
        r"PLAIN: /(.|\n)*/ & ~/(.|\n)*(\"name\"|<tool_call>)(.|\n)*/",
    ]


def _escape_re(text: str) -> str:
    return "".join("\\" + c if c in r"\.^$|?*+()[]{}/" else c for c in text)


def _check(state: Callable[[str, str], str | None], fmt: str, text: str) -> str | None:
    """A sandbox job: compile a payload with the worker's vocabulary (`make_checker`)."""
    return state(fmt, text)


class GuidanceBackend(GrammarBackend):
    name: BackendName = "guidance"
    decides = True  # writes `loopstack.decide`'s decision line (`lark_grammar`)
    answers = True  # holds an auto turn's answer to `response_format` (`_answer_grammar`)
    check_job = staticmethod(_check)

    def __init__(
        self,
        pool: CompilePool,
        *,
        schemas: SchemaCache | None = None,
        timeout_s: float = 10.0,
        tags: Callable[[], dict[str, int] | None] | None = None,
    ) -> None:
        super().__init__(pool, schemas=schemas, timeout_s=timeout_s)
        self._tags = tags  # token ids of `envelope.CALL_TAGS`, read once the tokenizer is up
        self._tag_ids: dict[str, int] | None = None
        self._tags_read = tags is None

    @property
    def tag_ids(self) -> dict[str, int] | None:
        if not self._tags_read and self._tags is not None:
            self._tag_ids, self._tags_read = self._tags(), True
        return self._tag_ids

    def build(self, spec: TurnSpec) -> tuple[dict[str, Any], Payload]:
        grammar = lark_grammar(spec, self.tag_ids)
        return {"grammar": grammar}, ("grammar", grammar)

    def build_json(self, schema: Any) -> tuple[dict[str, Any], Payload]:
        grammar = json_grammar(schema)
        return {"grammar": grammar}, ("grammar", grammar)


def make_checker(tokenizer_path: str | None) -> Callable[[str, str], str | None]:
    """The sandbox's setup, in the worker: load the model's vocabulary once; the checker
    builds a payload's parser against it (an error message, or None)."""
    import llguidance

    if tokenizer_path is None:  # tests: a byte-level vocabulary
        tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
    elif (Path(tokenizer_path) / "tokenizer.json").is_file():
        tokenizer = llguidance.LLTokenizer(str(Path(tokenizer_path) / "tokenizer.json"))
    else:  # no fast-tokenizer file: through transformers
        import llguidance.hf
        from transformers import AutoTokenizer

        tokenizer = llguidance.hf.from_tokenizer(AutoTokenizer.from_pretrained(tokenizer_path))

    def check(fmt: str, text: str) -> str | None:
        try:
            grammar = llguidance.grammar_from(fmt, text)  # type: ignore[arg-type]
        except ValueError as exc:
            return str(exc)[:300]
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            return "; ".join(messages)[:300] or "invalid grammar"
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            return matcher.get_error()[:300]
        return None

    return check


def special_tag_ids(tokenizer: Any) -> dict[str, int] | None:
    """Ids of `envelope.CALL_TAGS` when the tokenizer has them as single added tokens."""
    ids = {}
    for tag in envelope.CALL_TAGS:
        try:
            tid = tokenizer.convert_tokens_to_ids(tag)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        if not isinstance(tid, int) or tid == getattr(tokenizer, "unk_token_id", None):
            return None
        ids[tag] = tid
    return ids


class _ByteTokenizer:
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)
