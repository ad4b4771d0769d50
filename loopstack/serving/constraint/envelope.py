"""The tool-call envelope, spelled once: how a call looks in the text the model writes.

Qwen/Hermes chat templates ask for ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``.
The small default model writes the same object just as often pretty-printed in a Markdown
```json fence. Everything that builds a constraint (every backend), renders a prompt or reads
calls back out of text takes its strings and patterns from here.

* `TOOL_CALL_OPEN` ends the prompt in ``required`` / named mode: the constraint starts at
  the object, ``{"name": "<tool>", "arguments": `` (`call_head`).
* `CALL_SEPARATOR` joins parallel calls in those modes.
* In ``auto`` a call starts where the text begins to name an offered tool: `triggers` are the
  literal strings ``"name": "<stem>`` (both common spacings), where a tool's stem is its
  first word with its separator (``get_`` of ``get_weather``; the whole name when it has no
  separator, `stem_groups`). From the trigger on, the rest of an offered name, then
  `ARGUMENTS_LEAD` and the tool's arguments are enforced. Neither a ```json code block nor a
  look-alike object ``{"name": "Ann", ...}`` is a trigger, since neither names an offered
  tool; a call the small model starts with a tool of the family that is not offered
  (``get_temperature`` when only ``get_humidity`` is left) becomes a call of the offered one.
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
# After a call's arguments in free text: the envelope's brace, a closing fence (bounded).
CALL_TAIL = r"[ \t\n]{0,16}\}?[ \t\n]{0,16}(```)?[ \t\n]{0,16}"
_NAME_SPACINGS = (": ", ":")


def quoted(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def call_head(name: str) -> str:
    """The text of a call up to its arguments: ``{"name": "<name>", "arguments": ``."""
    return '{"name": ' + quoted(name) + ', "arguments": '


_WORD_END = re.compile(r"[_\-.]")
MIN_STEM = 3  # "get_" is a family; "a_" is not


def stem(name: str) -> str:
    """A tool's first word with its separator (``get_`` of ``get_weather``), else its name."""
    m = _WORD_END.search(name)
    return name[: m.end()] if m is not None and m.end() >= MIN_STEM else name


def stem_groups(names: list[str]) -> dict[str, list[str]]:
    """Offered tools by the stem that starts their calls in free text. No stem is a prefix of
    another (a trigger would fire before the longer one could be written): a tool joins the
    shortest stem that its name starts with."""
    stems = {stem(n) for n in names}
    groups: dict[str, list[str]] = {}
    for name in names:
        shortest = min((s for s in stems if name.startswith(s)), key=len)
        groups.setdefault(shortest, []).append(name)
    return groups


def triggers(stem: str) -> list[str]:
    """The literal strings that start a call of a tool with this stem in free text."""
    return ['"name"' + sep + quoted(stem)[:-1] for sep in _NAME_SPACINGS]


def name_rest(name: str, stem: str) -> str:
    """What follows a trigger of `stem` in a call of `name`: the rest of its quoted name."""
    return quoted(name)[len(quoted(stem)) - 1 :]


def call_start_regex(names: list[str]) -> str:
    """Regex of a call's start in generated text, wrapper included: group ``name``."""
    alternatives = "|".join(re.escape(quoted(n)) for n in sorted(names, key=len, reverse=True))
    return (
        r"(?:<tool_call>[ \t\n]{0,64}|```(?:json)?[ \t]{0,16}\n?[ \t\n]{0,64})?"
        r"(?:\{[ \t\n]{0,64})?"
        rf'"name": ?(?P<name>{alternatives})' + ARGUMENTS_LEAD
    )
