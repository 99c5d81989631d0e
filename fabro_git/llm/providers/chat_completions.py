"""Chat Completions, the protocol of Gemini's OpenAI-compatible endpoint, of the
catalogue's other hosted providers and of local servers (Ollama, vLLM, llama.cpp,
LM Studio), streamed through the `openai` SDK with a base URL.

Reasoning text has no standard field here: servers send it as `reasoning_content`
(vLLM, Kimi, DeepSeek style) or `reasoning` (Ollama, OpenRouter); both are read.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

import msgspec

from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.llm.errors import StreamDropped
from fabro_git.llm.providers import (
    Connection,
    client_timeout,
    error_code,
    error_message,
    from_status,
    http_client,
    read_to_end,
    stream_failure,
    tool_call,
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

if TYPE_CHECKING:
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

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
_FOREIGN_CALL: JsonObject = {"google": {"thought_signature": "skip_thought_signature_validator"}}


def _wire_call(call: ToolCall, provider: str | None) -> JsonObject:
    wire: JsonObject = {
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
) -> list[JsonValue]:
    wire: list[JsonValue] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        if message.role == "user":
            wire.append({"role": "user", "content": message.text})
        elif message.role == "tool":
            wire += [
                {"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content}
                for result in message.tool_results
            ]
        else:
            turn: JsonObject = {"role": "assistant", "content": message.text or None}
            if message.tool_calls:
                turn["tool_calls"] = [_wire_call(call, provider) for call in message.tool_calls]
            wire.append(turn)
    return wire


def request_body(target: Target, request: Request) -> JsonObject:
    body: JsonObject = {
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
        http_client=http_client(openai.DefaultAsyncHttpxClient, request),
    )
    # The SDK's own stream stops reading at `[DONE]` and abandons its async generators,
    # which trio reports; reading the raw SSE body to its end leaves nothing behind.
    # The body is plain JSON; the SDK's parameter type picks the streaming overload.
    body = cast("CompletionCreateParamsBase", request_body(target, request))
    async with (
        client,
        client.chat.completions.with_streaming_response.create(**body, stream=True) as raw,
    ):
        await sink(OutputStart(target))
        try:
            async with ReplyText(request.text_file) as text:
                return await _consume(raw.iter_lines(), target, sink, text)
        except StreamDropped:
            raise
        except Exception as exc:
            translated = stream_failure(exc, target)
            if translated is None:
                raise
            raise translated from exc


# One `data:` chunk of the stream, in the fields read here (servers add others). Where
# servers disagree on a field's type (reasoning text, Gemini's opaque extra content) it
# stays JSON and only the expected shape is used.


class _FunctionPart(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolPart(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _FunctionPart | None = None
    extra_content: JsonValue = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: JsonValue = None
    reasoning: JsonValue = None
    tool_calls: list[_ToolPart] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _ChunkUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None


class _Chunk(msgspec.Struct):
    id: str | None = None
    usage: _ChunkUsage | None = None
    choices: list[_Choice] | None = None


class _Reply:
    """What the stream has said so far, chunk by chunk."""

    def __init__(self, target: Target, sink: EventSink, text: ReplyText) -> None:
        self.target = target
        self.sink = sink
        self.text = text
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, str]] = {}
        self.extras: dict[int, JsonObject] = {}
        self.finish: str | None = None
        self.usage = _ChunkUsage()
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
        chunk: JsonValue = json.loads(data)
        if self.event == "error" or (isinstance(chunk, dict) and "error" in chunk):
            raise from_status(
                self.target,
                status=None,
                code=error_code(chunk),
                message=error_message(chunk) or data,
                headers={},
            )
        self.event = None
        read = msgspec.convert(chunk, _Chunk)
        self.response_id = self.response_id or read.id
        if read.usage is not None:  # a chunk without counts keeps the last ones
            self.usage = read.usage
        for choice in (read.choices or [])[:1]:
            await self.choice(choice)

    async def choice(self, choice: _Choice) -> None:
        delta = choice.delta or _Delta()
        thought = delta.reasoning_content or delta.reasoning
        if isinstance(thought, str) and thought:
            self.reasoning.append(thought)
            await self.sink(ReasoningDelta(thought))
        if delta.content:
            await self.text.add(delta.content)
            await self.sink(TextDelta(delta.content))
        for part in delta.tool_calls or ():
            self.tool_part(part)
        if choice.finish_reason:
            self.finish = choice.finish_reason

    def tool_part(self, part: _ToolPart) -> None:
        slot = self.tools.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
        if part.id:
            slot["id"] = part.id
        if isinstance(part.extra_content, dict):
            self.extras[part.index] = part.extra_content
        function = part.function or _FunctionPart()
        slot["name"] += function.name or ""
        slot["arguments"] += function.arguments or ""

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
        prompt_details = usage.prompt_tokens_details or _PromptDetails()
        completion_details = usage.completion_tokens_details or _CompletionDetails()
        return Response(
            target=self.target,
            **self.text.fields(),
            tool_calls=tuple(calls),
            usage=Usage(
                input_tokens=usage.prompt_tokens or 0,
                output_tokens=usage.completion_tokens or 0,
                reasoning_tokens=completion_details.reasoning_tokens or 0,
                cache_read_tokens=prompt_details.cached_tokens or 0,
                cache_write_tokens=prompt_details.cache_write_tokens or 0,
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
