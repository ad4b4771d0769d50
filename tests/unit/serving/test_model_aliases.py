"""LOOPSTACK_MODEL_ALIASES: parsed once at start (a bad value stops the server), resolved per
request (exact names, prefixes, the catch-all; otherwise a 404 that lists what is served)."""

from __future__ import annotations

import pytest

from loopstack.serving.exceptions import ModelNotFound
from loopstack.serving.http.aliases import parse_aliases, resolve_model_name

SERVED = "qwen"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", {}),
        ("*", {"*": SERVED}),
        ("gpt-5=qwen, claude-*", {"gpt-5": SERVED, "claude-*": SERVED}),
        ('{"gpt-4.1": "qwen", "*": "qwen"}', {"gpt-4.1": SERVED, "*": SERVED}),
        ("a=,b", {"a": SERVED, "b": SERVED}),
    ],
)
def test_parse(text: str, expected: dict[str, str]) -> None:
    assert parse_aliases(text, SERVED) == expected


@pytest.mark.parametrize("text", ["gpt-5=llama", '{"a": 1}', '["a"]', "=qwen", "{not json"])
def test_a_bad_value_is_refused_at_start(text: str) -> None:
    with pytest.raises(ValueError):
        parse_aliases(text, SERVED)


def test_resolve() -> None:
    aliases = parse_aliases("claude-*,claude-haiku-*,gpt-5", SERVED)
    for name in (SERVED, "gpt-5", "claude-sonnet-4-5", "claude-haiku-4-5-20251001"):
        assert resolve_model_name(name, SERVED, aliases) == SERVED
    with pytest.raises(ModelNotFound) as err:
        resolve_model_name("gpt-4o", SERVED, aliases)
    body = err.value.to_body()["error"]
    assert body["code"] == "model_not_found" and "`qwen`" in body["message"]
    assert resolve_model_name("gpt-4o", SERVED, {"*": SERVED}) == SERVED
    with pytest.raises(ModelNotFound):
        resolve_model_name("claude", SERVED, aliases)  # "claude-*" needs the dash
