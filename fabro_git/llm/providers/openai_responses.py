"""OpenAI's Responses API, streamed through the `openai` SDK.

Requests are sent with `store=False`: the conversation travels in full each time, as
for every other provider, so nothing depends on state kept at OpenAI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.llm.errors import StreamDropped
from fabro_git.llm.providers import (
    Connection,
    client_timeout,
    from_status,
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
    from openai import AsyncStream
    from openai.types.responses import Response as OpenAiResponse
    from openai.types.responses import ResponseStreamEvent
    from openai.types.responses.response_create_params import ResponseCreateParamsBase


def wire_input(messages: tuple[Message, ...]) -> list[JsonValue]:
    import json

    items: list[JsonValue] = []
    for message in messages:
        if message.role == "user":
            items.append({"role": "user", "content": message.text})
        elif message.role == "tool":
            items += [
                {
                    "type": "function_call_output",
                    "call_id": result.tool_call_id,
                    "output": result.content,
                }
                for result in message.tool_results
            ]
        else:
            if message.text:
                items.append({"role": "assistant", "content": message.text})
            items += [
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": json.dumps(call.arguments),
                }
                for call in message.tool_calls
            ]
    return items


def request_body(target: Target, request: Request) -> JsonObject:
    body: JsonObject = {
        "model": target.model,
        "input": wire_input(request.messages),
        "max_output_tokens": request.max_tokens,
        "store": False,
    }
    if request.system:
        body["instructions"] = request.system
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
                "strict": False,
            }
            for tool in request.tools
        ]
    if request.reasoning_effort:
        body["reasoning"] = {"effort": request.reasoning_effort, "summary": "auto"}
    return body


async def stream(
    connection: Connection, target: Target, request: Request, sink: EventSink
) -> Response:
    import openai

    client = openai.AsyncOpenAI(
        api_key=connection.api_key,
        base_url=connection.base_url,
        max_retries=0,
        timeout=client_timeout(request),
        http_client=http_client(openai.DefaultAsyncHttpxClient, request),
    )
    async with client:
        # The body is plain JSON; the SDK's parameter type picks the streaming overload.
        body = cast("ResponseCreateParamsBase", request_body(target, request))
        events = await client.responses.create(**body, stream=True)
        async with ReplyText(request.text_file) as text:
            return await stream_events(
                events, target, sink, lambda e, t, s: _consume(e, t, s, text)
            )


class _Reply:
    """What the stream has said so far, event by event."""

    def __init__(self, target: Target, sink: EventSink, text: ReplyText) -> None:
        self.target = target
        self.sink = sink
        self.text = text
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.arguments: dict[str, str] = {}
        self.final: OpenAiResponse | None = None

    async def handle(self, event: ResponseStreamEvent) -> None:
        if event.type == "response.output_text.delta":
            await self.text.add(event.delta)
            await self.sink(TextDelta(event.delta))
        elif (
            event.type == "response.reasoning_summary_text.delta"
            or event.type == "response.reasoning_text.delta"
        ):
            self.reasoning.append(event.delta)
            await self.sink(ReasoningDelta(event.delta))
        elif event.type == "response.function_call_arguments.delta":
            self.arguments[event.item_id] = self.arguments.get(event.item_id, "") + event.delta
        elif event.type == "response.output_item.done":
            item = event.item
            if item.type == "function_call":
                raw = item.arguments or self.arguments.get(item.id or "", "")
                call = tool_call(item.call_id, item.name, raw)
                self.calls.append(call)
                await self.sink(ToolCallReady(call))
        elif event.type == "response.completed" or event.type == "response.incomplete":
            self.final = event.response
        elif event.type == "response.failed":
            error = event.response.error
            raise from_status(
                self.target,
                status=None,
                code=getattr(error, "code", None),
                message=getattr(error, "message", None) or "the response failed",
                headers={},
            )
        elif event.type == "error":
            raise from_status(
                self.target, status=None, code=event.code, message=event.message, headers={}
            )

    def response(self, final: OpenAiResponse) -> Response:
        usage = final.usage
        stop: StopReason = "tool_use" if self.calls else "end_turn"
        provider_stop = final.status
        if final.status == "incomplete":
            reason = getattr(final.incomplete_details, "reason", None)
            provider_stop = reason or "incomplete"
            stop = "content_filter" if reason == "content_filter" else "max_tokens"
        input_details = getattr(usage, "input_tokens_details", None) if usage else None
        output_details = getattr(usage, "output_tokens_details", None) if usage else None
        return Response(
            target=self.target,
            **self.text.fields(),
            tool_calls=tuple(self.calls),
            usage=Usage(
                input_tokens=usage.input_tokens if usage else 0,
                output_tokens=usage.output_tokens if usage else 0,
                reasoning_tokens=getattr(output_details, "reasoning_tokens", 0) or 0,
                cache_read_tokens=getattr(input_details, "cached_tokens", 0) or 0,
                cache_write_tokens=getattr(input_details, "cache_write_tokens", 0) or 0,
            ),
            stop_reason=stop,
            provider_stop_reason=provider_stop,
            reasoning="".join(self.reasoning) or None,
            response_id=final.id,
        )


async def _consume(
    events: AsyncStream[ResponseStreamEvent], target: Target, sink: EventSink, text: ReplyText
) -> Response:
    reply = _Reply(target, sink, text)
    await read_to_end(events, reply.handle)
    if reply.final is None:
        raise StreamDropped(
            "the response stream ended before response.completed",
            provider=target.provider,
            model=target.model,
        )
    response = reply.response(reply.final)
    await sink(Completed(response))
    return response
