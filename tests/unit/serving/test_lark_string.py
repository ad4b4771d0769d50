"""A custom tool's Lark grammar held to its text inside a JSON string
(`loopstack.serving.constraint.lark_string`): checked with llguidance itself (a byte vocabulary), on
the grammar Codex CLI 0.169.0 sends for `apply_patch`, and inside a whole turn's grammar."""

from __future__ import annotations

import json

import llguidance
import pytest

from loopstack.serving.constraint.backend import TurnSpec
from loopstack.serving.constraint.guidance import _ByteTokenizer, lark_grammar, make_checker
from loopstack.serving.constraint.lark_string import (
    LARK_KEY,
    LarkUnsupported,
    json_regex,
    json_string_rules,
)
from loopstack.serving.http.responses.translate import CUSTOM_PARAMETERS

# What Codex CLI 0.169.0 sends as apply_patch's format.definition (captured from its request)
CODEX_APPLY_PATCH = """\
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""
ADD = '*** Begin Patch\n*** Add File: greeting.txt\n+hello "from" \\ loopstack\n*** End Patch'
UPDATE = (
    "*** Begin Patch\n*** Update File: a.py\n@@ def f():\n-    return 1\n+\treturn 2\n"
    "*** End of File\n*** End Patch\n"
)
TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))


def accepts(grammar: str, text: str) -> bool:
    """Whether llguidance under `grammar` lets a model write exactly `text`."""
    matcher = llguidance.LLMatcher(TOKENIZER, llguidance.grammar_from("lark", grammar))
    assert not matcher.is_error(), matcher.get_error()
    data = list(text.encode())
    return matcher.try_consume_tokens(data) == len(data) and matcher.is_accepting()


def string_grammar(definition: str) -> str:
    rules = json_string_rules(definition, "t_")
    return '%llguidance {}\nstart: "\\"" ' + rules.start + ' "\\""\n' + rules.rules


@pytest.mark.parametrize("text", [ADD, ADD + "\n", UPDATE])
def test_codex_patches_are_admitted_as_json_strings(text: str) -> None:
    assert accepts(string_grammar(CODEX_APPLY_PATCH), json.dumps(text))


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "*** Begin Patch\n*** End Patch",  # a patch needs a hunk
        ADD.replace("Add File", "Ad File"),
        ADD.replace("+hello", "hello"),  # an added line starts with +
        "*** Begin Patch\n*** Add File: a\n+x\u0001\n*** End Patch",  # control char
    ],
)
def test_what_the_grammar_refuses_cannot_be_written(text: str) -> None:
    assert not accepts(string_grammar(CODEX_APPLY_PATCH), json.dumps(text))


def test_the_raw_unescaped_text_is_refused() -> None:
    """A newline must be written as the escape: the text is a JSON string's body."""
    assert not accepts(string_grammar(CODEX_APPLY_PATCH), '"' + ADD + '"')


def test_regexes_keep_their_language() -> None:
    for pattern, good, bad in [
        (r"[a-c]+\d", "abc7", "abd7"),
        (r"(x|y)?z{2,3}", "xzz", "zzzz"),
        (r"[^\n]*", 'a "q" \\ b\tc', "a\nb"),
        (r'"\w+"', '"word_1"', '"two words"'),
    ]:
        grammar = '%llguidance {}\nstart: "\\"" body "\\""\nbody: ' + json_regex(pattern) + "\n"
        assert accepts(grammar, json.dumps(good)), pattern
        assert not accepts(grammar, json.dumps(bad)), pattern


@pytest.mark.parametrize(
    "definition",
    [
        'start: "a"i',
        "start: /a/i",
        "start: /(?=a)a/",
        "start: /(a)\\1/",
        'start: "a".."z"',
        'start: x\n%ignore " "',
        "start: X\n%import common.ESCAPED_STRING -> X",
        'rule: "a"',
    ],
)
def test_what_cannot_be_rewritten_is_refused(definition: str) -> None:
    with pytest.raises(LarkUnsupported):
        json_string_rules(definition, "t_")


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_a_turn_with_a_custom_tool_compiles_and_holds_its_text(mode: str) -> None:
    params = {**CUSTOM_PARAMETERS, LARK_KEY: CODEX_APPLY_PATCH}
    weather = {"type": "object", "properties": {"city": {"type": "string"}}}
    spec = TurnSpec(mode, {"apply_patch": params, "get_weather": weather}, parallel=False)  # type: ignore[arg-type]
    grammar = lark_grammar(spec)
    assert make_checker(None)("grammar", grammar) is None  # compiles as the sandbox does
    head = "" if mode == "required" else "Let me patch it.\n<tool_call>\n"
    call = {"name": "apply_patch", "arguments": {"input": ADD}}
    assert accepts(grammar, head + json.dumps(call, ensure_ascii=False))
    broken = {"name": "apply_patch", "arguments": {"input": "not a patch"}}
    assert not accepts(grammar, head + json.dumps(broken))
    other = {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert accepts(grammar, head + json.dumps(other))


def test_random_grammars_are_rewritten_or_refused_never_crash() -> None:
    import random

    rng = random.Random(46)
    pieces = [
        "start",
        ":",
        '"a"',
        '"\\x41"',
        "/[a-",
        "/(a|)+/",
        "/a{99999}/",
        "|",
        "(",
        ")",
        "X",
        "%import common.LF",
        "%import common.NOPE",
        "->",
        "?",
        "*",
        "+",
        "\n",
        "/\\p{L}/",
        '"',
        "/",
        "~",
        "..",
        "1",
        "[",
        "]",
        "//c",
        "rule.2",
    ]
    for _ in range(500):
        text = " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        try:
            json_string_rules(text, "t_")
        except LarkUnsupported:
            pass
