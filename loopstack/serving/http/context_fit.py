"""``max_tokens`` lowered to what the context leaves, on every API, and said in the answer.

Clients ask for more than a small context can give: Claude Code sends ``max_tokens: 32000``
with a ~19k-token prompt, agents ask for the model's whole context. vLLM lowers such a limit;
loopstack used to refuse it (400). Now the prompt is counted with the served model's own
tokenizer and chat template (`loopstack.serving.prompt.PromptBuilder`, the one the tool path renders
with) and a limit beyond ``max_model_len - prompt`` is lowered to it; the answer carries
`CLAMP_HEADER` (``asked->given``). A prompt that leaves no room at all is still a 400
(``context_length_exceeded``): nothing can be generated.

Counting costs a render and a tokenization, so it is done only where it can matter: the
rendered prompt's UTF-8 length bounds its token count from above (every token of a
byte-level BPE covers at least one byte), and a limit that fits under that bound is left as
it is without tokenizing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from loopstack.serving.exceptions import InvalidRequest
from loopstack.serving.http.service import ChatService
from loopstack.serving.prompt import PromptBuilder
from loopstack.serving.protocol import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger(__name__)
__all__ = ["CLAMP_HEADER", "Fit", "clamped", "fit_chat", "fit_completion"]

CLAMP_HEADER = "x-loopstack-max-tokens-clamped"
#: Tokens left free when the engine renders the prompt itself (a request passed through): its
#: render may differ from ours by a few dozen tokens (Claude Code's background request: 679
#: counted here, 728 by vLLM, and the lowered limit overflowed by 49).
ENGINE_RENDER_MARGIN = 64


@dataclass(frozen=True)
class Fit:
    request: ChatCompletionRequest
    prompt_tokens: int | None  # None: not counted (it could not matter)
    asked: int | None = None  # the limit asked for, when it was lowered
    given: int | None = None  # what it was lowered to


def clamped(asked: int | None, given: int | None) -> dict[str, str]:
    """The response header that tells the client its limit was lowered (none if it was not):
    part of what a front-end returns with its answer."""
    if asked is not None and given is not None:
        return {CLAMP_HEADER: f"{asked}->{given}"}
    return {}


def _no_room(n: int, max_model_len: int) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {max_model_len} tokens, and the prompt "
        f"alone is {n} tokens: no room is left to generate. Please shorten the messages.",
        param="messages",
        code="context_length_exceeded",
    )


def _render(prompts: PromptBuilder, req: ChatCompletionRequest) -> str:
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []] or None
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    return prompts.render(messages, tools)


async def fit_chat(
    req: ChatCompletionRequest,
    chat: ChatService,
    max_model_len: int | None,
    *,
    count: bool = False,
) -> Fit:
    """`req` with its completion limit lowered to what the context leaves. `count`: always
    count the prompt (the Messages API reports it in ``message_start``)."""
    limit = req.completion_limit
    tool_path = req.effective_tool_choice() != "none"
    wanted = limit if limit is not None else (chat.max_tool_tokens if tool_path else None)
    if not count and (wanted is None or max_model_len is None):
        return Fit(req, None)
    try:
        prompt = await asyncio.to_thread(_render, chat.prompts, req)
    except InvalidRequest:
        if tool_path or count:
            raise
        return Fit(req, None)  # a shape only the engine renders (images): it judges
    margin = 0 if tool_path else ENGINE_RENDER_MARGIN  # the engine renders it: a few more
    if not count and max_model_len is not None and wanted is not None:
        if len(prompt.encode("utf-8")) + 1 + wanted + margin <= max_model_len:
            return Fit(req, None)
    n = await asyncio.to_thread(chat.prompts.count_tokens, prompt)
    if max_model_len is None or wanted is None or n + wanted + margin <= max_model_len:
        return Fit(req, n)
    room = max_model_len - n - margin
    if room < 1:
        raise _no_room(n, max_model_len)
    lowered = req.model_copy(update={"max_tokens": room, "max_completion_tokens": None})
    logger.info("max_tokens %d lowered to %d (prompt %d of %d)", wanted, room, n, max_model_len)
    if limit is None:  # our own default for tool calls: lowered without a word
        return Fit(lowered, n)
    return Fit(lowered, n, asked=limit, given=room)


def fit_completion(
    req: CompletionRequest, prompts: PromptBuilder, max_model_len: int | None
) -> tuple[CompletionRequest, int | None]:
    """A /v1/completions request with ``max_tokens`` lowered to what its longest prompt
    leaves, and the limit asked for when it was lowered (else None)."""
    limit = req.max_tokens
    if limit is None or max_model_len is None:
        return req, None
    raw: Any = req.prompt
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
        raw = [raw]
    longest = 0
    for prompt in raw:
        if isinstance(prompt, str):
            bound = len(prompt.encode("utf-8")) + 1
            n = bound if bound + limit <= max_model_len else prompts.count_tokens(prompt)
        else:
            n = len(prompt)
        longest = max(longest, n)
    if longest + limit <= max_model_len:
        return req, None
    room = max_model_len - longest
    if room < 1:
        raise _no_room(longest, max_model_len)
    return req.model_copy(update={"max_tokens": room}), limit
