"""Chat Completions, the protocol of Gemini's OpenAI-compatible endpoint, of the
catalogue's other hosted providers and of local servers (Ollama, vLLM, llama.cpp,
LM Studio), streamed through the `openai` SDK with a base URL.

Reasoning text has no standard field here: servers send it as `reasoning_content`
(vLLM, Kimi, DeepSeek style) or `reasoning` (Ollama, OpenRouter); both are read.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fabro_git.llm.errors import StreamDropped
from fabro_git.llm.providers import (
    Connection,
    client_timeout,
    error_code,
    error_message,
    from_status,
    read_to_end,
    tool_call,
    translate,
)
from fabro_git.llm.types import (
    Completed,
    EventSink,
    Message,
    OutputStart,
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

_STOP: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filter",
}


# Gemini 3 refuses a tool call sent back without the thought signature it came with;
# one it did not make (a conversation begun on another model) carries the value its
# documentation gives for that case instead.
_FOREIGN_CALL = {"google": {"thought_signature": "skip_thought_signature_validator"}}


def _wire_call(call: ToolCall, provider: str | None) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }
    extra = (
        call.extra if call.extra is not None else _FOREIGN_CALL if provider == "gemini" else None
    )
    if extra is not None:
        wire["extra_content"] = extra
    return wire


def wire_messages(
    system: str | None, messages: tuple[Message, ...], provider: str | None = None
) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        if message.role == "user":
            wire.append({"role": "user", "content": message.text})
        elif message.role == "tool":
            wire += [
                {"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content}
                for result in message.tool_results
            ]
        else:
            turn: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            if message.tool_calls:
                turn["tool_calls"] = [_wire_call(call, provider) for call in message.tool_calls]
            wire.append(turn)
    return wire


def request_body(target: Target, request: Request) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "messages": wire_messages(request.system, request.messages, target.provider),
        "max_tokens": request.max_tokens,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in request.tools
        ]
    if request.reasoning_effort:
        body["reasoning_effort"] = request.reasoning_effort
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
    # The SDK's own stream stops reading at `[DONE]` and abandons its async generators,
    # which trio reports; reading the raw SSE body to its end leaves nothing behind.
    async with (
        client,
        client.chat.completions.with_streaming_response.create(
            **request_body(target, request), stream=True
        ) as raw,
    ):
        await sink(OutputStart(target))
        try:
            async with ReplyText(request.text_file) as text:
                return await _consume(raw.iter_lines(), target, sink, text)
        except StreamDropped:
            raise
        except Exception as exc:
            translated = translate(exc, target, streaming=True)
            if translated is None:
                raise
            raise translated from exc


class _Reply:
    """What the stream has said so far, chunk by chunk."""

    def __init__(self, target: Target, sink: EventSink, text: ReplyText) -> None:
        self.target = target
        self.sink = sink
        self.text = text
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.extras: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.response_id: str | None = None
        self.event: str | None = None

    async def line(self, line: str) -> None:
        """One line of the SSE body: an `event:` name, or a `data:` chunk."""
        if line.startswith("event:"):
            self.event = line[6:].strip()
            return
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            return  # read on to the end of the body
        chunk = json.loads(data)
        if self.event == "error" or (isinstance(chunk, dict) and "error" in chunk):
            raise from_status(
                self.target,
                status=None,
                code=error_code(chunk),
                message=error_message(chunk) or data,
                headers={},
            )
        self.event = None
        self.response_id = self.response_id or chunk.get("id")
        self.usage = chunk.get("usage") or self.usage
        for choice in (chunk.get("choices") or [])[:1]:
            await self.choice(choice)

    async def choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thought, str) and thought:
            self.reasoning.append(thought)
            await self.sink(ReasoningDelta(thought))
        content = delta.get("content")
        if content:
            await self.text.add(content)
            await self.sink(TextDelta(content))
        for part in delta.get("tool_calls") or ():
            self.tool_part(part)
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]

    def tool_part(self, part: dict[str, Any]) -> None:
        slot = self.tools.setdefault(part.get("index", 0), {"id": "", "name": "", "arguments": ""})
        if part.get("id"):
            slot["id"] = part["id"]
        if isinstance(part.get("extra_content"), dict):
            self.extras[part.get("index", 0)] = part["extra_content"]
        function = part.get("function") or {}
        slot["name"] += function.get("name") or ""
        slot["arguments"] += function.get("arguments") or ""

    async def tool_calls(self) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for index in sorted(self.tools):
            slot = self.tools[index]
            call = tool_call(
                slot["id"] or f"call_{index}",
                slot["name"],
                slot["arguments"],
                extra=self.extras.get(index),
            )
            calls.append(call)
            await self.sink(ToolCallReady(call))
        return calls

    def response(self, finish: str, calls: list[ToolCall]) -> Response:
        usage = self.usage
        prompt_details = usage.get("prompt_tokens_details") or {}
        completion_details = usage.get("completion_tokens_details") or {}
        return Response(
            target=self.target,
            **self.text.fields(),
            tool_calls=tuple(calls),
            usage=Usage(
                input_tokens=usage.get("prompt_tokens") or 0,
                output_tokens=usage.get("completion_tokens") or 0,
                reasoning_tokens=completion_details.get("reasoning_tokens") or 0,
                cache_read_tokens=prompt_details.get("cached_tokens") or 0,
                cache_write_tokens=prompt_details.get("cache_write_tokens") or 0,
            ),
            stop_reason=_STOP.get(finish, "other"),
            provider_stop_reason=finish,
            reasoning="".join(self.reasoning) or None,
            response_id=self.response_id,
        )


async def _consume(
    lines: AsyncIterator[str], target: Target, sink: EventSink, text: ReplyText
) -> Response:
    reply = _Reply(target, sink, text)
    await read_to_end(lines, reply.line)
    if reply.finish is None:
        raise StreamDropped(
            "the response stream ended without a finish_reason",
            provider=target.provider,
            model=target.model,
        )
    response = reply.response(reply.finish, await reply.tool_calls())
    await sink(Completed(response))
    return response
