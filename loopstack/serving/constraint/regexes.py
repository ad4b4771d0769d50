"""The outlines backend's regex pipeline: a schema's regex and its automaton, measured in the
sandbox before vLLM has to build them.

vLLM's outlines backend turns each regex into a DFA and walks every DFA state against the
whole vocabulary (151k tokens for Qwen): about 3 ms per state on one core of the project's
machine, and a pathological regex can take minutes and many GiB - in vLLM's engine process,
on a thread that outlives its timeout. The length of a regex says little about this (a
1,600-character pattern never finished; a 68,000-character schema has 5,100 states). So,
in the one sandbox (`loopstack.serving.constraint.sandbox.CompilePool`):

* `SchemaCompiler` builds a schema's regex (`schema_regex.compile_schema`: outlines_core,
  whose regex for nested objects can grow without bound - a 5 KB schema once made it
  allocate gigabytes and abort the whole process);
* `AutomatonProbe` builds the same DFA with outlines_core against a vocabulary of the 256
  single bytes (under 0.3 s for every corpus schema; the state count equals what vLLM walks
  with Qwen's vocabulary) and refuses (400 ``schema_too_complex``) past ``max_states``;
* `RegexSchemas` puts them together - the most exact regex whose automaton the probe
  accepts, a client's own regex measured the same way - with verdicts in the one
  `SchemaCache`.

Only the outlines backend (`loopstack.serving.constraint.outlines`) uses any of this.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from loopstack.serving.constraint.patterns import require_regex_text
from loopstack.serving.constraint.sandbox import CompilePool, PoolMode
from loopstack.serving.constraint.schema_limits import SchemaLimits, check_schema_limits
from loopstack.serving.constraint.schema_regex import COUNTED_LIMITS, compile_schema
from loopstack.serving.constraint.schemas import CompiledSchema, SchemaCache, schema_key
from loopstack.serving.constraint.validation import DEFAULT_DEADLINE_S, SafeValidator
from loopstack.serving.exceptions import InvalidRequest

logger = logging.getLogger(__name__)

# vLLM spends ~3 ms a state against Qwen's 151k-token vocabulary on one core of the
# project's machine: 12k states ~ 36 s, within its 60 s compile timeout. The largest of the
# 415 corpus schemas has 8,360.
DEFAULT_MAX_STATES = 12_000
# Exactness is not worth any compile time: past this many states (~12 s of vLLM compilation
# on one core of the project's machine) the cheaper, validated form is used.
PREFERRED_STATES = 4_000


# --------------------------------------------------------------------------- sandbox jobs
def _compile_job(
    state: Any, schema: Any, what: str, max_counted: int, limits: SchemaLimits
) -> tuple[Any, ...]:
    """("ok", regex, exact) or ("error", message, param, code): what crosses the boundary."""
    try:
        c = compile_schema(schema, what=what, max_counted=max_counted, limits=limits)
    except InvalidRequest as exc:
        return ("error", exc.message, exc.param, exc.code)
    except (MemoryError, RecursionError) as exc:
        return ("error", f"{what} is too complex to enforce ({type(exc).__name__})", what,
                "schema_too_complex")  # fmt: skip
    return ("ok", c.regex, c.exact)


def count_states(regex: str) -> int:
    """States of the DFA outlines_core builds for `regex`, over the 256 single bytes."""
    import outlines_core

    # Every single byte is a token (as in byte-level BPE vocabularies): all paths are walked.
    vocab = outlines_core.Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)})
    return len(outlines_core.Index(regex, vocab).get_transitions())


def _count_job(state: Any, regex: str) -> int | None:
    try:
        return count_states(regex)
    except Exception as exc:  # outlines_core refuses what vLLM's engine cannot build either
        logger.warning("automaton probe failed: %s", str(exc)[:300])
        return None


# --------------------------------------------------------------------------- the pieces
class SchemaCompiler:
    """Runs `compile_schema` in the sandbox under a deadline."""

    def __init__(
        self,
        *,
        pool: CompilePool | None = None,
        mode: PoolMode = "thread",
        timeout_s: float = 10.0,
        concurrency: int = 2,
        limits: SchemaLimits | None = None,
        validation_deadline_s: float = DEFAULT_DEADLINE_S,
    ):
        self.pool = pool or CompilePool(name="schema compile", slots=concurrency, mode=mode)
        self.timeout_s = timeout_s
        self.limits = limits or SchemaLimits()
        self.validation_deadline_s = validation_deadline_s

    async def compile(
        self, schema: Any, *, what: str = "schema", max_counted: int
    ) -> CompiledSchema:
        result = await self.pool.run(
            _compile_job, schema, what, max_counted, self.limits, what=what,
            timeout_s=self.timeout_s,
        )  # fmt: skip
        if result[0] == "error":
            raise InvalidRequest(result[1], param=result[2], code=result[3])
        validator = SafeValidator(schema, deadline_s=self.validation_deadline_s)
        return CompiledSchema(schema, result[1], result[2], validator)

    def close(self) -> None:
        self.pool.close()


class AutomatonProbe:
    """Counts a regex's automaton states in the sandbox (a worker process by default)."""

    def __init__(
        self,
        *,
        max_states: int = DEFAULT_MAX_STATES,
        timeout_s: float = 20.0,
        concurrency: int = 2,
        pool: CompilePool | None = None,
    ):
        self.max_states = max_states
        self.timeout_s = timeout_s
        self.pool = pool or CompilePool(name="automaton probe", slots=concurrency)

    async def check(
        self, regex: str, *, what: str = "schema", max_states: int | None = None
    ) -> int:
        """The number of states; raises InvalidRequest(schema_too_complex) past the limit
        (`max_states`, default the probe's)."""
        limit = self.max_states if max_states is None else min(max_states, self.max_states)
        try:
            states = await self.pool.run(_count_job, regex, what=what, timeout_s=self.timeout_s)
        except InvalidRequest:  # past the deadline, or the worker died
            logger.warning("automaton probe overran %.0f s or died", self.timeout_s)
            states = None
        if states is None or states > limit:
            found = (
                "could not be built within the probe's time and memory limits"
                if states is None
                else f"has {states:,} states (limit {limit:,})"
            )
            raise InvalidRequest(
                f"{what} is too complex to enforce: its constraint automaton {found}; vLLM "
                "would spend minutes compiling it. Simplify string patterns, flatten nested "
                "objects or split the tool.",
                param=what,
                code="schema_too_complex",
            )
        return states

    def close(self) -> None:
        self.pool.close()


class RegexSchemas:
    """A schema's regex (the most exact one the probe accepts) and a client's own regex,
    measured; every verdict kept in the one `SchemaCache`, refusals included."""

    def __init__(
        self,
        cache: SchemaCache | None = None,
        *,
        probe: AutomatonProbe | None = None,
        compiler: SchemaCompiler | None = None,
    ):
        self.compiler = compiler or SchemaCompiler()
        self.cache = cache or SchemaCache(
            limits=self.compiler.limits, validation_deadline_s=self.compiler.validation_deadline_s
        )
        self.probe = probe

    async def get(self, schema: Any, *, what: str = "schema") -> CompiledSchema:
        # Size, depth and satisfiability first: cheap, iterative, before json.dumps recurses.
        check_schema_limits(schema, what=what, limits=self.cache.limits)
        key = "regex-of:" + schema_key(schema)
        return await self.cache.verdict(key, what, lambda: self._compile(schema, what), timed=True)

    async def _compile(self, schema: Any, what: str) -> CompiledSchema:
        """The most exact regex the probe accepts: counted repetition up to 64 (so that
        ``[0-9a-f]{32}`` stays exact) if that keeps the automaton under `PREFERRED_STATES`,
        else up to 16 (the rest is checked after generation) under the probe's limit."""
        refusal = None
        for i, limit in enumerate(COUNTED_LIMITS):
            last = i == len(COUNTED_LIMITS) - 1
            compiled = await self.compiler.compile(schema, what=what, max_counted=limit)
            if self.probe is None:
                return compiled
            try:
                cap = None if last else PREFERRED_STATES
                await self.probe.check(compiled.regex, what=what, max_states=cap)
                return compiled
            except InvalidRequest as exc:
                refusal = exc
        assert refusal is not None
        raise refusal

    async def check_regex(self, regex: str, *, what: str) -> int:
        """Admit a client's own regex constraint as a schema's is admitted: bounded text,
        parsed, then its automaton measured by the probe. Returns its state count (0 when
        there is no probe); raises InvalidRequest (400). Verdicts are cached."""
        regex = require_regex_text(regex, what)
        return await self.cache.verdict("regex:" + regex, what, lambda: self._measure(regex, what))

    async def _measure(self, regex: str, what: str) -> int:
        try:  # vLLM parses it with Python's `re` first (linear in the text; off the loop)
            await asyncio.to_thread(re.compile, regex)
        except (re.error, RecursionError, OverflowError, ValueError) as exc:
            raise InvalidRequest(f"{what} is not a valid regex: {exc}", param=what) from exc
        if self.probe is None:
            return 0
        return await self.probe.check(regex, what=what)

    def close(self) -> None:
        self.compiler.close()
        if self.probe is not None and self.probe.pool is not self.compiler.pool:
            self.probe.close()
