"""The normalised request, conversation and stream shapes every provider adapter speaks.

An adapter translates a `Request` into its provider's wire format and the provider's
stream back into these events, so a prompt stage or an agent loop never sees a
provider's own types. Arguments of tool calls are parsed JSON objects; results are text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol, TypedDict

import msgspec

from fabro_git.jsondata import JsonObject

Role = Literal["user", "assistant", "tool"]
ReasoningEffort = Literal["low", "medium", "high"]
# Why a response ended, in one vocabulary; the provider's own word is kept beside it.
StopReason = Literal[
    "end_turn", "tool_use", "max_tokens", "stop_sequence", "content_filter", "other"
]


class Target(msgspec.Struct, frozen=True):
    """Which provider to call and the model id it knows."""

    provider: str
    model: str

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}"


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool the model may call; `parameters` is a JSON schema of an object."""

    name: str
    description: str
    parameters: JsonObject


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call the model asked for. `extra` is the provider's opaque data that must go
    back with the call on the next turn (Gemini's thought signature, in Chat
    Completions' `extra_content`), kept as the provider sent it."""

    id: str
    name: str
    arguments: JsonObject
    extra: JsonObject | None = None
    # Why the model's arguments text could not be read (not one JSON object of UTF-8
    # text); `arguments` is then empty and the call is answered with a tool error.
    unreadable: str | None = None


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    tool_call_id: str
    content: str
    is_error: bool = False


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation turn.

    A `user` message carries text; an `assistant` message carries text, tool calls and
    the reasoning that came with them (`reasoning_signature` is the provider's opaque
    proof, which Anthropic needs back to continue a tool round after thinking); a `tool`
    message carries the results of the previous assistant turn's calls.
    """

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    reasoning: str | None = None
    reasoning_signature: str | None = None

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", text=text)

    @classmethod
    def tool(cls, results: tuple[ToolResult, ...] | list[ToolResult]) -> Message:
        return cls(role="tool", tool_results=tuple(results))


# Seconds a model's response may go without a byte (`[run.agent] stream_idle_timeout`).
DEFAULT_IDLE_TIMEOUT = 120.0


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """What to ask: the same for every provider. The target is chosen separately, so a
    failover can send the same request elsewhere."""

    messages: tuple[Message, ...]
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 4096
    reasoning_effort: ReasoningEffort | None = None
    # Seconds the HTTP client waits on a connection or between stream chunks; None
    # waits for ever (tests on a virtual clock need no deadline of the client's own).
    timeout: float | None = 600.0
    # Seconds the response's headers, and then each read of its body, may take; past
    # that the attempt fails as a `Timeout` (a server that drips its headers a byte at
    # a time is cut off too). None: no such bound.
    idle_timeout: float | None = None
    # A file the reply's text streams into as it arrives (`ReplyText`), for a caller
    # that must not hold a very long reply in memory. None: the text is joined in memory.
    text_file: str | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of one response.

    `input_tokens` counts every input token, cached or not (Anthropic reports the
    cached ones apart; the adapter adds them back), so costs and context checks read
    one number. `reasoning_tokens` are part of `output_tokens`.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class Response(msgspec.Struct, frozen=True, kw_only=True):
    target: Target
    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    stop_reason: StopReason
    provider_stop_reason: str | None = None
    reasoning: str | None = None
    reasoning_signature: str | None = None
    response_id: str | None = None
    # A reply longer than `TEXT_KEPT` characters, streamed to `Request.text_file`: that
    # file holds it whole (`text_chars` characters) and `text` is only its start.
    text_file: str | None = None
    text_chars: int | None = None

    @property
    def length(self) -> int:
        """Characters of the whole reply."""
        return len(self.text) if self.text_chars is None else self.text_chars

    def whole_text(self) -> str:
        """The whole reply, read back from its file when it was streamed to one."""
        if self.text_file is None:
            return self.text
        with open(self.text_file, encoding="utf-8") as fh:
            return fh.read()

    def as_message(self, *, whole: bool = True) -> Message:
        """The assistant turn to append to the conversation; unless `whole`, with only
        the start of a reply streamed to a file (`TEXT_KEPT` characters), so that a
        huge reply is not read back into memory."""
        return Message(
            role="assistant",
            text=self.whole_text() if whole else self.text,
            tool_calls=self.tool_calls,
            reasoning=self.reasoning,
            reasoning_signature=self.reasoning_signature,
        )


# ---------------------------------------------------------------------------- stream


class OutputStart(msgspec.Struct, frozen=True, tag="output_start"):
    """A response began. After a retried attempt it comes again: drop what came before."""

    target: Target


class TextDelta(msgspec.Struct, frozen=True, tag="text_delta"):
    delta: str


class ReasoningDelta(msgspec.Struct, frozen=True, tag="reasoning_delta"):
    delta: str


class OutputReplace(msgspec.Struct, frozen=True, tag="output_replace"):
    """What was streamed so far is void: an attempt broke off after output began, and
    the call goes on with another (a retry or a failover). The text and reasoning that
    stand from now on replace the buffers; empty until the new attempt streams."""

    text: str = ""
    reasoning: str | None = None


class ToolCallReady(msgspec.Struct, frozen=True, tag="tool_call"):
    """A tool call whose arguments have fully arrived."""

    call: ToolCall


class Completed(msgspec.Struct, frozen=True, tag="completed"):
    response: Response


StreamEvent = OutputStart | TextDelta | ReasoningDelta | OutputReplace | ToolCallReady | Completed
EventSink = Callable[[StreamEvent], Awaitable[None]]


async def discard(_event: StreamEvent) -> None:
    """An event sink for callers that want only the final response."""


# Characters of a reply held in memory when it also streams to a file
# (`Request.text_file`); past them the file is the reply and `Response.text` its start.
# The offload threshold's figure: a reply this long is offloaded, so its stage never
# needs it whole in memory.
TEXT_KEPT = 100 * 1024
# Bytes gathered before one write to the reply's file.
_TEXT_WRITE = 1 << 20


class _TextFile(Protocol):
    """The reply's file as trio opens it (`trio.open_file`)."""

    async def write(self, data: str, /) -> int: ...

    async def aclose(self) -> None: ...


class TextFields(TypedDict):
    """The `Response` fields that carry a reply's text (`ReplyText.fields`)."""

    text: str
    text_file: str | None
    text_chars: int | None


class ReplyText:
    """A reply's text as its deltas arrive, for an adapter to return in its `Response`.

    Without a file the deltas are joined in memory. With one (`Request.text_file`),
    every delta is also appended to it (a megabyte at a time, on a worker thread), and
    only the first `TEXT_KEPT` characters are kept: a 250 MB reply costs the stage a
    file, not a string. Each attempt starts the file afresh."""

    def __init__(self, file: str | None) -> None:
        self.file = file
        self._parts: list[str] = []
        self._chars = 0  # characters received
        self._kept = 0  # characters in _parts
        self._pending: list[str] = []
        self._pending_chars = 0
        self._out: _TextFile | None = None

    async def __aenter__(self) -> ReplyText:
        if self.file is not None:
            import trio

            self._out = await trio.open_file(
                self.file, "w", encoding="utf-8", errors="backslashreplace", newline=""
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._out is not None:
            try:
                await self._flush()
            finally:
                await self._out.aclose()
                self._out = None

    async def add(self, delta: str) -> None:
        self._chars += len(delta)
        if self._kept <= TEXT_KEPT or self._out is None:
            self._parts.append(delta)
            self._kept += len(delta)
        if self._out is not None:
            self._pending.append(delta)
            self._pending_chars += len(delta)
            if self._pending_chars >= _TEXT_WRITE:
                await self._flush()

    async def _flush(self) -> None:
        if self._pending and self._out is not None:
            data = "".join(self._pending)
            self._pending, self._pending_chars = [], 0
            await self._out.write(data)

    @property
    def spilled(self) -> bool:
        """Whether the reply outgrew memory: the file holds it, `text` its start."""
        return self._out is not None and self._chars > TEXT_KEPT

    @property
    def text(self) -> str:
        joined = "".join(self._parts)
        return joined[:TEXT_KEPT] if self.spilled else joined

    def fields(self) -> TextFields:
        """The `Response` fields that carry the text."""
        if self.spilled:
            return TextFields(text=self.text, text_file=self.file, text_chars=self._chars)
        return TextFields(text=self.text, text_file=None, text_chars=None)
