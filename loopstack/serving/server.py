"""`loopstack serve`: resolve the model, start vLLM, put our layer in front, serve.

Shutdown is bounded: the first SIGTERM/SIGINT starts uvicorn's graceful shutdown (in-flight
requests get part of `LOOPSTACK_SHUTDOWN_GRACE_S`, then are cancelled; the engine group is
stopped, SIGTERM then SIGKILL) and also arms a deadline that no stuck request or stuck event
loop can hold up: when the grace period is over, a thread kills the engine group and ends
the process, and a SIGALRM at its default action backs that thread up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI

from loopstack.serving.config import ServerSettings, unpack
from loopstack.serving.constraint.factory import backend_from_settings
from loopstack.serving.embeddings import EmbeddingService
from loopstack.serving.engine.cpu_report import cpu_report
from loopstack.serving.engine.hardware import (
    check_cuda_driver,
    cpu_dtype,
    cpu_layout,
    default_model,
    detect_hardware,
    vllm_launch,
)
from loopstack.serving.engine.model_files import tokenizer_folder
from loopstack.serving.engine.model_store import resolve_model
from loopstack.serving.engine.process import ensure_port_free
from loopstack.serving.engine.supervisor import VLLMEngine, read_engine_key
from loopstack.serving.exceptions import EnginePortInUse
from loopstack.serving.http.admission import Admission
from loopstack.serving.http.aliases import anthropic_names_note, parse_aliases
from loopstack.serving.http.app import AppState, TraceIdFilter, build_app
from loopstack.serving.http.limits import Limits
from loopstack.serving.http.responses.store import StoreLimits, open_store
from loopstack.serving.http.service import ChatService
from loopstack.serving.metrics import Metrics
from loopstack.serving.prompt import BackgroundTokenizer, PromptBuilder
from loopstack.serving.selection.defaults import selection_defaults
from loopstack.serving.selection.rank import ToolRanker
from loopstack.serving.selection.requests import MultilingualEmbedder, ServerEmbedder

logger = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace_id=%(trace_id)s] %(message)s"


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(TraceIdFilter())
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per engine call: noise


@dataclass(frozen=True)
class ShutdownBudget:
    """How `LOOPSTACK_SHUTDOWN_GRACE_S` is shared out; all of it ends well before `grace_s`."""

    grace_s: float

    @property
    def requests_s(self) -> float:  # uvicorn: in-flight requests finish or are cancelled
        return 0.3 * self.grace_s

    @property
    def engine_s(self) -> float:  # the launcher: SIGTERM to the engine group, then SIGKILL
        return 0.3 * self.grace_s


def _engine_key(settings: ServerSettings) -> str | None:
    """External engine: LOOPSTACK_ENGINE_API_KEY, else the key a local loopstack left for it."""
    if settings.engine_api_key or not settings.engine_url:
        return settings.engine_api_key
    url = urlsplit(settings.engine_url)
    if url.hostname in ("127.0.0.1", "localhost") and url.port:
        return read_engine_key(settings.home / "run", url.port)
    return None


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def create_app(settings: ServerSettings) -> FastAPI:
    """Everything but the listening socket: model, engine command, services, router."""
    if settings.engine_url is None:  # refuse before loading anything
        ensure_port_free(settings.engine_port_resolved())
    hw = detect_hardware(settings.device)
    logger.info(
        "hardware: %s, %d CPUs, %.1f GiB, %d GPUs",
        hw.device,
        hw.cpu_count,
        hw.mem_gib,
        hw.gpu_count,
    )
    if hw.device == "cuda" and settings.engine_url is None:
        check_cuda_driver()  # before anything is loaded: a clear error, not vLLM's deep one
    model = resolve_model(settings.model, settings.home, default_for_device=default_model(hw))
    tokenizer = BackgroundTokenizer(functools.partial(_load_tokenizer, model.path_or_id))
    name = settings.served_model_name or model.name
    launch = vllm_launch(settings, hw, model.path_or_id, name)
    if hw.device == "cpu" and settings.engine_url is None:  # what the box's CPU means here
        dtype = cpu_dtype(settings.cpu_dtype, hw)
        for line in cpu_report(hw.cpu_flags, dtype, name, requested=settings.cpu_dtype).lines(name):
            logger.info("%s", line)
        logger.info("%s", cpu_layout(settings, hw).describe())
    engine = VLLMEngine(
        launch.argv,
        env=launch.env,
        port=settings.engine_port_resolved(),
        model_name=name,
        start_timeout_s=settings.engine_start_timeout_s,
        restart_timeout_s=settings.engine_restart_timeout_s,
        base_url=settings.engine_url,
        api_key=_engine_key(settings),
        drop_seed=hw.device == "cpu",
        stop_grace_s=ShutdownBudget(settings.shutdown_grace_s).engine_s,
        key_dir=settings.home / "run",
    )
    metrics = Metrics()
    prompts = PromptBuilder(tokenizer, max_model_len=launch.max_model_len)
    backend = backend_from_settings(
        settings,
        tokenizer_folder(model.path_or_id),  # its tokenizer.json: no transformers, no torch
        tokenizer=tokenizer.get,  # loaded before the first request (lifespan)
        metrics=metrics,
    )
    embeddings = EmbeddingService(settings.embedding_model)
    selection = selection_defaults(
        model.name,
        rank=settings.tool_rank,
        top_k=settings.tool_top_k,
        min_score=settings.tool_min_score,
        abstain=settings.tool_abstain,
        decide=settings.tool_decide,
        after_results=settings.tool_after_results,
    )
    logger.info("tool selection when a request does not say: %s", selection.describe())
    logger.info("%s", anthropic_names_note(name, settings.anthropic_model_names))
    state = AppState(
        engine=engine,
        chat=ChatService(
            engine,
            prompts,
            metrics=metrics,
            max_tool_tokens=settings.max_tool_tokens,
            backend=backend,
            ranker=ToolRanker(
                ServerEmbedder(embeddings),
                multilingual=MultilingualEmbedder() if MultilingualEmbedder.available() else None,
            ),
            selection=selection,
        ),
        embeddings=embeddings,
        metrics=metrics,
        admission=Admission(
            metrics,
            max_running=settings.max_concurrency,
            max_waiting=settings.max_queue,
            retry_after_s=settings.retry_after_s,
        ),
        model_name=name,
        model_aliases=parse_aliases(settings.model_aliases, name),
        anthropic_model_names=settings.anthropic_model_names,
        api_key=settings.api_key,
        max_model_len=launch.max_model_len,
        limits=unpack(Limits, settings),
    )

    responses = open_store(
        settings.responses_db,
        settings.home,
        StoreLimits(
            max_items=settings.responses_max_items,
            max_age_s=settings.responses_max_age_s,
            max_bytes=settings.responses_max_bytes,
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        starting = asyncio.create_task(engine.start())  # the tokenizer loads meanwhile
        backend.warm()  # the constraint sandbox's worker loads the vocabulary meanwhile too
        try:
            await asyncio.to_thread(tokenizer.get)
        except BaseException:
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            raise
        await starting
        logger.info("loopstack serving %s on http://%s:%d/v1", name, settings.host, settings.port)
        watchdog = asyncio.create_task(engine.supervise())
        try:
            yield
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await engine.stop()
            backend.close()
            responses.close()

    app = build_app(state, lifespan=lifespan)
    app.state.responses_store = responses  # loopstack.serving.http.responses.router
    return app


def arm_deadline(grace_s: float, on_deadline: Callable[[], None] | None = None) -> None:
    """End the process `grace_s` from now whatever the event loop is doing.

    A daemon thread calls `on_deadline` (kill the engine group) and `os._exit(1)`s; where a
    stuck main thread never lets that thread run (C code holding the GIL), SIGALRM at its
    default action ends the process two seconds later, and the launcher then stops the engine
    because its parent is gone."""

    def fire() -> None:
        time.sleep(grace_s)
        os.write(2, f"loopstack: not stopped after {grace_s:g} s: exiting now\n".encode())
        try:
            if on_deadline is not None:
                on_deadline()
        finally:
            os._exit(1)

    threading.Thread(target=fire, name="shutdown-deadline", daemon=True).start()
    if hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(math.ceil(grace_s) + 2)


class BoundedServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM/SIGINT also arms `arm_deadline`."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        grace_s: float,
        on_signal: Callable[[], None] | None = None,
        on_deadline: Callable[[], None] | None = None,
    ):
        super().__init__(config)
        self.grace_s = grace_s
        self._on_signal = on_signal
        self._on_deadline = on_deadline
        self._armed = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._armed:
            self._armed = True
            arm_deadline(self.grace_s, self._on_deadline)
            if self._on_signal is not None:
                self._on_signal()
        super().handle_exit(sig, frame)


def serve(settings: ServerSettings) -> None:
    configure_logging(settings.log_level)
    try:
        app = create_app(settings)
    except EnginePortInUse as exc:
        logger.error("cannot start: %s", exc)
        sys.exit(2)
    engine = app.state.loopstack.engine
    if not run_bounded(
        app,
        engine,
        settings.host,
        settings.port,
        settings.shutdown_grace_s,
        keep_alive_s=settings.keep_alive_s,
    ):
        sys.exit(3)  # startup failed (the engine did not come up); the log says why


def run_bounded(
    app: FastAPI, engine: Any, host: str, port: int, grace_s: float, *, keep_alive_s: int
) -> bool:
    """Serve `app` until a signal; the whole shutdown fits in `grace_s`. False: no startup.

    Idle connections stay open `keep_alive_s` (uvicorn's default, 5 s, equals the clients'
    own idle expiry: a request sent just as the server closes the connection is lost)."""
    budget = ShutdownBudget(grace_s)
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False,
        timeout_keep_alive=keep_alive_s,
        timeout_graceful_shutdown=max(1, math.floor(budget.requests_s)),
    )  # fmt: skip
    server = BoundedServer(
        config,
        grace_s=budget.grace_s,
        on_signal=getattr(engine, "begin_shutdown", None),
        on_deadline=getattr(engine, "kill_now", None),
    )
    server.run()
    return bool(server.started)
