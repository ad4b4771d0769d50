"""The optional model parts, through an OpenAI-compatible endpoint (off by default).

* ``rewrite_query`` - gate 1: turn a user message (+ task) into a short retrieval intent.
* ``distill`` - write-back: turn a finished turn into memories in the fixed JSON schema
  ``{text, type, source, confidence}``.

Both use the official ``openai`` ``AsyncOpenAI`` client with
``response_format={"type": "json_schema", ...}``; our server enforces the schema by
constrained decoding, so the reply parses every time. We still validate with pydantic,
because some decoders do not enforce numeric bounds (outlines_core ignores
``minimum``/``maximum``): an out-of-range confidence is clamped, anything else invalid is
dropped with a warning rather than stored.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from loopstack.memory.exceptions import ModelError, SchemaViolationError
from loopstack.memory.records import DistilledMemory, MemorySource, MemoryType, Turn

__all__ = ["DISTILL_SCHEMA", "REWRITE_SCHEMA", "ModelClient"]

logger = logging.getLogger(__name__)

DISTILL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memories": {
            "type": "array",
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "minLength": 1, "maxLength": 500},
                    "type": {"type": "string", "enum": [t.value for t in MemoryType]},
                    "source": {"type": "string", "enum": [s.value for s in MemorySource]},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["text", "type", "source", "confidence"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["memories"],
    "additionalProperties": False,
}

REWRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 300}},
    "required": ["query"],
    "additionalProperties": False,
}

_DISTILL_SYSTEM = (
    "You extract long-term memories about the user from one conversation turn. "
    "Keep only durable facts, preferences, decisions, procedures or notable episodes that "
    "would help in a future conversation. Write each as one short third-person sentence. "
    "source: user_explicit if the user stated it, task for a task result, tool for a tool "
    "result, inferred if you concluded it. Never include secrets (passwords, card numbers, "
    "keys). Return an empty list when nothing is worth keeping."
)
_REWRITE_SYSTEM = (
    "Rewrite the user's message into a short search query for the user's long-term memory: "
    "the facts about the user that would help answer it. Keep names and key nouns."
)


class ModelClient:
    """Query rewrite and distillation against ``base_url`` (an OpenAI-compatible server)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "loopstack-default",
        api_key: str = "not-needed",
        timeout_s: float = 20.0,
        http_client: Any = None,
    ) -> None:
        from openai import AsyncOpenAI

        self.model = model
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout_s,
            max_retries=1,
            http_client=http_client,
        )

    async def close(self) -> None:
        await self._client.close()

    async def _json(
        self, name: str, schema: dict[str, Any], messages: list[dict[str, str]], max_tokens: int
    ) -> dict[str, Any]:
        try:
            create: Any = self._client.chat.completions.create
            resp = await create(
                model=self.model,
                messages=messages,
                temperature=0.0,
                max_tokens=max_tokens,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": name, "schema": schema, "strict": True},
                },
            )
        except Exception as exc:
            raise ModelError(f"model endpoint failed: {exc}") from exc
        content = resp.choices[0].message.content if resp.choices else None
        if not content:
            raise SchemaViolationError("model returned no content")
        try:
            data = json.loads(content)
        except json.JSONDecodeError as exc:
            raise SchemaViolationError(f"model returned invalid JSON: {content[:200]!r}") from exc
        if not isinstance(data, dict):
            raise SchemaViolationError("model returned JSON that is not an object")
        return data

    async def rewrite_query(self, message: str, task: str | None = None) -> str:
        """A retrieval intent for ``message``; falls back to the message on bad output."""
        user = message if not task else f"Task: {task}\nMessage: {message}"
        data = await self._json(
            "memory_query",
            REWRITE_SCHEMA,
            [{"role": "system", "content": _REWRITE_SYSTEM}, {"role": "user", "content": user}],
            max_tokens=96,
        )
        query = data.get("query")
        if not isinstance(query, str) or not query.strip():
            raise SchemaViolationError("rewrite without a query string")
        return query.strip()[:300]

    async def distill(self, turn: Turn) -> list[DistilledMemory]:
        """Memories worth keeping from ``turn`` (texts must already be redacted)."""
        parts = [f"User: {turn.user_message}"]
        if turn.assistant_message:
            parts.append(f"Assistant: {turn.assistant_message}")
        if turn.task_conclusion:
            parts.append(f"Task conclusion: {turn.task_conclusion}")
        data = await self._json(
            "memories",
            DISTILL_SCHEMA,
            [
                {"role": "system", "content": _DISTILL_SYSTEM},
                {"role": "user", "content": "\n".join(parts)},
            ],
            max_tokens=512,
        )
        items = data.get("memories")
        if not isinstance(items, list):
            raise SchemaViolationError("distillation without a 'memories' list")
        out: list[DistilledMemory] = []
        for item in items[:8]:
            if isinstance(item, dict) and isinstance(item.get("confidence"), int | float):
                item = {**item, "confidence": min(1.0, max(0.0, float(item["confidence"])))}
            try:
                out.append(DistilledMemory.model_validate(item))
            except ValidationError as exc:
                logger.warning("dropping a distilled memory that breaks the schema: %s", exc)
        return out
