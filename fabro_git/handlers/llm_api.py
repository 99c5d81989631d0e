"""Prompt and agent stages on a real provider.

A prompt stage (`shape=tab`) is one model call without tools; an agent stage
(`shape=box`) runs the agent loop (`fabro_git.agent`) in the stage's worktree. Both
pick their target with `fabro_git.engine.model_choice`, stream their `agent.*` events stamped
with the stage, record `prompt.md`/`response.md`, and end with the outcome the reply's
routing directives give, with the tokens and cost spent. A model error the provider
layer could not mend ends the stage failed with its failure class (a rejected key is
`deterministic`, an outage that outlasted the retries `transient_infra`).
Cancellation (Ctrl-C, the node's `timeout`) is trio's and passes through untouched.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from fabro_git.engine import outcome as oc
from fabro_git.engine.model_choice import (
    CLI_UNAVAILABLE,
    backend_of,
    effort_of,
    stage_fallbacks,
    stage_target,
)
from fabro_git.engine.outcome import Outcome, Usage
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import ConfigError
from fabro_git.events.catalogue import AgentError, AgentMessage, StagePrompt
from fabro_git.events.contract import UNSCOPED_EVENTS
from fabro_git.events.envelope import EventProps
from fabro_git.handlers.llm import outcome_from_response
from fabro_git.llm import catalogue
from fabro_git.llm import types as llm
from fabro_git.llm.errors import LlmError

DEFAULT_PROMPT_MAX_TOKENS = 4096
DEFAULT_AGENT_MAX_TOKENS = 16384


def _target(req: StageRequest) -> tuple[llm.Target, list[llm.Target]]:
    model, provider = req.run_model
    target = stage_target(req.node, model=model, provider=provider, env=os.environ)
    return target, stage_fallbacks(req.model_fallbacks)


def _effort(req: StageRequest) -> Any:
    return effort_of(req.node)


def _usage(model: str, used: llm.Usage, cost: float | None) -> Usage:
    return Usage(
        model=model,
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        cache_read_tokens=used.cache_read_tokens or None,
        cache_write_tokens=used.cache_write_tokens or None,
        reasoning_tokens=used.reasoning_tokens or None,
        cost=cost,
    )


def _error_text(error: dict[str, Any]) -> str:
    """An `LlmError.to_dict()` as the stage's error: who failed and what they said, and
    for a refused key which variable to check."""
    status = f" (HTTP {error['status']})" if error.get("status") is not None else ""
    text = f"{error.get('provider')}/{error.get('model')}{status}: {error.get('message')}"
    if error.get("kind") == "authentication":
        info = catalogue.PROVIDERS.get(str(error.get("provider")))
        if info is not None:
            text += f"; check {' or '.join(info.key_env)}"
    return text


async def run_prompt(req: StageRequest, body: str, preamble: str) -> Outcome:
    """One call, no tools: the preamble and the node's prompt in, the reply out."""
    from fabro_git.llm import usage as llm_usage
    from fabro_git.llm.client import complete

    node = req.node
    target, fallbacks = _target(req)
    prompt = preamble + body
    req.emit(StagePrompt(text=prompt))
    req.files["prompt.md"] = prompt.encode()
    request = llm.Request(
        messages=(llm.Message.user(prompt),),
        max_tokens=node.get_int("max_tokens", DEFAULT_PROMPT_MAX_TOKENS),
        reasoning_effort=_effort(req),
    )

    budget = llm_usage.TextBudget()

    async def forward(event: llm.StreamEvent) -> None:
        props = llm_usage.stream_event(event, budget)
        if props is not None:
            req.emit(props)

    async def report(props: EventProps) -> None:
        req.emit(props)

    try:
        response = await complete(
            request,
            target,
            fallbacks=fallbacks,
            env=os.environ,
            sink=forward,
            on_retry=report,
            on_failover=report,
        )
    except LlmError as err:
        req.emit(AgentError(error=err.to_dict()))
        return Outcome.failure(_error_text(err.to_dict()), err.failure_class)
    req.emit(llm_usage.message_event(response))
    req.files["response.md"] = response.text.encode()
    result = outcome_from_reply(req, response.text)
    result.usage = _usage(
        response.target.model,
        response.usage,
        llm_usage.estimate_cost(response.target.model, response.usage),
    )
    return result


async def run_agent(req: StageRequest, body: str, preamble: str) -> Outcome:
    """The agent loop in the stage's worktree until the model answers in text."""
    from fabro_git.agent.session import AgentLimits, AgentSession

    node = req.node
    if backend_of(node) == "cli":
        raise ConfigError(f"node {node.id!r}: {CLI_UNAVAILABLE}")
    target, fallbacks = _target(req)
    req.emit(StagePrompt(text=preamble + body))
    req.files["prompt.md"] = (preamble + body).encode()
    session_id = f"ses_{uuid.uuid4().hex[:16]}"
    # The model that answered last: after a failover, a fallback's.
    served = [target.model]

    def forward(props: EventProps) -> None:
        if isinstance(props, AgentMessage):
            served[0] = props.model
        if props.NAME in UNSCOPED_EVENTS:
            req.emit_session(props, session_id=session_id)
        else:
            req.emit(props, session_id=session_id)

    session = AgentSession(
        req.worktree,
        target=target,
        fallbacks=fallbacks,
        emit=forward,
        limits=AgentLimits(max_tokens=node.get_int("max_tokens", DEFAULT_AGENT_MAX_TOKENS)),
        env=os.environ,
        session_id=session_id,
        thread_id=node.get("thread_id"),
        visit=req.visit,
        reasoning_effort=_effort(req),
        on_process_group=req.on_process_group,
    )

    def timed_out(seconds: float) -> Outcome:
        done = session.result()
        return Outcome.failure(
            f"agent stage {node.id} timed out after {seconds:g}s ({done.turns} model calls)",
            oc.TRANSIENT,
            files_touched=list(done.files_touched),
            usage=_usage(served[0], done.usage, done.cost),
        )

    req.on_timeout(timed_out)
    with req.take_steering(session.steer):
        result = await session.run(body, preamble=preamble)
    req.files["response.md"] = result.text.encode()
    spent = _usage(served[0], result.usage, result.cost)
    touched = list(result.files_touched)
    if result.status == "failed":
        error = _error_text(result.error or {})
        return Outcome.failure(
            error,
            result.failure_class or oc.DETERMINISTIC,
            files_touched=touched,
            usage=spent,
            response=result.text or None,
        )
    if result.status == "turn_limit":
        return Outcome.failure(
            f"agent stage {node.id} reached its turn limit ({result.turns} model calls) "
            "without a final answer",
            oc.BUDGET,
            files_touched=touched,
            usage=spent,
        )
    outcome = outcome_from_reply(req, result.text)
    outcome.files_touched = touched
    outcome.usage = spent
    return outcome


def outcome_from_reply(req: StageRequest, text: str) -> Outcome:
    return outcome_from_response(req.node.id, text, req.worktree)
