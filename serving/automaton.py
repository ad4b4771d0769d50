"""Measure the automaton a constraint makes before vLLM has to build it.

vLLM's outlines backend turns each regex into a DFA and walks every DFA state against the
whole vocabulary (151k tokens for Qwen): about 3 ms per state on one core of the project's
machine, and a pathological regex can take minutes and many GiB - in vLLM's engine
process, on a thread that outlives its timeout. The length of the regex says little about
this (a 1,600-character pattern never finished; a 68,000-character schema has 5,100
states), so `AutomatonProbe` builds the same DFA with outlines_core against a vocabulary
of the 256 single bytes (under 0.3 s for every corpus schema; the state count equals what
vLLM walks with Qwen's vocabulary), in a child process with a memory and CPU limit, and
refuses the schema (400 ``schema_too_complex``) when it has more than ``max_states``
states, dies or times out.

Run as ``python -m serving.automaton``: reads a regex on stdin, prints its state count.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import sys

from serving.exceptions import InvalidRequest

log = logging.getLogger(__name__)

# vLLM spends ~3 ms a state against Qwen's 151k-token vocabulary on one core of the
# project's machine: 12k states ~ 36 s, within its 60 s compile timeout. The largest of the
# 415 corpus schemas has 8,360.
DEFAULT_MAX_STATES = 12_000
_CHILD_MEMORY = 2 << 30
_CHILD_CPU_S = 30


class AutomatonProbe:
    """Counts a regex's automaton states in a sandboxed child process."""

    def __init__(
        self,
        *,
        max_states: int = DEFAULT_MAX_STATES,
        timeout_s: float = 20.0,
        concurrency: int = 2,
    ):
        self.max_states = max_states
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(concurrency)

    async def check(
        self, regex: str, *, what: str = "schema", max_states: int | None = None
    ) -> int:
        """The number of states; raises InvalidRequest(schema_too_complex) past the limit
        (`max_states`, default the probe's)."""
        limit = self.max_states if max_states is None else min(max_states, self.max_states)
        async with self._slots:
            states = await self._count(regex)
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

    async def _count(self, regex: str) -> int | None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "serving.automaton",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(regex.encode()), timeout=self.timeout_s
            )
        except TimeoutError:
            log.warning("automaton probe timed out after %.0f s", self.timeout_s)
            return None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            log.warning("automaton probe failed (%s): %s", proc.returncode, err.decode()[-300:])
            return None
        return int(out.decode().strip())


def count_states(regex: str) -> int:
    """States of the DFA outlines_core builds for `regex`, over the 256 single bytes."""
    import outlines_core

    # Every single byte is a token (as in byte-level BPE vocabularies): all paths are walked.
    vocab = outlines_core.Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)})
    return len(outlines_core.Index(regex, vocab).get_transitions())


def main() -> None:
    for limit, value in ((resource.RLIMIT_AS, _CHILD_MEMORY), (resource.RLIMIT_CPU, _CHILD_CPU_S)):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):  # e.g. RLIMIT_AS on macOS: the parent's timeout remains
            log.debug("could not set rlimit %s", limit)
    print(count_states(sys.stdin.buffer.read().decode("utf-8")))


if __name__ == "__main__":
    main()
