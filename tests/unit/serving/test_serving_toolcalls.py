"""loopstack.serving.constraint.calltext: the incremental call reader, lenient parsing, auto
intent."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from loopstack.serving.constraint.calltext import (
    CallEvent,
    CallReader,
    ContentDelta,
    new_call_id,
    parse_lenient,
)

SEP = "\n</tool_call>\n<tool_call>\n"


def call_text(name: str, args: Any) -> str:
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


TRICKY_ARGS = [
    {},
    {"city": "Paris"},
    {"code": 'if (x) { return "}"; } // {', "n": [1, [2, {"a": "]"}]]},
    {"q": 'say "hi" \\ and \\" then }', "esc": "\\\\", "nl": "line\nnext\ttab"},
    {"json": '{"name": "inner", "arguments": {}}', "empty": "", "u": "東京 ✓ \u00e9"},
    {"deep": {"a": {"b": {"c": [[], {}, [{}]]}}}, "num": -1.5e3, "t": True, "n": None},
]


def feed_all(chunks: list[str]) -> tuple[CallReader, list[Any]]:
    parser = CallReader.calls_of_any_name()
    events = []
    for ch in chunks:
        events += parser.feed(ch)
    return parser, events


def calls_only(events: list[ContentDelta | CallEvent]) -> list[CallEvent]:
    """The events, each a call event (constrained call text has no content)."""
    assert all(isinstance(e, CallEvent) for e in events), events
    return [e for e in events if isinstance(e, CallEvent)]


def random_chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13, 40])
        out.append(text[i : i + n])
        i += n
    return out


def summary(parser: CallReader) -> list[tuple[int, str, str, bool]]:
    return [(c.index, c.name, c.arguments, c.complete) for c in parser.calls]


@pytest.mark.parametrize("args", TRICKY_ARGS)
def test_single_call_any_chunking(args: Any) -> None:
    text = call_text("do_it", args) + "\n</tool_call>"
    whole, _ = feed_all([text])
    assert summary(whole) == [(0, "do_it", json.dumps(args, ensure_ascii=False), True)]
    assert json.loads(whole.calls[0].arguments) == args
    chunkings = [list(text)] + [random_chunks(text, random.Random(s)) for s in range(25)]
    for chunks in chunkings:
        parser, events = feed_all(chunks)
        assert summary(parser) == summary(whole)
        # Events rebuild the same calls: one name event per call, deltas concatenate.
        names = [(e.index, e.name) for e in events if e.name is not None]
        assert names == [(0, "do_it")]
        assert "".join(e.arguments_delta for e in events) == whole.calls[0].arguments
        assert all(e.id == parser.calls[e.index].id for e in events)


def test_parallel_calls_any_chunking() -> None:
    calls = [("a", TRICKY_ARGS[2]), ("b_2", TRICKY_ARGS[3]), ("c-3", TRICKY_ARGS[4])]
    text = SEP.join(call_text(n, a) for n, a in calls) + "\n</tool_call>"
    whole, _ = feed_all([text])
    expected = [(i, n, json.dumps(a, ensure_ascii=False), True) for i, (n, a) in enumerate(calls)]
    assert summary(whole) == expected
    for seed in range(30):
        parser, events = feed_all(random_chunks(text, random.Random(seed)))
        assert summary(parser) == expected
        for i, c in enumerate(parser.calls):
            delta = "".join(e.arguments_delta for e in events if e.index == i)
            assert delta == c.arguments
            assert [e.name for e in events if e.index == i and e.name] == [c.name]
    parser, _ = feed_all(list(text))
    assert summary(parser) == expected
    assert len({c.id for c in parser.calls}) == 3


def test_name_is_announced_before_the_arguments_end() -> None:
    parser = CallReader.calls_of_any_name()
    assert parser.feed('{"name": "get_wea') == []
    events = calls_only(parser.feed('ther", "arguments": {"ci'))
    assert [(e.name, e.arguments_delta) for e in events] == [("get_weather", ""), (None, '{"ci')]
    assert not parser.calls[0].complete
    events = calls_only(parser.feed('ty": "}"}'))
    assert [e.arguments_delta for e in events] == ['ty": "}"}']
    assert parser.calls[0].complete and parser.calls[0].arguments == '{"city": "}"}'


def test_unfinished_call_stays_incomplete() -> None:
    parser, _ = feed_all(['{"name": "f", "arguments": {"a": [1, 2'])
    assert [(c.name, c.arguments, c.complete) for c in parser.calls] == [
        ("f", '{"a": [1, 2', False)
    ]


def test_escaped_name_is_decoded() -> None:
    parser, _ = feed_all(['{"name": "a\\u00e9b", "arguments": {}}'])
    assert parser.calls[0].name == "aéb"


def test_new_call_ids_are_unique_and_openai_shaped() -> None:
    ids = {new_call_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(i.startswith("call_") and len(i) == 29 and i[5:].isalnum() for i in ids)


# --------------------------------------------------------------------------- lenient parsing
@pytest.mark.parametrize(
    "text,expected",
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', [("f", {"a": 1})]),
        (
            'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": "}"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
            [("f", {"a": "}"}), ("g", {})],
        ),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})]),  # unclosed
        ('Here:\n```json\n{"name": "f", "arguments": {"x": [1]}}\n```', [("f", {"x": [1]})]),
        ('```\n{"name": "f", "parameters": {"x": 2}}\n```', [("f", {"x": 2})]),
        ('```json\n[{"name": "f", "arguments": {}}, {"name": "g"}]\n```', [("f", {}), ("g", {})]),
        ('{"name": "f", "arguments": {"a": 1}}', [("f", {"a": 1})]),
        ('  I will call it: {"name": "f", "arguments": "{\\"a\\": 1}"} ok', [("f", '{"a": 1}')]),
        ("just some text", []),
        ("", []),
        ("{not json at all", []),
        ('{"arguments": {"a": 1}}', []),
        ('{"name": 5, "arguments": {}}', []),
        ("<tool_call>\ngarbage\n</tool_call>", []),
        ("```json\n[1, 2, 3]\n```", []),
    ],
)
def test_parse_lenient(text: str, expected: list[tuple[str, Any]]) -> None:
    assert parse_lenient(text) == expected


# --------------------------------------------------------------------------- intent detection
def stream(detector: CallReader, chunks: list[str]) -> tuple[str, str | None]:
    """Feed chunks; return (text released before any call start, the text before the call
    start - or None when none started)."""
    released = ""
    for ch in chunks:
        detector.feed(ch)
        safe = detector.sent
        assert safe >= len(released), "released text must never be taken back"
        assert detector.text.startswith(released)
        released = detector.text[:safe]
        if detector.found is not None:
            return released, detector.text[: detector.found].rstrip()
    return released, None


@pytest.mark.parametrize(
    "text",
    [
        "Hello! How can I help you today?",
        "Use a < b and c > d; maps look like {key: value}.",
        'Set it with {"other": 1} inline, or a {name} placeholder.',
        "```python\nprint({'name': 1})\n```\nDone.",
        '```json\n{"city": "Paris"}\n```',
        "I like <b>bold</b> and `code`.",
        "",
    ],
)
def test_plain_text_is_released_in_full(text: str) -> None:
    for chunks in [[text], list(text), random_chunks(text, random.Random(7))]:
        d = CallReader.intent()
        released, intent = stream(d, chunks)
        assert intent is None
        assert d.text == text
        # At most a short tail that could still open a call is held (sent at end of stream).
        held = text[len(released) :]
        assert held == "" or (held[0] in "<`{" and len(held) <= 64), (text, held)
        if not text.endswith(("`", "\n", "<", "{")):
            assert held == "", (text, held)


@pytest.mark.parametrize(
    "before,marker",
    [
        ("", "<tool_call>\n"),
        ("Let me check the weather.", "\n<tool_call>\n"),
        ("Sure.", "\n```json\n"),
        ("", "```json\n"),
        ("Sure.", "\n```\n"),
        ("", ""),
        ("Checking now.", "\n"),
    ],
)
def test_call_starts_trigger_intent(before: str, marker: str) -> None:
    body = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    text = before + marker + body
    for chunks in [[text], list(text), random_chunks(text, random.Random(3))]:
        d = CallReader.intent()
        released, intent = stream(d, chunks)
        assert intent is not None, text
        assert intent == before
        assert released.rstrip() == before  # nothing of the call leaked as content


def test_fence_with_spaces_before_the_name_triggers() -> None:
    d = CallReader.intent()
    _, intent = stream(d, list('Ok:\n```json\n{\n  "name": "f"'))
    assert intent is not None and intent == "Ok:"


def test_python_fence_does_not_trigger_and_is_released() -> None:
    text = 'Here you go:\n```python\ndef f():\n    return {"name": 1}\n```\n'
    d = CallReader.intent()
    released, intent = stream(d, list(text))
    assert intent is None
    assert released + "```\n" == text  # a closing fence could still open a ```\n{"name"


def test_partial_tool_call_tag_is_held_back() -> None:
    d = CallReader.intent()
    released, intent = stream(d, list("Hello <tool_"))
    assert intent is None and released == "Hello "
    released, intent = stream(d, ["call>"])
    assert intent is not None and intent == "Hello"
    assert released == "Hello "


def test_held_back_tail_is_released_when_it_turns_out_harmless() -> None:
    d = CallReader.intent()
    assert stream(d, list("a <to")) == ("a ", None)
    released, intent = stream(d, list("ol> b"))
    assert intent is None and released == "a <tool> b"
    d = CallReader.intent()
    assert stream(d, list("```")) == ("", None)
    released, intent = stream(d, list("bash\nls\n"))
    assert intent is None and released == "```bash\nls\n"


def test_brace_mid_sentence_is_not_held_forever() -> None:
    d = CallReader.intent()
    text = 'The object {"name": "x"} is an example, not a call. Anything else?'
    released, intent = stream(d, list(text))
    assert intent is None
    assert released == text
    d = CallReader.intent()
    released, intent = stream(d, list("Use {braces} freely and go on"))
    assert intent is None and released == "Use {braces} freely and go on"


def test_line_start_brace_is_held_until_it_is_clearly_not_a_call() -> None:
    d = CallReader.intent()
    released, _ = stream(d, list('Result:\n{"na'))
    assert released == "Result:\n"
    released, intent = stream(d, list('me_of_thing": 1}\nbye'))
    assert intent is None and released == 'Result:\n{"name_of_thing": 1}\nbye'


def test_a_call_after_an_inline_example_still_triggers() -> None:
    """A mid-sentence {"name": ...} must not blind the detector to a later real call."""
    for marker in ["<tool_call>\n", ""]:
        text = 'Calls look like {"name": x}.\n' + marker + '{"name": "f", "arguments": {"a": 1}}'
        for chunks in [[text], list(text)]:
            d = CallReader.intent()
            released, intent = stream(d, chunks)
            assert intent is not None, (marker, chunks[:1])
            assert intent == 'Calls look like {"name": x}.'
            assert "arguments" not in released
