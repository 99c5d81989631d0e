"""Anthropic's Messages API, streamed through the `anthropic` SDK.

Reasoning effort maps to an extended-thinking budget; the budget counts towards
`max_tokens`, so the request's own allowance is added on top of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import msgspec

from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.llm.errors import StreamDropped
from fabro_git.llm.providers import (
    Connection,
    client_timeout,
    http_client,
    read_to_end,
    stream_events,
    tool_call,
)
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

if TYPE_CHECKING:
    from anthropic import AsyncStream
    from anthropic.types import (
        ContentBlock,
        MessageDeltaUsage,
        RawContentBlockDelta,
        RawMessageStreamEvent,
    )
    from anthropic.types import Message as AnthropicMessage
    from anthropic.types.message_create_params import MessageCreateParamsBase

THINKING_BUDGET = {"low": 1024, "medium": 4096, "high": 16384}

_STOP: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "content_filter",
    "model_context_window_exceeded": "max_tokens",
}


def wire_messages(messages: tuple[Message, ...]) -> list[JsonValue]:
    wire: list[JsonValue] = []
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
            blocks: list[JsonValue] = []
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


def request_body(target: Target, request: Request) -> JsonObject:
    body: JsonObject = {
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
        http_client=http_client(anthropic.DefaultAsyncHttpxClient, request),
    )
    async with client:
        # The body is plain JSON; the SDK's parameter type picks the streaming overload.
        body = cast("MessageCreateParamsBase", request_body(target, request))
        events = await client.messages.create(**body, stream=True)
        async with ReplyText(request.text_file) as text:
            return await stream_events(
                events, target, sink, lambda e, t, s: _consume(e, t, s, text)
            )


class _OpenTool(msgspec.Struct):
    """A tool call whose arguments are still arriving, in its content block."""

    id: str
    name: str
    json: str = ""


class _Reply:
    """What the stream has said so far, event by event."""

    def __init__(self, sink: EventSink, text: ReplyText) -> None:
        self.sink = sink
        self.text = text
        self.reasoning: list[str] = []
        self.signature: str | None = None
        self.calls: list[ToolCall] = []
        self.open_tools: dict[int, _OpenTool] = {}
        self.response_id: str | None = None
        self.stop: str | None = None
        self.input_tokens = self.output_tokens = self.thinking_tokens = 0
        self.cache_read = self.cache_write = 0
        self.finished = False

    async def handle(self, event: RawMessageStreamEvent) -> None:
        if event.type == "message_start":
            self.message_start(event.message)
        elif event.type == "content_block_start":
            await self.block_start(event.index, event.content_block)
        elif event.type == "content_block_delta":
            await self.block_delta(event.index, event.delta)
        elif event.type == "content_block_stop" and event.index in self.open_tools:
            tool = self.open_tools.pop(event.index)
            call = tool_call(tool.id, tool.name, tool.json)
            self.calls.append(call)
            await self.sink(ToolCallReady(call))
        elif event.type == "message_delta":
            self.stop = event.delta.stop_reason or self.stop
            self.message_usage(event.usage)
        elif event.type == "message_stop":
            self.finished = True

    def message_start(self, message: AnthropicMessage) -> None:
        self.response_id = message.id
        usage = message.usage
        self.input_tokens = usage.input_tokens or 0
        self.cache_read = usage.cache_read_input_tokens or 0
        self.cache_write = usage.cache_creation_input_tokens or 0
        self.output_tokens = usage.output_tokens or 0

    async def block_start(self, index: int, block: ContentBlock) -> None:
        if block.type == "tool_use":
            self.open_tools[index] = _OpenTool(block.id, block.name)
        elif block.type == "text" and block.text:
            await self.text.add(block.text)
            await self.sink(TextDelta(block.text))
        elif block.type == "thinking" and block.thinking:
            self.reasoning.append(block.thinking)
            await self.sink(ReasoningDelta(block.thinking))

    async def block_delta(self, index: int, delta: RawContentBlockDelta) -> None:
        if delta.type == "text_delta":
            await self.text.add(delta.text)
            await self.sink(TextDelta(delta.text))
        elif delta.type == "thinking_delta":
            self.reasoning.append(delta.thinking)
            await self.sink(ReasoningDelta(delta.thinking))
        elif delta.type == "signature_delta":
            self.signature = delta.signature
        elif delta.type == "input_json_delta" and index in self.open_tools:
            self.open_tools[index].json += delta.partial_json

    def message_usage(self, usage: MessageDeltaUsage) -> None:
        """The final counts of `message_delta`; a count it leaves out keeps its value."""
        self.output_tokens = usage.output_tokens or self.output_tokens
        self.input_tokens = usage.input_tokens or self.input_tokens
        self.cache_read = usage.cache_read_input_tokens or self.cache_read
        self.cache_write = usage.cache_creation_input_tokens or self.cache_write
        details = getattr(usage, "output_tokens_details", None)
        if details is not None:
            self.thinking_tokens = getattr(details, "thinking_tokens", 0) or 0

    def response(self, target: Target) -> Response:
        return Response(
            target=target,
            **self.text.fields(),
            tool_calls=tuple(self.calls),
            usage=Usage(
                input_tokens=self.input_tokens + self.cache_read + self.cache_write,
                output_tokens=self.output_tokens,
                reasoning_tokens=self.thinking_tokens,
                cache_read_tokens=self.cache_read,
                cache_write_tokens=self.cache_write,
            ),
            stop_reason=_STOP.get(self.stop or "", "other"),
            provider_stop_reason=self.stop,
            reasoning="".join(self.reasoning) or None,
            reasoning_signature=self.signature,
            response_id=self.response_id,
        )


async def _consume(
    events: AsyncStream[RawMessageStreamEvent], target: Target, sink: EventSink, text: ReplyText
) -> Response:
    reply = _Reply(sink, text)
    await read_to_end(events, reply.handle)
    if not reply.finished:
        raise StreamDropped(
            "the response stream ended before message_stop",
            provider=target.provider,
            model=target.model,
        )
    response = reply.response(target)
    await sink(Completed(response))
    return response
