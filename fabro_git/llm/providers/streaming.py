"""Runs one attempt of a request through the adapter for the provider's wire protocol.

The adapters import the shared translation from the package face
(`fabro_git.llm.providers`); this module picks among them, so the face never has to
import its own adapters.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import trio

from fabro_git.llm.errors import LlmError, Timeout
from fabro_git.llm.providers import Connection, translate
from fabro_git.llm.providers.anthropic import stream as anthropic_stream
from fabro_git.llm.providers.chat_completions import stream as chat_completions_stream
from fabro_git.llm.providers.openai_responses import stream as openai_responses_stream
from fabro_git.llm.types import EventSink, Request, Response, StreamEvent, Target

Adapter = Callable[[Connection, Target, Request, EventSink], Awaitable[Response]]


async def stream(
    connection: Connection, target: Target, request: Request, sink: EventSink
) -> Response:
    """Run one attempt through the adapter for the provider's protocol."""
    adapter: Adapter
    if connection.provider.api == "anthropic":
        adapter = anthropic_stream
    elif connection.provider.api == "openai-responses":
        adapter = openai_responses_stream
    else:
        adapter = chat_completions_stream
    idle = request.idle_timeout
    if idle is None:
        return await _attempt(adapter, connection, target, request, sink)
    # The SDK's read timeout (`client_timeout`) bounds each read of the body, but a
    # server that drips its headers a byte at a time never lets one read wait long:
    # the wait for the response, up to its first event, has this deadline of its own.
    with trio.CancelScope(deadline=trio.current_time() + idle) as waiting:

        async def answered(event: StreamEvent) -> None:
            waiting.deadline = math.inf
            await sink(event)

        return await _attempt(adapter, connection, target, request, answered)
    raise Timeout(
        f"no response from the provider within {idle:g}s (stream_idle_timeout)",
        provider=target.provider,
        model=target.model,
    )


async def _attempt(
    adapter: Adapter,
    connection: Connection,
    target: Target,
    request: Request,
    sink: EventSink,
) -> Response:
    try:
        return await adapter(connection, target, request, sink)
    except LlmError:
        raise
    except Exception as exc:
        translated = translate(exc, target)
        if translated is None:
            raise
        raise translated from exc
