"""A model call with retries and failover: the one entry point stages use.

`complete()` streams one request to its target, retrying transient failures with
exponential backoff and jitter (a provider's `Retry-After` is honoured, and one longer
than the cap fails the call rather than stall the run), then fails over along the
fallback chain when the target stays unavailable or its quota is spent. Each retry and
each failover is reported through a callback as the event the engine records
(`agent.llm.retry`, `agent.failover`). All waiting is `trio.sleep`, so tests run the
backoff on a virtual clock.

Under a batch's LLM slot limiter (`FABRO_LLM_SLOTS`, see `fabro_git.llm.slots`) a 429
is told to every run of the batch, and each request first waits out any such pause.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec
import trio

from fabro_git.events.catalogue import AgentFailover, AgentLlmRetry, RunNotice
from fabro_git.llm import SLOTS_VARIABLE
from fabro_git.llm.errors import LlmError, MissingCredentials, RateLimited
from fabro_git.llm.types import (
    EventSink,
    OutputReplace,
    ReasoningDelta,
    Request,
    Response,
    StreamEvent,
    Target,
    TextDelta,
    discard,
)

RetryHook = Callable[[AgentLlmRetry], Awaitable[None]]
FailoverHook = Callable[[AgentFailover], Awaitable[None]]
NoticeHook = Callable[[RunNotice], Awaitable[None]]


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    max_retries: int = 3
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: tuple[float, float] = (0.5, 1.5)

    def delay(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number `retry` (1 for the first)."""
        base = self.initial_delay * self.multiplier ** (retry - 1)
        return min(self.max_delay, base * rng.uniform(*self.jitter))


NO_RETRIES = RetryPolicy(max_retries=0)


async def _ignore(_event: object) -> None:
    pass


async def complete(
    request: Request,
    target: Target,
    *,
    fallbacks: Sequence[Target] = (),
    env: Mapping[str, str] | None = None,
    sink: EventSink = discard,
    policy: RetryPolicy = RetryPolicy(),
    on_retry: RetryHook = _ignore,
    on_failover: FailoverHook = _ignore,
    on_notice: NoticeHook = _ignore,
    rng: random.Random | None = None,
) -> Response:
    """The response of the first target in `[target, *fallbacks]` that answers.

    A fallback whose provider is not configured is skipped; a missing key for the
    primary target is an error. Errors that neither retry nor failover can mend
    (a rejected key, a bad request) are raised at once.
    """
    from fabro_git.llm.providers import connect

    env = os.environ if env is None else env
    rng = rng or random.Random()
    voiding = _Voiding(sink)
    chain = [target]
    for fallback in fallbacks:
        try:
            connect(fallback, env)
        except MissingCredentials:
            continue
        if fallback not in chain:
            chain.append(fallback)
    for position, current in enumerate(chain):
        try:
            return await _with_retries(
                request,
                current,
                env=env,
                sink=voiding,
                policy=policy,
                on_retry=on_retry,
                on_notice=on_notice,
                rng=rng,
            )
        except LlmError as err:
            if not err.failover or position + 1 == len(chain):
                raise
            following = chain[position + 1]
            await voiding.void()
            await on_failover(
                AgentFailover(
                    from_provider=current.provider,
                    from_model=current.model,
                    to_provider=following.provider,
                    to_model=following.model,
                    error=str(err),
                )
            )
    raise AssertionError("unreachable: the chain always holds the target")


class _Voiding:
    """A sink that knows whether output has been streamed since the attempt began, so a
    retry or a failover after it can say the partial output is void."""

    def __init__(self, sink: EventSink) -> None:
        self._sink = sink
        self._streamed = False

    async def __call__(self, event: StreamEvent) -> None:
        if isinstance(event, TextDelta | ReasoningDelta):
            self._streamed = True
        await self._sink(event)

    async def void(self) -> None:
        if self._streamed:
            self._streamed = False
            await self._sink(OutputReplace())


async def _with_retries(
    request: Request,
    target: Target,
    *,
    env: Mapping[str, str],
    sink: EventSink,
    policy: RetryPolicy,
    on_retry: RetryHook,
    on_notice: NoticeHook,
    rng: random.Random,
) -> Response:
    from fabro_git.llm.providers import connect, ensure_sdk
    from fabro_git.llm.providers.streaming import stream

    connection = connect(target, env)
    await ensure_sdk(connection.provider.api)
    shared = _SharedPause(env.get(SLOTS_VARIABLE), on_notice)
    retry = 0
    while True:
        try:
            await shared.wait_out()
            return await stream(connection, target, request, sink)
        except LlmError as err:
            if not err.retryable or retry >= policy.max_retries:
                raise
            if err.retry_after is not None and err.retry_after > policy.max_delay:
                raise
            retry += 1
            if isinstance(sink, _Voiding):
                await sink.void()
            delay = err.retry_after if err.retry_after is not None else policy.delay(retry, rng)
            if isinstance(err, RateLimited):
                await shared.begin(delay)
            await on_retry(
                AgentLlmRetry(
                    provider=target.provider,
                    model=target.model,
                    attempt=retry + 1,
                    delay_secs=round(delay, 3),
                    error=err.to_dict(),
                )
            )
            await trio.sleep(delay)


class _SharedPause:
    """The pause a 429 puts on every run of a batch, through its LLM slot limiter; with
    no limiter (`path` None) it does nothing. A limiter that has gone (its driver
    stopped) is no reason to stop the run: the slot it would give was asked for, and
    warned of, when the stage began."""

    def __init__(self, path: str | None, on_notice: NoticeHook) -> None:
        self._path = path
        self._on_notice = on_notice

    async def begin(self, seconds: float) -> None:
        if self._path is None:
            return
        from fabro_git.llm.slots import LlmSlots, SlotsUnreachable

        with contextlib.suppress(SlotsUnreachable):
            await LlmSlots(self._path).pause(seconds)

    async def wait_out(self) -> None:
        if self._path is None:
            return
        from fabro_git.llm.slots import LlmSlots, SlotsUnreachable

        async def waiting(seconds: float) -> None:
            await self._on_notice(
                RunNotice(
                    level="info",
                    code="llm_shared_pause",
                    message=f"waiting {seconds:.1f}s before asking the model: a provider "
                    "rate-limited a run of this batch (HTTP 429)",
                )
            )

        with contextlib.suppress(SlotsUnreachable):
            await LlmSlots(self._path).wait_out_pause(waiting)
