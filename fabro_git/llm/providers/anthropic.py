"""Anthropic's Messages API, streamed through the `anthropic` SDK.

Reasoning effort maps to an extended-thinking budget; the budget counts towards
`max_tokens`, so the request's own allowance is added on top of it.
"""

from __future__ import annotations

from typing import Any

from fabro_git.llm.errors import LlmError, StreamDropped
from fabro_git.llm.providers import Connection, client_timeout, stream_events, tool_call
from fabro_git.llm.types import (
    Completed,
    EventSink,
    Message,
    ReasoningDelta,
    ReplyText,
    Request,
    Response,
    StopReason,
    Target,
    TextDelta,
    ToolCall,
    ToolCallReady,
    Usage,
)

THINKING_BUDGET = {"low": 1024, "medium": 4096, "high": 16384}

_STOP: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "content_filter",
    "model_context_window_exceeded": "max_tokens",
}


def wire_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "user":
            wire.append({"role": "user", "content": message.text})
        elif message.role == "tool":
            wire.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": result.tool_call_id,
                            "content": result.content,
                            "is_error": result.is_error,
                        }
                        for result in message.tool_results
                    ],
                }
            )
        else:
            blocks: list[dict[str, Any]] = []
            if message.reasoning and message.reasoning_signature:
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": message.reasoning,
                        "signature": message.reasoning_signature,
                    }
                )
            if message.text:
                blocks.append({"type": "text", "text": message.text})
            blocks += [
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
                for call in message.tool_calls
            ]
            wire.append({"role": "assistant", "content": blocks})
    return wire


def request_body(target: Target, request: Request) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": request.max_tokens,
        "messages": wire_messages(request.messages),
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
            for tool in request.tools
        ]
    if request.reasoning_effort:
        budget = THINKING_BUDGET[request.reasoning_effort]
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] = request.max_tokens + budget
    return body


async def stream(
    connection: Connection, target: Target, request: Request, sink: EventSink
) -> Response:
    import anthropic

    client = anthropic.AsyncAnthropic(
        api_key=connection.api_key,
        base_url=connection.base_url,
        max_retries=0,
        timeout=client_timeout(request),
    )
    async with client:
        events = await client.messages.create(**request_body(target, request), stream=True)
        async with ReplyText(request.text_file) as text:
            return await stream_events(
                events, target, sink, lambda e, t, s: _consume(e, t, s, text)
            )


async def _consume(events: Any, target: Target, sink: EventSink, text: ReplyText) -> Response:
    reasoning: list[str] = []
    signature: str | None = None
    calls: list[ToolCall] = []
    open_tools: dict[int, dict[str, Any]] = {}
    response_id: str | None = None
    stop: str | None = None
    input_tokens = output_tokens = thinking_tokens = cache_read = cache_write = 0
    finished = False
    # After a failure, read on to the end of the stream without handling more: the
    # SDK's async generators then finish instead of being abandoned (trio reports those).
    failure: LlmError | None = None
    async for event in events:
        if failure is not None:
            continue
        try:
            kind = event.type
            if kind == "message_start":
                response_id = event.message.id
                usage = event.message.usage
                input_tokens = usage.input_tokens or 0
                cache_read = usage.cache_read_input_tokens or 0
                cache_write = usage.cache_creation_input_tokens or 0
                output_tokens = usage.output_tokens or 0
            elif kind == "content_block_start":
                block = event.content_block
                if block.type == "tool_use":
                    open_tools[event.index] = {"id": block.id, "name": block.name, "json": ""}
                elif block.type == "text" and block.text:
                    await text.add(block.text)
                    await sink(TextDelta(block.text))
                elif block.type == "thinking" and block.thinking:
                    reasoning.append(block.thinking)
                    await sink(ReasoningDelta(block.thinking))
            elif kind == "content_block_delta":
                delta = event.delta
                if delta.type == "text_delta":
                    await text.add(delta.text)
                    await sink(TextDelta(delta.text))
                elif delta.type == "thinking_delta":
                    reasoning.append(delta.thinking)
                    await sink(ReasoningDelta(delta.thinking))
                elif delta.type == "signature_delta":
                    signature = delta.signature
                elif delta.type == "input_json_delta" and event.index in open_tools:
                    open_tools[event.index]["json"] += delta.partial_json
            elif kind == "content_block_stop" and event.index in open_tools:
                tool = open_tools.pop(event.index)
                call = tool_call(tool["id"], tool["name"], tool["json"])
                calls.append(call)
                await sink(ToolCallReady(call))
            elif kind == "message_delta":
                stop = event.delta.stop_reason or stop
                usage = event.usage
                output_tokens = usage.output_tokens or output_tokens
                if usage.input_tokens:
                    input_tokens = usage.input_tokens
                if usage.cache_read_input_tokens:
                    cache_read = usage.cache_read_input_tokens
                if usage.cache_creation_input_tokens:
                    cache_write = usage.cache_creation_input_tokens
                details = getattr(usage, "output_tokens_details", None)
                if details is not None:
                    thinking_tokens = getattr(details, "thinking_tokens", 0) or 0
            elif kind == "message_stop":
                finished = True
        except LlmError as err:
            failure = err
    if failure is not None:
        raise failure
    if not finished:
        raise StreamDropped(
            "the response stream ended before message_stop",
            provider=target.provider,
            model=target.model,
        )
    response = Response(
        target=target,
        **text.fields(),
        tool_calls=tuple(calls),
        usage=Usage(
            input_tokens=input_tokens + cache_read + cache_write,
            output_tokens=output_tokens,
            reasoning_tokens=thinking_tokens,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
        ),
        stop_reason=_STOP.get(stop or "", "other"),
        provider_stop_reason=stop,
        reasoning="".join(reasoning) or None,
        reasoning_signature=signature,
        response_id=response_id,
    )
    await sink(Completed(response))
    return response
