"""The tool-call envelope, spelled once: how a call looks in the text the model writes.

Qwen/Hermes chat templates ask for ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``.
The small default model writes the same object just as often pretty-printed in a Markdown
```json fence. Everything that builds a constraint (every backend), renders a prompt or reads
calls back out of text takes its strings and patterns from here.

* `TOOL_CALL_OPEN` ends the prompt in ``required`` / named mode: the constraint starts at
  the object, ``{"name": "<tool>", "arguments": `` (`call_head`).
* `CALL_SEPARATOR` joins parallel calls in those modes.
* In ``auto`` a call starts where the text names an offered tool: `triggers` are the literal
  strings ``"name": "<tool>"`` (both common spacings); what follows (`ARGUMENTS_LEAD`, then
  the tool's arguments) is enforced. Neither a ```json code block nor a look-alike object
  ``{"name": "Ann", ...}`` is a trigger, since neither names an offered tool.
* `call_start_regex` finds a call's start in generated text, with the wrapper the model put
  around it (``<tool_call>`` or a fence), for the parser.
"""

from __future__ import annotations

import json
import re

TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"
CALL_SEPARATOR = TOOL_CALL_CLOSE + "\n" + TOOL_CALL_OPEN
CALL_TAGS = ("<tool_call>", "</tool_call>")  # single tokens in Qwen's vocabulary
# After a trigger: `, "arguments": ` with whatever whitespace the model likes (bounded).
ARGUMENTS_LEAD = r'[ \t\n]{0,16},[ \t\n]{0,16}"arguments"[ \t\n]{0,16}:[ \t\n]{0,16}'
_NAME_SPACINGS = (": ", ":")
# Any head, any name: for text that no constraint shaped (the benchmark's baseline).
ANY_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


def quoted(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def call_head(name: str) -> str:
    """The text of a call up to its arguments: ``{"name": "<name>", "arguments": ``."""
    return '{"name": ' + quoted(name) + ', "arguments": '


def triggers(name: str) -> list[str]:
    """The literal strings that start a call of `name` in free text."""
    return ['"name"' + sep + quoted(name) for sep in _NAME_SPACINGS]


def call_start_regex(names: list[str]) -> str:
    """Regex of a call's start in generated text, wrapper included: group ``name``."""
    alternatives = "|".join(re.escape(quoted(n)) for n in sorted(names, key=len, reverse=True))
    return (
        r"(?:<tool_call>[ \t\n]{0,64}|```(?:json)?[ \t]{0,16}\n?[ \t\n]{0,64})?"
        r"(?:\{[ \t\n]{0,64})?"
        rf'"name": ?(?P<name>{alternatives})' + ARGUMENTS_LEAD
    )
