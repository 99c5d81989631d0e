"""The normalised request, conversation and stream shapes every provider adapter speaks.

An adapter translates a `Request` into its provider's wire format and the provider's
stream back into these events, so a prompt stage or an agent loop never sees a
provider's own types. Arguments of tool calls are parsed JSON objects; results are text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec

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
    parameters: dict[str, Any]


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call the model asked for. `extra` is the provider's opaque data that must go
    back with the call on the next turn (Gemini's thought signature, in Chat
    Completions' `extra_content`), kept as the provider sent it."""

    id: str
    name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None
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

    def as_message(self) -> Message:
        """The assistant turn to append to the conversation."""
        return Message(
            role="assistant",
            text=self.text,
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
