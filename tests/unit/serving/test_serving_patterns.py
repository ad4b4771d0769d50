"""loopstack.serving.constraint.patterns.json_safe_pattern: what a string's `pattern` becomes in the
regex.

Each case is checked as vLLM would see it: the pattern between quotes must fullmatch the
JSON encoding of good strings and reject strings that would break the JSON or the pattern.
"""

from __future__ import annotations

import json
import re

import pytest

from loopstack.serving.constraint.patterns import json_safe_pattern
from loopstack.serving.constraint.regexes import count_states


def in_quotes(pattern: str) -> re.Pattern[str]:
    regex, _ = json_safe_pattern(pattern)
    return re.compile('"' + regex + '"')


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        # positive classes lose ", \ and control characters (a botocore pattern)
        ("[\\u0009\\u000A\\u000D\\u0020-\\u00FF]+", ["a b", "é~!"], ['a"b', "a\\b", "a\nb"]),
        ("[\\x21-\\x7E]{1,4}", ["ab!~"], ['a"', "a\\", "a b"]),
        ("[ -~]*", ["any text"], ['"', "\\"]),
        # octal escapes (vLLM's regex engine rejects them) become hex
        ("[^/:|\\000-\\037]+", ["abc"], ["a/b", "a\x01b", 'a"b']),
        # ECMA-262: \d and \w are ASCII
        ("vpc-\\w{3}", ["vpc-a_9"], ["vpc-ééé", "vpc-ab"]),
        ("\\d+", ["0123"], ["١٢"]),
        ("[\\w-]+", ["a-b_c"], ["a b", "ü"]),
        ("\\W\\D", ["-x"], ["a1", '""']),
        # literal ", \ and controls are matched in their escaped form
        ('say "hi"', ['say "hi"'], ["say hi"]),
        ("a\\\\b", ["a\\b"], ["ab"]),
        ("tab\\tz", ["tab\tz"], ["tab z"]),
        # anchors go; alternation stays inside the quotes
        ("^(ab|cd)$", ["ab", "cd"], ["abcd", "^ab"]),
    ],
)
def test_patterns_match_json_strings(pattern: str, good: list[str], bad: list[str]) -> None:
    rx = in_quotes(pattern)
    for text in good:
        assert rx.fullmatch(json.dumps(text, ensure_ascii=False)), text
        assert re.fullmatch(pattern, text), f"test case: {text!r} must fit {pattern!r}"
    for text in bad:
        assert not rx.fullmatch(json.dumps(text, ensure_ascii=False)), text


@pytest.mark.parametrize(
    "pattern",
    ["[\\S\\s]+", "[\\d\\S]", "(?=a)ab", "(a)\\1", "(?<!x)y", "\\p{L}+", "[\\p{L}]", '["]'],
)
def test_what_cannot_be_expressed_is_a_safe_superset_marked_inexact(pattern: str) -> None:
    regex, exact = json_safe_pattern(pattern)
    assert not exact
    rx = re.compile('"' + regex + '"')
    assert not rx.fullmatch('"a"b"') and not rx.fullmatch('"a\\b"')


@pytest.mark.parametrize("pattern", ["\\bfoo", "foo\\B"])
def test_word_boundaries_are_dropped_and_checked_afterwards(pattern: str) -> None:
    regex, exact = json_safe_pattern(pattern)
    assert not exact and re.fullmatch(regex, "foo")


def test_a_class_admitting_quotes_no_longer_explodes_the_automaton() -> None:
    """``[\\u0020-\\u00FF]+`` in an array of strings: with the quote inside the class the
    automaton over a 100-character vocabulary never finished; now it has a handful of
    states (measured with vLLM's own index builder)."""
    regex, _ = json_safe_pattern("[\\u0009\\u000A\\u000D\\u0020-\\u00FF]+")
    item = f'"{regex}"'
    assert count_states(rf"\[({item}(,{item})*)?\]") < 20
