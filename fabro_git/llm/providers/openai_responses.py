"""OpenAI's Responses API, streamed through the `openai` SDK.

Requests are sent with `store=False`: the conversation travels in full each time, as
for every other provider, so nothing depends on state kept at OpenAI.
"""

from __future__ import annotations

from typing import Any

from fabro_git.llm.errors import StreamDropped
from fabro_git.llm.providers import (
    Connection,
    client_timeout,
    from_status,
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


def wire_input(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    import json

    items: list[dict[str, Any]] = []
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


def request_body(target: Target, request: Request) -> dict[str, Any]:
    body: dict[str, Any] = {
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
    )
    async with client:
        events = await client.responses.create(**request_body(target, request), stream=True)
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
        self.final: Any = None

    async def handle(self, event: Any) -> None:
        kind = event.type
        if kind == "response.output_text.delta":
            await self.text.add(event.delta)
            await self.sink(TextDelta(event.delta))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            self.reasoning.append(event.delta)
            await self.sink(ReasoningDelta(event.delta))
        elif kind == "response.function_call_arguments.delta":
            self.arguments[event.item_id] = self.arguments.get(event.item_id, "") + event.delta
        elif kind == "response.output_item.done" and event.item.type == "function_call":
            item = event.item
            raw = item.arguments or self.arguments.get(item.id or "", "")
            call = tool_call(item.call_id, item.name, raw)
            self.calls.append(call)
            await self.sink(ToolCallReady(call))
        elif kind in ("response.completed", "response.incomplete"):
            self.final = event.response
        elif kind == "response.failed":
            error = event.response.error
            raise from_status(
                self.target,
                status=None,
                code=getattr(error, "code", None),
                message=getattr(error, "message", None) or "the response failed",
                headers={},
            )
        elif kind == "error":
            raise from_status(
                self.target, status=None, code=event.code, message=event.message, headers={}
            )

    def response(self, final: Any) -> Response:
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


async def _consume(events: Any, target: Target, sink: EventSink, text: ReplyText) -> Response:
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
