"""The ``outlines`` constraint backend: today's regexes, one call in two engine requests.

vLLM's outlines backend enforces regexes (no structural tags), indexing every automaton state
against the whole vocabulary when it first meets a regex (~3 ms per state here), so
`serving.constraint` builds compact regexes from outlines_core and `serving.schema_cache`
measures their automata first. A call is generated in two stages so that each automaton is the
size of one schema: the head (which tool), then that tool's arguments; ``auto`` watches free
text (`serving.toolcalls.IntentDetector`) and regenerates a call under the regexes once one
starts. The stages themselves live in `serving.chat` (`ChatService._call_rounds`).
"""

from __future__ import annotations

from typing import Any

from serving.constraint_backend import BackendName, TurnSpec


class OutlinesBackend:
    name: BackendName = "outlines"
    single_request = False

    def exact(self, schema: Any) -> bool:  # decided per schema by `serving.constraint`
        return False

    async def admit(self, spec: TurnSpec, *, what: str) -> dict[str, Any]:
        raise NotImplementedError("the outlines path builds its regexes in serving.chat")

    def warm(self) -> None:
        return None

    def close(self) -> None:
        return None
