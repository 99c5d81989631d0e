"""Retries, failover and the errors a user acts on, through the real SDKs.

Backoff runs on trio's `MockClock` (`virtual_clock`): every `trio.sleep` of the retry
loop is skipped once the loop has nothing else to wait for, and the virtual time it
took is exact. These calls set no HTTP timeout (`timeout=None`), so the only deadlines
are the retry loop's own.
"""

from __future__ import annotations

import random

import pytest
import trio
from llm_server import (
    Drop,
    Garbled,
    LlmServer,
    Reply,
    Stall,
    StreamError,
    ToolUse,
    provider_env,
    quota_exhausted,
    rate_limited,
    server_error,
    unauthorized,
)
from virtual_clock import virtual_clock

from fabro_git.events.catalogue import AgentFailover, AgentLlmRetry
from fabro_git.llm.client import RetryPolicy, complete
from fabro_git.llm.errors import (
    AuthenticationFailed,
    MissingCredentials,
    QuotaExhausted,
    RateLimited,
    ServerError,
)
from fabro_git.llm.types import (
    Message,
    OutputStart,
    Request,
    Response,
    StreamEvent,
    Target,
    TextDelta,
    ToolCallReady,
)

ANTHROPIC = Target("anthropic", "claude-sonnet-4-6")
OPENAI = Target("openai", "gpt-5.4")
GEMINI = Target("gemini", "gemini-3-flash-preview")
REQUEST = Request(messages=(Message.user("hello"),), timeout=None)


class Run:
    """One `complete()` on a virtual clock, with everything it reported."""

    def __init__(self) -> None:
        self.retries: list[AgentLlmRetry] = []
        self.failovers: list[AgentFailover] = []
        self.events: list[StreamEvent] = []
        self.elapsed = 0.0

    def __call__(
        self,
        server: LlmServer,
        target: Target,
        *,
        fallbacks: tuple[Target, ...] = (),
        env: dict[str, str] | None = None,
        policy: RetryPolicy | None = None,
        request: Request = REQUEST,
    ) -> Response:
        async def on_retry(event: AgentLlmRetry) -> None:
            self.retries.append(event)

        async def on_failover(event: AgentFailover) -> None:
            self.failovers.append(event)

        async def sink(event: StreamEvent) -> None:
            self.events.append(event)

        async def main() -> Response:
            started = trio.current_time()
            try:
                return await complete(
                    request,
                    target,
                    fallbacks=fallbacks,
                    env=provider_env(server) if env is None else env,
                    sink=sink,
                    policy=policy or RetryPolicy(),
                    on_retry=on_retry,
                    on_failover=on_failover,
                    rng=random.Random(7),
                )
            finally:
                self.elapsed = trio.current_time() - started

        with virtual_clock() as clock:
            return trio.run(main, clock=clock)


@pytest.mark.parametrize("target", [ANTHROPIC, OPENAI, GEMINI], ids=str)
def test_rate_limit_waits_for_retry_after_then_succeeds(
    llm_server: LlmServer, target: Target
) -> None:
    llm_server.script(rate_limited(retry_after=7), Reply(text="after the wait"))
    run = Run()
    response = run(llm_server, target)

    assert response.text == "after the wait"
    assert len(llm_server.requests) == 2
    assert run.elapsed == pytest.approx(7.0)
    [retry] = run.retries
    assert (retry.provider, retry.model, retry.attempt, retry.delay_secs) == (
        target.provider,
        target.model,
        2,
        7.0,
    )
    assert retry.error["kind"] == "rate_limited" and retry.error["status"] == 429
    assert retry.error["failure_class"] == "transient_infra"


def test_retry_after_beyond_the_cap_fails_instead_of_stalling(llm_server: LlmServer) -> None:
    llm_server.script(rate_limited(retry_after=120))
    run = Run()
    with pytest.raises(RateLimited) as caught:
        run(llm_server, ANTHROPIC)
    assert caught.value.retry_after == 120
    assert run.retries == [] and run.elapsed == 0
    assert len(llm_server.requests) == 1


def test_server_errors_back_off_exponentially_with_jitter(llm_server: LlmServer) -> None:
    llm_server.script(
        server_error(), server_error(), server_error(), Reply(text="third time lucky")
    )
    run = Run()
    response = run(llm_server, OPENAI)

    assert response.text == "third time lucky"
    assert [retry.attempt for retry in run.retries] == [2, 3, 4]
    delays = [retry.delay_secs for retry in run.retries]
    for delay, base in zip(delays, (1.0, 2.0, 4.0), strict=True):
        assert 0.5 * base <= delay <= 1.5 * base
    assert run.elapsed == pytest.approx(sum(delays), abs=0.01)
    assert all(retry.error["kind"] == "server_error" for retry in run.retries)


def test_retries_give_up_after_the_policy_limit(llm_server: LlmServer) -> None:
    llm_server.script(*[server_error()] * 5)
    run = Run()
    with pytest.raises(ServerError) as caught:
        run(llm_server, GEMINI, policy=RetryPolicy(max_retries=2))
    assert len(llm_server.requests) == 3 and len(run.retries) == 2
    assert "The server had an internal error" in str(caught.value)
    assert caught.value.status == 500


@pytest.mark.parametrize("target", [ANTHROPIC, OPENAI, GEMINI], ids=str)
def test_dropped_stream_is_retried_and_the_new_attempt_restarts_output(
    llm_server: LlmServer, target: Target
) -> None:
    llm_server.script(
        Drop(Reply(text="this answer is cut off before it ends"), after=4),
        Reply(text="whole answer"),
    )
    run = Run()
    response = run(llm_server, target)

    assert response.text == "whole answer"
    [retry] = run.retries
    assert retry.error["kind"] == "stream_dropped"
    starts = [i for i, event in enumerate(run.events) if isinstance(event, OutputStart)]
    assert len(starts) == 2, (
        "each attempt announces its start, so a consumer drops the partial text"
    )
    after_restart = run.events[starts[1] :]
    assert "".join(e.delta for e in after_restart if isinstance(e, TextDelta)) == "whole answer"


# SSE events before the first half of a lone tool call's arguments is out, per format:
# Anthropic's message_start, ping, block start and a first delta; the Responses API's
# created, in_progress, item added and a first delta; Chat Completions' role chunk, the
# call's opening and a first delta.
HALF_A_CALL_IN = {"anthropic": 4, "openai": 4, "gemini": 3}


@pytest.mark.parametrize("target", [ANTHROPIC, OPENAI, GEMINI], ids=str)
def test_a_stream_dropped_mid_tool_call_is_retried_and_only_the_whole_call_comes_out(
    llm_server: LlmServer, target: Target
) -> None:
    append = ToolUse("shell", {"command": "echo once >> ran.txt"}, id="s1")
    llm_server.script(
        Drop(reply=Reply(text="", tool_calls=(append,)), after=HALF_A_CALL_IN[target.provider]),
        Reply(text="", tool_calls=(append,)),
    )
    run = Run()
    response = run(llm_server, target)

    [retry] = run.retries
    assert retry.error["kind"] == "stream_dropped"
    [call] = response.tool_calls
    assert (call.id, call.name, call.arguments) == ("s1", "shell", append.arguments)
    # Nothing of the cut call was handed on: one call, ready once, from the second attempt.
    assert [event.call for event in run.events if isinstance(event, ToolCallReady)] == [call]
    assert len(llm_server.requests) == 2
    assert llm_server.requests[1].body == llm_server.requests[0].body


@pytest.mark.parametrize(
    ("target", "variable"),
    [(ANTHROPIC, "ANTHROPIC_API_KEY"), (OPENAI, "OPENAI_API_KEY"), (GEMINI, "GEMINI_API_KEY")],
    ids=str,
)
def test_rejected_key_is_deterministic_names_the_variable_and_skips_failover(
    llm_server: LlmServer, target: Target, variable: str
) -> None:
    llm_server.script(unauthorized())
    run = Run()
    with pytest.raises(AuthenticationFailed) as caught:
        run(llm_server, target, fallbacks=(Target("kimi", "kimi-k2.5"),))
    err = caught.value
    assert err.failure_class == "deterministic" and not err.retryable and not err.failover
    assert err.status == 401
    assert variable in str(err) and "Using a real model" in str(err)
    assert "Incorrect API key provided" in str(err)
    assert len(llm_server.requests) == 1 and run.retries == [] and run.failovers == []


@pytest.mark.parametrize(
    ("target", "variables"),
    [
        (ANTHROPIC, "ANTHROPIC_API_KEY"),
        (OPENAI, "OPENAI_API_KEY"),
        (GEMINI, "GEMINI_API_KEY or GOOGLE_API_KEY"),
    ],
    ids=str,
)
def test_missing_key_names_the_variable_before_any_request(
    llm_server: LlmServer, target: Target, variables: str
) -> None:
    run = Run()
    with pytest.raises(MissingCredentials) as caught:
        run(llm_server, target, env={})
    assert f"set {variables}" in str(caught.value)
    # Only this provider's variables.
    others = {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"} - set(variables.split())
    assert not any(other in str(caught.value) for other in others)
    assert "Using a real model" in str(caught.value)
    assert llm_server.requests == []


def test_google_api_key_is_accepted_for_gemini(llm_server: LlmServer) -> None:
    env = {"GOOGLE_API_KEY": "google-key", "GEMINI_BASE_URL": llm_server.url + "/v1beta/openai"}
    assert Run()(llm_server, GEMINI, env=env).text == "ok"
    assert llm_server.requests[0].headers["authorization"] == "Bearer google-key"


def test_quota_is_not_retried_but_fails_over_to_the_next_provider(llm_server: LlmServer) -> None:
    llm_server.script(quota_exhausted(), Reply(text="from the fallback"))
    run = Run()
    response = run(llm_server, OPENAI, fallbacks=(ANTHROPIC,))

    assert response.text == "from the fallback" and response.target == ANTHROPIC
    assert [request.api for request in llm_server.requests] == ["responses", "anthropic"]
    assert run.retries == []
    [failover] = run.failovers
    assert (failover.from_provider, failover.from_model) == ("openai", "gpt-5.4")
    assert (failover.to_provider, failover.to_model) == ("anthropic", "claude-sonnet-4-6")
    assert "exceeded your current quota" in failover.error


def test_anthropic_billing_error_is_a_quota_error(llm_server: LlmServer) -> None:
    llm_server.script(quota_exhausted())
    with pytest.raises(QuotaExhausted) as caught:
        Run()(llm_server, ANTHROPIC)
    assert caught.value.failure_class == "budget_exhausted"


def test_failover_after_retries_are_exhausted_and_unconfigured_fallbacks_are_skipped(
    llm_server: LlmServer,
) -> None:
    llm_server.script(server_error(), server_error(), Reply(text="gemini answers"))
    env = provider_env(llm_server)
    del env["KIMI_API_KEY"]
    run = Run()
    response = run(
        llm_server,
        ANTHROPIC,
        fallbacks=(Target("kimi", "kimi-k2.5"), GEMINI),
        env=env,
        policy=RetryPolicy(max_retries=1),
    )
    assert response.target == GEMINI
    assert [request.api for request in llm_server.requests] == ["anthropic", "anthropic", "chat"]
    assert len(run.retries) == 1
    [failover] = run.failovers
    assert (failover.from_provider, failover.to_provider) == ("anthropic", "gemini")


def test_a_request_that_times_out_is_retried(llm_server: LlmServer) -> None:
    """On the real clock: the client's own read timeout, then a quick second attempt."""
    llm_server.script(Stall(seconds=3.0), Reply(text="in time"))
    retries: list[AgentLlmRetry] = []

    async def on_retry(event: AgentLlmRetry) -> None:
        retries.append(event)

    async def main() -> Response:
        return await complete(
            Request(messages=(Message.user("hi"),), timeout=0.5),
            GEMINI,
            env=provider_env(llm_server),
            policy=RetryPolicy(initial_delay=0.01),
            on_retry=on_retry,
        )

    assert trio.run(main).text == "in time"
    [retry] = retries
    assert retry.error["kind"] == "timeout"


def test_a_local_server_without_its_url_names_the_variable(llm_server: LlmServer) -> None:
    with pytest.raises(
        MissingCredentials, match="no server URL for provider 'ollama': set OLLAMA_BASE_URL"
    ):
        Run()(llm_server, Target("ollama", "llama3.2"), env={})


@pytest.mark.parametrize("target", [ANTHROPIC, OPENAI, GEMINI], ids=str)
def test_an_error_event_inside_the_stream_is_retried(llm_server: LlmServer, target: Target) -> None:
    llm_server.script(StreamError(after=5), Reply(text="recovered"))
    run = Run()
    assert run(llm_server, target).text == "recovered"
    [retry] = run.retries
    assert retry.error["kind"] == "server_error"
    assert "overloaded" in retry.error["message"]


# A line of the stream that is not the provider's format: JSON cut short, or JSON of
# another shape (each API's text delta with the delta missing).
GARBAGE = {
    "cut short": '{"type": "content_block_delta", "index": 0, "delta": ',
    "misshapen": (
        '{"type": "response.output_text.delta", "index": 0, "item_id": 5,'
        ' "choices": [{"index": 0, "delta": 7}], "delta": {"type": 9}}'
    ),
}


@pytest.mark.parametrize("target", [ANTHROPIC, OPENAI, GEMINI], ids=str)
@pytest.mark.parametrize("garbage", list(GARBAGE))
def test_a_stream_line_not_in_the_providers_format_is_retried_as_a_broken_stream(
    llm_server: LlmServer, target: Target, garbage: str
) -> None:
    # What a model's endpoint sends is untrusted: noise in the stream is a broken
    # stream (retried, then a failed stage that says so), never a crash.
    llm_server.script(Garbled(data=GARBAGE[garbage]), Reply(text="recovered"))
    run = Run()
    assert run(llm_server, target).text == "recovered"
    [retry] = run.retries
    assert retry.error["kind"] == "stream_dropped"
    message = retry.error["message"]
    # A line an adapter cannot read says so; one it can read but finds no use for
    # leaves the reply unfinished.
    assert "not in the provider's format" in message or "stream ended before" in message
