"""The server's start: the engine boots while the tokenizer loads, not after it.

Loading the tokenizer (importing transformers included) takes ~13 s of one core, the engine's
start a minute or more in its own processes: in sequence they added up on every start."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import loopstack.serving.server as server_mod
from loopstack.serving.config import ServerSettings
from loopstack.serving.prompt import BackgroundTokenizer, PromptBuilder
from tests.unit.serving.serving_fakes import FakeTokenizer

MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_builder_over_a_background_tokenizer_renders_like_a_plain_one() -> None:
    release = threading.Event()

    def load() -> FakeTokenizer:
        assert release.wait(10)
        return FakeTokenizer()

    lazy = PromptBuilder(BackgroundTokenizer(load), max_model_len=100)  # does not wait
    release.set()
    plain = PromptBuilder(FakeTokenizer(), max_model_len=100)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert lazy.render(MESSAGES, tools) == plain.render(MESSAGES, tools)
    assert lazy.template_renders_tools is plain.template_renders_tools is True
    assert lazy.count_tokens("a b c") == 3


def test_a_failed_load_is_raised_where_the_tokenizer_is_needed() -> None:
    def load() -> Any:
        raise OSError("no tokenizer.json in /nowhere")

    loading = BackgroundTokenizer(load)
    with pytest.raises(OSError, match=r"no tokenizer\.json"):
        loading.get()
    with pytest.raises(OSError, match=r"no tokenizer\.json"):
        PromptBuilder(loading).render(MESSAGES, None)


class RecordingEngine:
    """Stands in for VLLMEngine: records when its start began and ended."""

    events: list[str]
    started: threading.Event

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def start(self) -> None:
        self.events.append("engine start begins")
        self.started.set()
        await asyncio.sleep(0.05)
        self.events.append("engine up")

    async def supervise(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.events.append("engine stopped")


def _app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load: Any) -> Any:
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setattr(server_mod, "VLLMEngine", RecordingEngine)
    monkeypatch.setattr(server_mod, "_load_tokenizer", load)
    settings = ServerSettings(
        model=str(model), home=tmp_path / "home", engine_url="http://127.0.0.1:9/v1"
    )
    return server_mod.create_app(settings)


def test_the_engine_starts_while_the_tokenizer_is_still_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    started = threading.Event()
    monkeypatch.setattr(RecordingEngine, "events", events, raising=False)
    monkeypatch.setattr(RecordingEngine, "started", started, raising=False)

    def load(path: str) -> FakeTokenizer:
        # Finishes only once the engine's start has begun: a server that loads the
        # tokenizer first (and starts the engine after) fails here after 5 s.
        assert started.wait(5), "the engine did not start until the tokenizer was loaded"
        events.append("tokenizer loaded")
        return FakeTokenizer()

    app = _app(tmp_path, monkeypatch, load)

    async def go() -> None:
        async with app.router.lifespan_context(app):
            events.append("serving")

    asyncio.run(go())
    assert events.index("engine start begins") < events.index("tokenizer loaded")
    ready = max(events.index("engine up"), events.index("tokenizer loaded"))
    assert events.index("serving") > ready


def test_a_tokenizer_that_fails_to_load_fails_the_start_and_stops_the_engine_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    monkeypatch.setattr(RecordingEngine, "events", events, raising=False)
    monkeypatch.setattr(RecordingEngine, "started", threading.Event(), raising=False)

    def load(path: str) -> Any:
        raise OSError(f"cannot read the tokenizer in {path}")

    app = _app(tmp_path, monkeypatch, load)

    async def go() -> None:
        async with app.router.lifespan_context(app):
            events.append("serving")

    with pytest.raises(OSError, match="cannot read the tokenizer"):
        asyncio.run(go())
    assert "serving" not in events
