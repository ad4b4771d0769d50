"""Building the configured constraint backend, complete: the one place that knows the
backend classes.

`make_backend` builds the backend `LOOPSTACK_CONSTRAINT_BACKEND` names with its sandbox
(`loopstack.serving.constraint.sandbox.CompilePool`) and its verdict cache
(`loopstack.serving.constraint.schemas.SchemaCache`); `backend_from_settings` reads those from the
server's settings (`loopstack.serving.server` calls it). Nothing else in serving names a backend
class: the chat service holds a `ConstraintBackend` and asks it for everything.

* ``guidance`` / ``xgrammar``: one sandbox worker that loads the model's vocabulary from its
  ``tokenizer.json`` (no transformers, no torch for guidance) and compiles each payload;
  guidance also gets the token ids of Qwen's ``<tool_call>`` tags, read from the server's
  tokenizer once it is loaded (`tags`).
* ``outlines``: two sandbox workers, shared by the regex compiler and the automaton probe
  (no probe in thread mode: a thread cannot be stopped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from loopstack.serving.config import DEFAULT_BACKEND, BackendName, ServerSettings, unpack
from loopstack.serving.constraint import guidance, xgrammar
from loopstack.serving.constraint.backend import ConstraintBackend
from loopstack.serving.constraint.guidance import GuidanceBackend, special_tag_ids
from loopstack.serving.constraint.outlines import OutlinesBackend
from loopstack.serving.constraint.regexes import (
    DEFAULT_MAX_STATES,
    AutomatonProbe,
    RegexSchemas,
    SchemaCompiler,
)
from loopstack.serving.constraint.sandbox import STARTUP_S, CompilePool, PoolMode
from loopstack.serving.constraint.schema_limits import SETTINGS as SCHEMA_SETTINGS
from loopstack.serving.constraint.schema_limits import SchemaLimits
from loopstack.serving.constraint.schemas import SchemaCache
from loopstack.serving.constraint.validation import DEFAULT_DEADLINE_S
from loopstack.serving.constraint.xgrammar import XGrammarBackend
from loopstack.serving.metrics import Metrics

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_BACKEND", "backend_from_settings", "make_backend"]


def make_backend(
    name: BackendName = DEFAULT_BACKEND,
    tokenizer_path: str | None = None,
    *,
    mode: PoolMode = "process",
    timeout_s: float = 10.0,
    tags: Callable[[], dict[str, int] | None] | None = None,
    metrics: Metrics | None = None,
    limits: SchemaLimits | None = None,
    validation_deadline_s: float = DEFAULT_DEADLINE_S,
    max_states: int = DEFAULT_MAX_STATES,
    probe_timeout_s: float = 5.0,
) -> ConstraintBackend:
    """The backend `name`, complete. `tokenizer_path`: the model's folder (None: a byte-level
    vocabulary, for tests); `mode`: sandbox processes (the server) or threads (unit tests);
    `timeout_s`: the deadline of one compile."""
    schemas = SchemaCache(metrics, limits=limits, validation_deadline_s=validation_deadline_s)
    if name == "outlines":
        pool = CompilePool(name="outlines regex", slots=2, mode=mode)
        compiler = SchemaCompiler(
            pool=pool, timeout_s=timeout_s, limits=schemas.limits,
            validation_deadline_s=validation_deadline_s,
        )  # fmt: skip
        # an automaton can take minutes: measured only where a worker can be killed (threads,
        # for unit tests: none)
        probe = None
        if mode == "process":
            probe = AutomatonProbe(max_states=max_states, timeout_s=probe_timeout_s, pool=pool)
        return OutlinesBackend(RegexSchemas(schemas, probe=probe, compiler=compiler))
    module: Any = xgrammar if name == "xgrammar" else guidance
    pool = CompilePool(
        name=f"{name} grammar", setup=module.make_checker, setup_args=(tokenizer_path,),
        mode=mode, startup_s=STARTUP_S,
    )  # fmt: skip
    if name == "xgrammar":
        return XGrammarBackend(pool, schemas=schemas, timeout_s=timeout_s)
    return GuidanceBackend(pool, schemas=schemas, timeout_s=timeout_s, tags=tags)


def backend_from_settings(
    settings: ServerSettings,
    tokenizer_path: str | None,
    *,
    tokenizer: Callable[[], Any] | None = None,
    metrics: Metrics | None = None,
) -> ConstraintBackend:
    """The server's backend, from `LOOPSTACK_*` settings. `tokenizer`: returns the server's
    tokenizer once loaded (guidance reads the tags' token ids from it on its first grammar,
    after the server has started)."""

    def tags() -> dict[str, int] | None:
        return special_tag_ids(tokenizer()) if tokenizer is not None else None

    return make_backend(
        settings.constraint_backend,
        tokenizer_path,
        mode=settings.schema_compile_mode,
        timeout_s=settings.schema_compile_timeout_s,
        tags=tags,
        metrics=metrics,
        limits=unpack(SchemaLimits, settings, **SCHEMA_SETTINGS),
        validation_deadline_s=settings.validation_deadline_s,
        max_states=settings.max_schema_states,
        probe_timeout_s=settings.constraint_probe_timeout_s,
    )
