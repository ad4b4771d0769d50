"""Conformance gaps real clients hit in ``POST /v1/messages`` (issue #55, item 4): a
``tool_result`` without its ``tool_use`` refused as Anthropic refuses it, a text ``document``
read by the model, Claude Code's ``claude-*`` names served without aliases (and said at
start-up)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.unit.serving.serving_fakes import MODEL, Harness
from tests.unit.serving.serving_helpers import PARIS, call
from tests.unit.serving.test_messages_api import (
    USER,
    WEATHER,
    assert_anthropic_error,
    body,
    post,
)

USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": PARIS}


def result(tool_use_id: str, text: str = "Sunny") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}


# --------------------------------------------------------------------------- orphan results (gap 3)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
async def test_a_tool_result_without_its_tool_use_is_400_naming_the_id(
    harness: Harness, path: str
) -> None:
    h = harness
    history = [
        *USER,
        {"role": "assistant", "content": [USE]},
        {"role": "user", "content": [result("toolu_1"), result("toolu_other")]},
    ]
    resp = await h.client.post(path, json=body(messages=history, tools=[WEATHER]))
    message = assert_anthropic_error(resp, 400, "invalid_request_error")
    # Anthropic's own words (Claude Code users report them: anthropics/claude-code#13460)
    assert message == (
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: "
        "toolu_other. Each `tool_result` block must have a corresponding `tool_use` block in "
        "the previous message."
    )
    assert h.engine.requests == []


async def test_a_tool_result_must_answer_the_previous_message_not_an_older_one(
    harness: Harness,
) -> None:
    h = harness
    history = [
        *USER,
        {"role": "assistant", "content": [USE]},
        {"role": "user", "content": [result("toolu_1")]},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": [result("toolu_1")]},
    ]
    message = assert_anthropic_error(
        await post(h, messages=history, tools=[WEATHER]), 400, "invalid_request_error"
    )
    assert message.startswith("messages.4.content.0: unexpected `tool_use_id`")
    # a tool result in the first message has no previous message at all
    first = [{"role": "user", "content": [result("toolu_1")]}]
    assert_anthropic_error(await post(h, messages=first), 400, "invalid_request_error")


async def test_a_matching_tool_result_still_passes_with_system_entries_between(
    harness: Harness,
) -> None:
    """Claude Code puts ``role: "system"`` entries inside ``messages``: not a turn."""
    h = harness
    h.engine.constrained = ["It is sunny."]
    history = [
        *USER,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, USE]},
        {"role": "system", "content": "Reminder: be brief."},
        {"role": "user", "content": [result("toolu_1")]},
    ]
    resp = await post(h, messages=history, tools=[WEATHER])
    assert resp.status_code == 200, resp.text
    # two assistant messages in a row are one turn (Anthropic merges them): both calls count
    h.engine.constrained = ["Both sunny."]
    other = {**USE, "id": "toolu_2"}
    history = [
        *USER,
        {"role": "assistant", "content": [USE]},
        {"role": "assistant", "content": [other]},
        {"role": "user", "content": [result("toolu_1"), result("toolu_2")]},
    ]
    resp = await post(h, messages=history, tools=[WEATHER])
    assert resp.status_code == 200, resp.text


# --------------------------------------------------------------------------- documents (gap 6)
TEXT = " ".join(f"word{i}" for i in range(80))


@pytest.mark.parametrize(
    "source",
    [
        {"type": "text", "media_type": "text/plain", "data": TEXT},
        {"type": "content", "content": [{"type": "text", "text": TEXT}]},
        {"type": "content", "content": TEXT},
    ],
    ids=["text", "content-blocks", "content-string"],
)
async def test_a_text_document_reaches_the_model(harness: Harness, source: dict[str, Any]) -> None:
    h = harness
    document = {"type": "document", "source": source, "title": "Notes.txt", "context": "mine"}
    messages = [{"role": "user", "content": [document, {"type": "text", "text": "Summarise."}]}]
    resp = await post(h, messages=messages)
    assert resp.status_code == 200, resp.text
    content = h.engine.requests[-1][1]["messages"][0]["content"]
    assert "Notes.txt" in content and "word0" in content and "word79" in content
    assert content.index("word79") < content.index("Summarise.")
    count = await h.client.post("/v1/messages/count_tokens", json=body(messages=messages))
    assert count.json()["input_tokens"] >= 80  # every word counted, not a note's few


async def test_a_pdf_document_becomes_a_note(harness: Harness) -> None:
    h = harness
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}
    document = {"type": "document", "source": pdf}
    messages = [{"role": "user", "content": [document, {"type": "text", "text": "What?"}]}]
    resp = await post(h, messages=messages)
    assert resp.status_code == 200, resp.text
    assert "document" in resp.headers["x-loopstack-note"]
    content = h.engine.requests[-1][1]["messages"][0]["content"]
    assert "JVBERi0" not in content and "document" in content and "What?" in content


# --------------------------------------------------------------------------- claude-* names (gap 8)
async def test_claude_names_are_served_on_messages_without_aliases(harness: Harness) -> None:
    h = harness
    assert h.state.model_aliases == {}
    for name in ("claude-haiku-4-5-20251001", "claude-sonnet-4-5", "claude-opus-4-1"):
        h.engine.chat_content = "ok"
        resp = await post(h, model=name)
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == name
        count = await h.client.post("/v1/messages/count_tokens", json=body(model=name))
        assert count.status_code == 200, count.text
    # not a claude-* name: still a 404 in Anthropic's shape
    assert_anthropic_error(await post(h, model="gpt-5"), 404, "not_found_error")
    # the OpenAI APIs keep their 404 for a claude-* name
    chat = await h.client.post(
        "/v1/chat/completions", json={"model": "claude-haiku-4-5", "messages": USER}
    )
    assert chat.status_code == 404, chat.text


async def test_claude_names_can_be_turned_off(make_harness: Any) -> None:
    h = make_harness()
    h.state.anthropic_model_names = False
    assert_anthropic_error(await post(h, model="claude-haiku-4-5"), 404, "not_found_error")
    h.state.model_aliases = {"claude-haiku-*": MODEL}  # the operator's aliases still hold
    h.engine.chat_content = "ok"
    assert (await post(h, model="claude-haiku-4-5")).status_code == 200


def test_the_start_up_log_says_claude_names_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.unit.serving.test_startup_overlap import _app

    caplog.set_level(logging.INFO, logger="loopstack.serving.server")
    app = _app(tmp_path, monkeypatch, lambda path: None)
    assert app.state.loopstack.anthropic_model_names is True
    said = [r.getMessage() for r in caplog.records if "claude-*" in r.getMessage()]
    assert said and "/v1/messages" in said[0] and "LOOPSTACK_ANTHROPIC_MODEL_NAMES" in said[0]
    caplog.clear()
    monkeypatch.setenv("LOOPSTACK_ANTHROPIC_MODEL_NAMES", "false")
    (tmp_path / "off").mkdir()
    app = _app(tmp_path / "off", monkeypatch, lambda path: None)
    assert app.state.loopstack.anthropic_model_names is False
    said = [r.getMessage() for r in caplog.records if "claude-*" in r.getMessage()]
    assert said and "not served" in said[0]


async def test_a_tool_round_trip_under_a_claude_name(harness: Harness) -> None:
    h = harness
    h.engine.constrained = [call("get_weather", PARIS)]
    first = await post(h, model="claude-haiku-4-5-20251001", tools=[WEATHER],
                       tool_choice={"type": "any"})  # fmt: skip
    assert first.status_code == 200, first.text
    assert first.json()["content"][0]["type"] == "tool_use"
