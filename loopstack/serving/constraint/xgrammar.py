"""The ``xgrammar`` constraint backend: a turn as one XGrammar structural tag.

* ``auto`` - ``triggered_tags``: free text until a trigger begins to name an offered tool
  (``"name": "get_``, `envelope.triggers`), then the rest of an offered name,
  ``, "arguments": `` and that tool's
  argument schema are enforced, then free text again (the fence or ``</tool_call>`` the model
  closes with). ``stop_after_first``: one call per ``auto`` turn on this backend.
* ``required`` / named - the prompt ends with ``<tool_call>\\n``; ``tags_with_separator``: one
  or more ``{"name": "<tool>", "arguments": <schema>}`` joined by ``</tool_call>``/
  ``<tool_call>``, nothing else.

XGrammar compiles a grammar's token masks ahead for its context-independent part (tens of
milliseconds for a tool set, `docs/architecture.md`), and enforces integer bounds, enums,
string lengths and patterns (no lookaround: refused at admission), nested objects and arrays.
Counted bounds above `MAX_COUNTED` are left to validation (`relaxed`): XGrammar unrolls
them. Whitespace inside the JSON is bounded (`MAX_WHITESPACE`) so a small model cannot loop on
newlines. A client's JSON schema becomes the same structural tag around one JSON value
(`json_tag`); a client's regex goes to the engine as it is. Every payload is compiled first
in the sandbox (`make_checker`, in the worker: XGrammar with the model's vocabulary).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopstack.serving.constraint import envelope
from loopstack.serving.constraint.backend import BackendName, GrammarBackend, Payload, TurnSpec
from loopstack.serving.constraint.walker import map_schema

MAX_WHITESPACE = 24
_LOCATION = re.compile(r"^\[[^\]]*\] \S+:\d+: ")  # "[12:00:00] /project/cpp/x.cc:83: "


MAX_COUNTED = 64  # larger maxLength/maxItems: left to validation (see the module docstring)
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


def relaxed(schema: Any) -> Any:
    """`schema` without counted bounds above `MAX_COUNTED`: XGrammar unrolls them, and its
    ahead-of-time mask compile then takes seconds per bound (``maxLength: 1011``: 29 s on one
    busy core here). What is dropped is validated after generation instead."""

    def drop(node: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in out.items()
                if not (k in _COUNTS and isinstance(v, int) and v > MAX_COUNTED)}  # fmt: skip

    return map_schema(schema, drop)


def _arguments(schema: Any) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": relaxed(schema),
        "max_whitespace_cnt": MAX_WHITESPACE,
    }


def structural_tag(spec: TurnSpec) -> dict[str, Any]:
    """The XGrammar structural tag (``{"type": "structural_tag", "format": ...}``)."""
    if spec.mode == "auto":
        tags, trigs = [], []
        for stem, group in envelope.stem_groups(list(spec.tools)).items():
            for trigger in envelope.triggers(stem):
                trigs.append(trigger)
                for name in group:
                    content = {
                        "type": "sequence",
                        "elements": [
                            {"type": "regex", "pattern": envelope.ARGUMENTS_LEAD},
                            _arguments(spec.tools[name]),
                            {"type": "regex", "pattern": envelope.CALL_TAIL},
                        ],
                    }
                    begin = trigger + envelope.name_rest(name, stem)
                    tags.append({"type": "tag", "begin": begin, "content": content, "end": ""})
        fmt: dict[str, Any] = {
            "type": "triggered_tags",
            "triggers": trigs,
            "tags": tags,
            # one call per auto turn: the 0.5B loops on calls, and each loop would be enforced
            # as another call (the guidance grammar allows more only in new <tool_call> tags,
            # which triggered_tags cannot express)
            "stop_after_first": True,
        }
    else:
        tags = [
            {"type": "tag", "begin": envelope.call_head(name), "content": _arguments(schema),
             "end": "}"}
            for name, schema in spec.tools.items()
        ]  # fmt: skip
        fmt = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": envelope.CALL_SEPARATOR,
            "at_least_one": True,
            "stop_after_first": not spec.parallel,
        }
    return {"type": "structural_tag", "format": fmt}


def json_tag(schema: Any) -> dict[str, Any]:
    """One JSON value under a client's schema, as a structural tag."""
    return {"type": "structural_tag", "format": _arguments(schema)}


def _check(state: Callable[[str, str], str | None], fmt: str, text: str) -> str | None:
    """A sandbox job: compile a payload with the worker's vocabulary (`make_checker`)."""
    return state(fmt, text)


class XGrammarBackend(GrammarBackend):
    name: BackendName = "xgrammar"
    check_job = staticmethod(_check)

    def exact(self, schema: Any) -> bool:
        return super().exact(schema) and relaxed(schema) == schema

    def build(self, spec: TurnSpec) -> tuple[dict[str, Any], Payload]:
        text = json.dumps(structural_tag(spec), ensure_ascii=False)
        return {"structural_tag": text}, ("structural_tag", text)

    def build_json(self, schema: Any) -> tuple[dict[str, Any], Payload]:
        text = json.dumps(json_tag(schema), ensure_ascii=False)
        return {"structural_tag": text}, ("structural_tag", text)


def tokenizer_info(tokenizer_json: str) -> Any:
    """XGrammar's vocabulary from a ``tokenizer.json``, as `TokenizerInfo.from_huggingface`
    reads a fast tokenizer (vocabulary in id order, type and prefix space detected from the
    same JSON), without loading the tokenizer through transformers."""
    import xgrammar as xgr
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    vocab = tok.get_vocab(with_added_tokens=True)
    encoded = [""] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        encoded[index] = token
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(tok.to_str())
    return xgr.TokenizerInfo(
        encoded,
        meta["vocab_type"],
        vocab_size=len(encoded),
        add_prefix_space=meta["add_prefix_space"],
    )


def make_checker(tokenizer_path: str | None) -> Callable[[str, str], str | None]:
    """The sandbox's setup, in the worker: load the model's vocabulary once; the checker
    compiles a structural tag or a regex with it, as vLLM will (an error message, or None)."""
    import xgrammar as xgr

    if tokenizer_path is None:  # tests: a byte-level vocabulary
        info = xgr.TokenizerInfo([chr(i) for i in range(256)] + list(envelope.CALL_TAGS))
    elif (Path(tokenizer_path) / "tokenizer.json").is_file():
        info = tokenizer_info(str(Path(tokenizer_path) / "tokenizer.json"))
    else:  # no fast-tokenizer file: through transformers
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
        info = xgr.TokenizerInfo.from_huggingface(tok)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def check(fmt: str, text: str) -> str | None:
        try:
            if fmt == "regex":
                compiler.compile_regex(text)
            else:
                compiler.compile_structural_tag(text)
        except (RuntimeError, ValueError, TypeError) as exc:
            return _LOCATION.sub("", str(exc).strip().splitlines()[0])
        return None

    return check
