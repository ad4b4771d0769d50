"""`loopstack serve`: resolve the model, start vLLM, put our layer in front, serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from serving.admission import Admission
from serving.api import AppState, TraceIdFilter, build_app
from serving.automaton import AutomatonProbe
from serving.chat import ChatService
from serving.compile_worker import SchemaCompiler
from serving.config import ServerSettings
from serving.embeddings import EmbeddingService
from serving.engine import VLLMEngine
from serving.hardware import default_model, detect_hardware, vllm_launch
from serving.limits import Limits
from serving.metrics import Metrics
from serving.model_store import resolve_model
from serving.prompt import PromptBuilder
from serving.schema_cache import SchemaCache
from serving.schema_limits import SchemaLimits

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


def create_app(settings: ServerSettings) -> FastAPI:
    """Everything but the listening socket: model, engine command, services, router."""
    hw = detect_hardware(settings.device)
    logger.info("hardware: %s", hw)
    model = resolve_model(settings.model, settings.home, default_for_device=default_model(hw))
    name = settings.served_model_name or model.name
    launch = vllm_launch(settings, hw, model.path_or_id, name)
    engine = VLLMEngine(
        launch.argv,
        env=launch.env,
        port=settings.engine_port_resolved(),
        model_name=name,
        start_timeout_s=settings.engine_start_timeout_s,
        base_url=settings.engine_url,
        drop_seed=hw.device == "cpu",
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model.path_or_id)
    metrics = Metrics()
    prompts = PromptBuilder(tokenizer, max_model_len=launch.max_model_len)
    state = AppState(
        engine=engine,
        chat=ChatService(
            engine,
            prompts,
            schemas=SchemaCache(
                metrics,
                probe=AutomatonProbe(
                    max_states=settings.max_schema_states,
                    timeout_s=settings.constraint_probe_timeout_s,
                ),
                compiler=SchemaCompiler(
                    mode=settings.schema_compile_mode,
                    timeout_s=settings.schema_compile_timeout_s,
                    validation_deadline_s=settings.validation_deadline_s,
                    limits=SchemaLimits(
                        max_depth=settings.max_schema_depth,
                        max_nodes=settings.max_schema_nodes,
                        max_ref_chain=settings.max_schema_ref_chain,
                    ),
                ),
            ),
            metrics=metrics,
            max_tool_tokens=settings.max_tool_tokens,
        ),
        embeddings=EmbeddingService(settings.embedding_model),
        metrics=metrics,
        admission=Admission(
            metrics,
            max_running=settings.max_concurrency,
            max_waiting=settings.max_queue,
            retry_after_s=settings.retry_after_s,
        ),
        model_name=name,
        api_key=settings.api_key,
        max_model_len=launch.max_model_len,
        limits=Limits(
            max_request_bytes=settings.max_request_bytes,
            max_messages=settings.max_messages,
            max_tools=settings.max_tools,
            max_stop=settings.max_stop,
            max_prompts=settings.max_prompts,
            max_embedding_inputs=settings.max_embedding_inputs,
            max_embedding_input_chars=settings.max_embedding_input_chars,
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        await engine.start()
        logger.info("loopstack serving %s on http://%s:%d/v1", name, settings.host, settings.port)
        watchdog = asyncio.create_task(engine.supervise())
        try:
            yield
        finally:
            watchdog.cancel()
            await engine.stop()

    return build_app(state, lifespan=lifespan)


def serve(settings: ServerSettings) -> None:
    configure_logging(settings.log_level)
    app = create_app(settings)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_config=None, access_log=False,
        timeout_graceful_shutdown=5,
    )  # fmt: skip
