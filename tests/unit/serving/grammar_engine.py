"""A fake engine whose transport SAMPLES under the request's grammar, as vLLM does.

`SamplingEngine.send` answers ``/v1/completions`` (streamed) like vLLM's OpenAI server, but
its text is not replayed from a script: it is generated one token at a time over a
byte-level vocabulary (256 bytes and an end-of-sequence token), and under a request's
``structured_outputs.grammar`` (an llguidance Lark grammar, what the ``guidance`` backend
sends) every token is drawn from the grammar's allowed set (llguidance's token mask), as a
structured-output engine does. The "model" is a seeded random sampler nudged towards an
intended text (`want`): it writes the intended byte when the grammar allows it, otherwise a
random allowed one (closers and the end favoured, so turns end). Given an intended text the
grammar forbids (a wrong tool name, a wrong type), the output must still be a valid turn -
which is what a test of the grammar can check, and what fails if the constraint is lost or
wrong (`grammar_free=True` samples without it, the negative control).
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import llguidance

from loopstack.serving.constraint.guidance import _ByteTokenizer

EOS = _ByteTokenizer.eos_token_id
_CLOSERS = {ord(c) for c in '"}],\n'}


class SamplingEngine:
    """An engine (lifecycle no-ops) that is its own transport and samples under grammars."""

    model_name = "engine-internal-name"

    def __init__(self, *, seed: int = 0, grammar_free: bool = False) -> None:
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))
        self.rng = random.Random(seed)
        self.grammar_free = grammar_free
        self.want = ""  # the text the "model" would write if nothing constrained it
        self.requests: list[dict[str, Any]] = []
        self.texts: list[str] = []  # what was generated, request by request

    @property
    def transport(self) -> SamplingEngine:
        return self

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def healthy(self) -> bool:
        return True

    async def metrics_text(self) -> str:
        return ""

    async def send(self, path: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        assert path == "/v1/completions" and body.get("stream"), (path, body)
        self.requests.append(body)
        grammar = (body.get("structured_outputs") or {}).get("grammar")
        text, finish = self.sample(None if self.grammar_free else grammar, body["max_tokens"])
        self.texts.append(text)
        for i in range(0, len(text), 4):
            choice = {"index": 0, "text": text[i : i + 4], "finish_reason": None}
            yield _sse({"choices": [choice]})
        yield _sse({"choices": [{"index": 0, "text": "", "finish_reason": finish}]})
        usage = {"prompt_tokens": 10, "completion_tokens": len(text.encode())}
        yield _sse({"choices": [], "usage": usage})
        yield b"data: [DONE]"

    def sample(self, grammar: str | None, max_tokens: int) -> tuple[str, str]:
        """(text, finish reason): tokens drawn from what `grammar` allows (all without)."""
        matcher = None
        if grammar is not None:
            matcher = llguidance.LLMatcher(
                self.tokenizer, llguidance.grammar_from("grammar", grammar)
            )
            assert not matcher.is_error(), matcher.get_error()
        want = self.want.encode()
        out = bytearray()
        for _ in range(max_tokens):
            allowed = self._allowed(matcher)
            if not allowed:  # the grammar is done: the engine stops
                return out.decode(errors="replace"), "stop"
            token = self._pick(allowed, want[len(out)] if len(out) < len(want) else None)
            if token == EOS:
                return out.decode(errors="replace"), "stop"
            if matcher is not None:
                assert matcher.consume_token(token), matcher.get_error()
            out.append(token)
        return out.decode(errors="replace"), "length"

    def _allowed(self, matcher: llguidance.LLMatcher | None) -> list[int]:
        if matcher is None:
            return list(range(EOS + 1))
        if matcher.is_stopped():
            return []
        # the byte vocabulary's end token is not special to llguidance (its bytes read as
        # text): the end is allowed where the grammar accepts, bytes where its mask says
        mask = matcher.compute_bitmask()
        allowed = [t for t in range(EOS) if mask[t // 8] >> (t % 8) & 1]
        return [*allowed, EOS] if matcher.is_accepting() else allowed

    def _pick(self, allowed: list[int], intended: int | None) -> int:
        if intended is not None and intended in allowed:
            return intended
        if intended is None and EOS in allowed:
            return EOS  # the intended text is written: end where the grammar lets us
        weights = [40 if t in _CLOSERS or t == EOS else 1 for t in allowed]
        return self.rng.choices(allowed, weights)[0]


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode()
