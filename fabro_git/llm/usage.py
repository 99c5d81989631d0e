"""What a response cost, and the event shapes its usage is recorded in.

Prices come from the catalogue (per million tokens). Cached input is billed at a
fraction of the input price and cache writes at a premium; the factors are Anthropic's
published ones, applied to every provider, so the figure is an estimate.
"""

from __future__ import annotations

from fabro_git import redact
from fabro_git.events.catalogue import (
    EVENT_TEXT_LIMIT,
    AgentMessage,
    AgentOutputReplace,
    AgentOutputStart,
    AgentReasoningDelta,
    AgentTextDelta,
    AgentWarning,
    TokenUsage,
)
from fabro_git.llm import catalogue
from fabro_git.llm.types import (
    OutputReplace,
    OutputStart,
    ReasoningDelta,
    Response,
    StreamEvent,
    TextDelta,
    Usage,
)

CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = 1.25
# Warn when one request's input fills this share of the model's context window.
CONTEXT_WARNING_SHARE = 0.8


def estimate_cost(model: str, usage: Usage) -> float | None:
    """US dollars for `usage` on `model`, or None when the catalogue has no price."""
    info = catalogue.lookup(model)
    if info is None or info.input_price is None or info.output_price is None:
        return None
    uncached = max(0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens)
    input_cost = info.input_price * (
        uncached
        + usage.cache_read_tokens * CACHE_READ_FACTOR
        + usage.cache_write_tokens * CACHE_WRITE_FACTOR
    )
    return (input_cost + info.output_price * usage.output_tokens) / 1_000_000


def token_usage(usage: Usage) -> TokenUsage:
    return TokenUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        reasoning_tokens=usage.reasoning_tokens or None,
        cache_read_tokens=usage.cache_read_tokens or None,
        cache_write_tokens=usage.cache_write_tokens or None,
    )


def event_text(text: str, limit: int = EVENT_TEXT_LIMIT, *, length: int | None = None) -> str:
    """`text`, or its first `limit` characters and a note of what was left out;
    `length` is the whole text's when `text` is only its start."""
    length = len(text) if length is None else length
    if length <= limit:
        return text
    return redact.clip(text, limit) + (
        f"\n[... {length - limit} more characters, in the stage's response.md"
        " or its offloaded value]"
    )


def message_event(response: Response) -> AgentMessage:
    return AgentMessage(
        text=event_text(response.text, length=response.length),
        model=response.target.model,
        usage=token_usage(response.usage),
        tool_call_count=len(response.tool_calls),
    )


def stream_event(
    event: StreamEvent,
) -> AgentOutputStart | AgentTextDelta | AgentReasoningDelta | AgentOutputReplace | None:
    """The `agent.*` event a stream event is recorded as, if any (tool calls and the
    final message have their own events, emitted by the caller). The event bus masks
    each stream of deltas as a whole and stops a reply's text at `EVENT_TEXT_LIMIT`."""
    if isinstance(event, OutputStart):
        return AgentOutputStart()
    if isinstance(event, TextDelta):
        return AgentTextDelta(delta=event.delta)
    if isinstance(event, ReasoningDelta):
        return AgentReasoningDelta(delta=event.delta)
    if isinstance(event, OutputReplace):
        return AgentOutputReplace(text=event.text, reasoning=event.reasoning)
    return None


def context_warning(response: Response, context_window: int | None = None) -> AgentWarning | None:
    """A warning when the response filled most of the context window: the catalogue's
    for the model, or `context_window` when the caller knows better."""
    info = catalogue.lookup(response.target.model)
    if context_window is None and info is not None:
        context_window = info.context_window
    if context_window is None:
        return None
    used = response.usage.input_tokens + response.usage.output_tokens
    if used < context_window * CONTEXT_WARNING_SHARE:
        return None
    model = info.id if info is not None else response.target.model
    return AgentWarning(
        kind="context_window",
        message=f"{used} of {context_window} context tokens used on {model}",
        details={"used_tokens": used, "context_window": context_window},
    )
