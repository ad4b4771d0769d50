"""A generation whose client went away is cancelled: `with_cancellation` around a handler.

The shape is vLLM's OpenAI server: ``vllm/entrypoints/utils.py`` has ``with_cancellation``,
which runs the handler as a task and races it against ``listen_for_disconnect`` (the ASGI
receive channel's ``http.disconnect``), cancelling the handler when the client leaves first.
Ours differs in three details: the cancelled handler is awaited, so its admission slot and
engine request are gone before the 499 is returned; context variables the handler set (the
session key) stay visible to the streamed body that is read after it returns; an abort is
counted.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

from fastapi import Request
from fastapi.responses import Response

from loopstack.serving.http.state import app_state

logger = logging.getLogger(__name__)

__all__ = ["CLIENT_CLOSED_REQUEST", "listen_for_disconnect", "with_cancellation"]

#: What a generation whose client went away answers (nginx's "client closed request"; nobody
#: reads it, but the access log and the request metrics show it).
CLIENT_CLOSED_REQUEST = 499


async def listen_for_disconnect(request: Request) -> None:
    """Returns once the client has gone (the ASGI ``http.disconnect`` message).

    Reads the receive channel, so only for handlers whose body is already read (FastAPI
    parses it into the request model before calling the handler)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


_P = ParamSpec("_P")
_UNSET = object()


def with_cancellation(
    handler: Callable[_P, Coroutine[Any, Any, Response]],
) -> Callable[_P, Coroutine[Any, Any, Response]]:
    """Cancel the handler (and with it the engine request it awaits) when the client goes away.

    The handler runs in its own task, raced against `listen_for_disconnect`; whichever ends
    first decides. On a disconnect the handler's task is cancelled and awaited (its admission
    slot is released, its engine request closed, so vLLM aborts the generation), the abort is
    counted and the answer is a 499. Otherwise the handler's answer (or its error) is
    returned, with the context variables it set copied back here, so a streamed body - read
    after the handler returns - sees them as if the handler had run inline. Once a
    `StreamingResponse` is returned, watching the client is the response's job.

    The handler must take the `Request` as the keyword argument ``request`` (FastAPI passes
    every parameter by name)."""

    @functools.wraps(handler)  # FastAPI reads the handler's signature through __wrapped__
    async def cancellable(*args: _P.args, **kwargs: _P.kwargs) -> Response:
        request = kwargs.get("request")
        if not isinstance(request, Request):
            raise TypeError(f"{handler.__name__} takes no `request: Request` parameter")
        context = contextvars.copy_context()
        work = asyncio.create_task(handler(*args, **kwargs), name=handler.__name__, context=context)
        gone = asyncio.create_task(listen_for_disconnect(request), name="listen_for_disconnect")
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # we are cancelled ourselves (shutdown): take the handler along
            await _cancel(work, gone)
            raise
        if work in done:
            gone.cancel()  # not awaited: nothing may come between the answer and its sending
            for var, value in context.items():
                if var.get(_UNSET) is not value:
                    var.set(value)
            return work.result()
        await _cancel(work)  # its `finally` blocks run before the answer goes out
        if (error := gone.exception()) is not None:
            logger.warning("listening for a disconnect failed: %r", error)
        app_state(request).metrics.aborted.inc()
        logger.info("client disconnected: %s cancelled", handler.__name__)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    return cancellable


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel `tasks` and wait until they have ended, their `finally` blocks run."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.warning("%s ended with %r when cancelled", task.get_name(), error)
