"""Prompt and agent stages on a real provider.

A prompt stage (`shape=tab`) is one model call without tools; an agent stage
(`shape=box`) runs the agent loop (`fabro_git.agent`) in the stage's worktree. Both
pick their target with `fabro_git.llm.choice`, stream their `agent.*` events stamped
with the stage, record `prompt.md`/`response.md`, and end with the outcome the reply's
routing directives give, with the tokens and cost spent. A model error the provider
layer could not mend ends the stage failed with its failure class (a rejected key is
`deterministic`, an outage that outlasted the retries `transient_infra`).
Cancellation (Ctrl-C, the node's `timeout`) is trio's and passes through untouched.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from fabro_git import redact
from fabro_git.engine.outcome import BUDGET, DETERMINISTIC, TRANSIENT, Outcome, Usage
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import ConfigError
from fabro_git.events.catalogue import (
    UNSCOPED_EVENTS,
    AgentError,
    AgentMcpFailed,
    AgentMessage,
    AgentSessionEnded,
    AgentSessionStarted,
    InterviewCompleted,
    InterviewStarted,
    StagePrompt,
)
from fabro_git.events.envelope import EventProps
from fabro_git.handlers.prompting import outcome_from_reply, recorded_reply, thread_of
from fabro_git.jsondata import JsonValue
from fabro_git.llm import catalogue
from fabro_git.llm import types as llm
from fabro_git.llm.choice import effort_of, stage_fallbacks, stage_target
from fabro_git.llm.errors import LlmError

if TYPE_CHECKING:
    from fabro_git.agent.mcp import McpServerSpec
    from fabro_git.agent.permissions import Answer, Level, PermissionGate
    from fabro_git.agent.session import AgentLimits, AgentResult, Conversation, ToolSet
    from fabro_git.llm.client import RetryPolicy
    from fabro_git.outputs.directives import StatusFile
    from fabro_git.workflow.model import Node

DEFAULT_PROMPT_MAX_TOKENS = 4096
DEFAULT_AGENT_MAX_TOKENS = 16384
# Model calls an agent stage may make (`max_turns`; 0: no limit).
DEFAULT_AGENT_MAX_TURNS = 200


def new_session_id() -> str:
    return f"ses_{uuid.uuid4().hex[:16]}"


def _target(req: StageRequest) -> tuple[llm.Target, list[llm.Target]]:
    model, provider = req.run_model
    target = stage_target(req.node, model=model, provider=provider, env=os.environ)
    return target, stage_fallbacks(req.model_fallbacks)


def _effort(req: StageRequest) -> llm.ReasoningEffort | None:
    return effort_of(req.node)


def _idle_timeout(req: StageRequest) -> float:
    """`[run.agent] stream_idle_timeout`, or the default."""
    from fabro_git.config.run_config import stream_idle_timeout

    return stream_idle_timeout(req.agent_config) or llm.DEFAULT_IDLE_TIMEOUT


def _retry_policy(req: StageRequest) -> RetryPolicy:
    """`[run.agent] request_retries` and `request_retry_delay` over the defaults."""
    from fabro_git.config.run_config import request_retry_delay
    from fabro_git.llm.client import RetryPolicy

    agent = req.agent_config
    default = RetryPolicy()
    retries = agent.request_retries
    delay = request_retry_delay(agent.request_retry_delay)
    return RetryPolicy(
        max_retries=retries if retries is not None else default.max_retries,
        initial_delay=delay if delay is not None else default.initial_delay,
    )


def _mcp_specs(
    req: StageRequest, base: dict[str, str]
) -> tuple[list[McpServerSpec], list[tuple[str, str, bool]]]:
    """The run's MCP servers, `{{ env.NAME }}` references resolved, a stdio server's
    environment the stage's (`base`) and its own `env`; and those that cannot be
    (server, error, required)."""
    from fabro_git.agent.mcp import McpServerSpec
    from fabro_git.config.run_config import (
        env_references_as_variables,
        mcp_timeouts,
        resolve_env_references,
    )

    specs: list[McpServerSpec] = []
    broken: list[tuple[str, str, bool]] = []
    for name, server in sorted(req.mcp_servers.items()):
        where = f"run.agent.mcps.{name}"

        def fill(text: str, key: str, where: str = where) -> str:
            return resolve_env_references(text, os.environ, f"{where}.{key}")

        try:
            passed: dict[str, str] = {}
            if server.script is not None:
                # Values go in the environment: shell text is code.
                line, passed = env_references_as_variables(
                    server.script, os.environ, f"{where}.script"
                )
                argv = ["/bin/sh", "-c", line]
            else:
                argv = [fill(part, "command") for part in server.command or []]
                _notice_secrets_in_argv(req, where, server.command or [])
            startup, tool = mcp_timeouts(server)
            specs.append(
                McpServerSpec(
                    name=name,
                    transport=server.type,
                    argv=argv,
                    env={
                        **base,
                        **{k: fill(v, f"env.{k}") for k, v in server.env.items()},
                        **passed,
                    },
                    url=fill(server.url or "", "url"),
                    headers={k: fill(v, f"headers.{k}") for k, v in server.headers.items()},
                    startup_timeout=startup,
                    tool_timeout=tool,
                    required=server.required,
                )
            )
        except ConfigError as err:
            broken.append((name, str(err), server.required))
    return specs, broken


def permission_level(req: StageRequest) -> tuple[Level, str]:
    """The agent's permission level and where it was set: the node's `permissions`,
    else `[run.agent] permissions` (which `--permissions` sets), else the default.
    Validation refuses a level that is none; the engine checks again here."""
    from fabro_git.agent.permissions import DEFAULT_LEVEL, check_level

    for value, source in (
        (
            req.node.get("permissions"),
            f"permissions={req.node.get('permissions')} on the node",
        ),
        (req.agent_config.permissions, "the run's [run.agent] permissions"),
    ):
        if value:
            level = check_level(str(value))
            if level is None:
                raise ConfigError(
                    f"node {req.node.id!r}: permissions {value!r} is no level; "
                    "use read-only, read-write or full"
                )
            return level, source
    return DEFAULT_LEVEL, "the default"


def permission_gate(req: StageRequest, emit: Callable[[EventProps], object]) -> PermissionGate:
    """The stage's gate: its level, and the run's terminal to ask beyond it, when a
    person is there (through the run's interviewer, as a human gate asks)."""
    from fabro_git.agent.permissions import PermissionGate, answer_of, describe_call
    from fabro_git.engine.interviewer import Choice, Question, match

    level, source = permission_level(req)
    if not req.person_at_terminal:
        return PermissionGate(level, source=source)
    choices = [
        Choice("y", "yes", "yes"),
        Choice("a", "always", "always"),
        Choice("n", "no", "no"),
    ]

    async def ask(tool: str, arguments: Mapping[str, JsonValue]) -> Answer | None:
        text = f"Agent {req.node_id} wants to run: {describe_call(tool, arguments)}. Allow it?"
        emit(InterviewStarted(question=text, question_type="multiple_choice"))
        started = time.monotonic()
        answer = await req.interviewer.ask(Question(text=text, choices=choices, default=None))
        chosen = match(answer, choices) if answer is not None else None
        said = answer_of(chosen.target) if chosen is not None else None
        emit(
            InterviewCompleted(
                question=text,
                answer=said or "",
                duration_ms=int((time.monotonic() - started) * 1000),
            )
        )
        return said

    return PermissionGate(level, ask=ask, source=source)


def stage_usage(model: str, used: llm.Usage, cost: float | None) -> Usage:
    return Usage(
        model=model,
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        cache_read_tokens=used.cache_read_tokens or None,
        cache_write_tokens=used.cache_write_tokens or None,
        reasoning_tokens=used.reasoning_tokens or None,
        cost=cost,
    )


def _error_text(error: Mapping[str, JsonValue]) -> str:
    """An `LlmError.to_dict()` as the stage's error: who failed and what they said, and
    for a refused key which variable to check."""
    if error.get("kind") == "mcp_required":
        return str(error.get("message"))
    status = f" (HTTP {error['status']})" if error.get("status") is not None else ""
    text = f"{error.get('provider')}/{error.get('model')}{status}: {error.get('message')}"
    if error.get("kind") == "authentication":
        info = catalogue.PROVIDERS.get(str(error.get("provider")))
        if info is not None:
            text += f"; check {' or '.join(info.key_env)}"
    return text


async def _conversation(req: StageRequest, thread: str | None) -> Conversation:
    """The conversation the stage carries on: its thread's, or a new one."""
    import msgspec

    from fabro_git.agent.session import Conversation

    data = await req.load_thread(thread) if thread else None
    if data is None:
        return Conversation()
    try:
        return Conversation.from_bytes(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(
            f"node {req.node.id!r}: the conversation of thread {thread!r} on the run's "
            f"metadata cannot be read ({exc}); give the node another thread_id to start afresh"
        ) from exc


def _without_tool_rounds(messages: list[llm.Message]) -> list[llm.Message]:
    """A thread's history for a call without tools: tool calls and their results become
    text, since some providers refuse tool turns in a request that offers no tools."""
    out: list[llm.Message] = []
    for message in messages:
        if message.tool_calls:
            calls = "\n".join(
                f"[called {call.name} {redact.clip(json.dumps(call.arguments), 2000)}]"
                for call in message.tool_calls
            )
            text = f"{message.text}\n\n{calls}" if message.text else calls
            out.append(llm.Message(role="assistant", text=text))
        elif message.role == "tool":
            results = "\n\n".join(
                f"[result{' (error)' if result.is_error else ''}]\n{result.content}"
                for result in message.tool_results
            )
            out.append(llm.Message.user(results))
        else:
            out.append(message)
    return out


async def run_prompt(
    req: StageRequest, body: str, preamble: str, status_file: StatusFile
) -> Outcome:
    """One call, no tools: the preamble and the node's prompt in, the reply out. A node
    on a thread sends the thread's history first (and no preamble once it has one)."""
    from fabro_git.llm import usage as llm_usage
    from fabro_git.llm.client import complete

    node = req.node
    target, fallbacks = _target(req)
    thread = thread_of(req)
    history = await _conversation(req, thread)
    prompt = body if history.messages else preamble + body
    req.emit(StagePrompt(text=prompt))
    req.files["prompt.md"] = prompt.encode()
    request = llm.Request(
        messages=(*_without_tool_rounds(history.messages), llm.Message.user(prompt)),
        max_tokens=node.get_int("max_tokens", DEFAULT_PROMPT_MAX_TOKENS),
        reasoning_effort=_effort(req),
        idle_timeout=_idle_timeout(req),
        # The reply streams to the stage's response.md as it arrives: a long one is
        # never whole in memory (`recorded_reply`).
        text_file=str(req.stage_dir / "response.md"),
    )

    # The one call is a session of its own, as an agent stage's loop is: its events
    # carry the session's id between its started and ended.
    session_id = new_session_id()

    async def forward(event: llm.StreamEvent) -> None:
        props = llm_usage.stream_event(event)
        if props is not None:
            req.emit(props, session_id=session_id)

    async def report(props: EventProps) -> None:
        req.emit(props, session_id=session_id)

    req.emit_session(
        AgentSessionStarted(provider=target.provider, model=target.model),
        session_id=session_id,
    )
    try:
        response = await complete(
            request,
            target,
            fallbacks=fallbacks,
            env=os.environ,
            sink=forward,
            policy=_retry_policy(req),
            on_retry=report,
            on_failover=report,
            on_notice=report,
        )
        req.emit(llm_usage.message_event(response), session_id=session_id)
    except LlmError as err:
        req.emit(AgentError(error=err.to_dict()), session_id=session_id)
        return Outcome.failure(_error_text(err.to_dict()), err.failure_class)
    finally:
        req.emit_session(AgentSessionEnded(), session_id=session_id)
    value = await recorded_reply(req, response.text, response.text_file, response.length)
    if thread:
        history.messages += [llm.Message.user(prompt), response.as_message()]
        history.turns += 1
        req.save_thread(thread, history.to_bytes())
    result = await outcome_from_reply(req.node.id, response.text, value, status_file)
    result.usage = stage_usage(
        response.target.model,
        response.usage,
        llm_usage.estimate_cost(response.target.model, response.usage),
    )
    return result


async def run_agent(
    req: StageRequest, body: str, preamble: str, status_file: StatusFile
) -> Outcome:
    """The agent loop in the stage's worktree until the model answers in text."""
    from fabro_git.agent.session import AgentSession
    from fabro_git.agent.subagents import DEFAULT_MAX_DEPTH, SubAgents

    node = req.node
    target, fallbacks = _target(req)
    thread = thread_of(req)
    conversation = await _conversation(req, thread)
    if conversation.messages:
        preamble = ""  # the thread's history already holds what a preamble would say
    req.emit(StagePrompt(text=preamble + body))
    req.files["prompt.md"] = (preamble + body).encode()
    session_id = new_session_id()
    # The model that answered last: after a failover, a fallback's.
    served = [target.model]

    def stamp(props: EventProps, session: str, parent: str | None = None) -> None:
        if props.NAME in UNSCOPED_EVENTS:
            req.emit_session(props, session_id=session, parent_session_id=parent)
        else:
            req.emit(props, session_id=session, parent_session_id=parent)

    def forward(props: EventProps) -> None:
        if isinstance(props, AgentMessage):
            served[0] = props.model
        stamp(props, session_id)

    depth = max(0, node.get_int("max_subagent_depth", DEFAULT_MAX_DEPTH))
    subagents = SubAgents(stamp, max_depth=depth)

    # What the shell tool and MCP stdio servers run with: the stage's environment.
    stage_env = req.environment()
    mcp_toolsets, refused = _mcp_toolsets(req, stage_env, forward)
    if refused is not None:
        return refused
    session = AgentSession(
        req.worktree,
        target=target,
        fallbacks=fallbacks,
        emit=forward,
        limits=_limits(node),
        env=os.environ,
        shell_env=stage_env,
        session_id=session_id,
        conversation=conversation,
        thread_id=thread,
        visit=req.visit,
        reasoning_effort=_effort(req),
        stream_idle_timeout=_idle_timeout(req),
        retry_policy=_retry_policy(req),
        on_process_group=req.on_process_group,
        toolsets=[*mcp_toolsets, *subagents.toolsets()],
        tool_hooks=req.tool_hooks,
        guard_config=req.worktree if req.in_place else None,
        # Each reply streams to response.md as it arrives, as a prompt stage's does:
        # the final one is stored from there, never whole in memory.
        text_file=str(req.stage_dir / "response.md"),
        permissions=permission_gate(req, forward),
    )

    async def timed_out(seconds: float) -> Outcome:
        done = session.result()
        return Outcome.failure(
            f"agent stage {node.id} timed out after {seconds:g}s ({done.turns} model calls)",
            TRANSIENT,
            files_touched=list(done.files_touched),
            usage=stage_usage(served[0], done.usage, done.cost),
        )

    req.on_timeout(timed_out)
    with req.take_steering(session.steer):
        result = await session.run(body, preamble=preamble)
    await _keep_reply(req, result)
    if thread and result.status in ("completed", "turn_limit"):
        req.save_thread(thread, session.conversation.to_bytes())
    spent = stage_usage(served[0], result.usage, result.cost)
    return await _agent_outcome(req, result, spent, status_file)


def _limits(node: Node) -> AgentLimits:
    """The session's limits a node sets: tokens a reply, model calls a session."""
    from fabro_git.agent.session import AgentLimits

    return AgentLimits(
        max_tokens=node.get_int("max_tokens", DEFAULT_AGENT_MAX_TOKENS),
        max_turns=max(0, node.get_int("max_turns", DEFAULT_AGENT_MAX_TURNS)),
    )


async def _keep_reply(req: StageRequest, result: AgentResult) -> None:
    """The reply the stage records: response.md streamed as it came unless the last
    turn's was not the one stored, and the text itself when the session failed."""
    if result.text_file is None:
        # The file holds a turn's raw reply that is not the one stored: gone, so the
        # scratch dir keeps no unmasked copy of it.
        import trio

        raw = req.stage_dir / "response.md"
        await trio.to_thread.run_sync(lambda: raw.unlink(missing_ok=True))
    if result.status in ("failed", "turn_limit"):  # no response.<node>: kept as it is
        req.files["response.md"] = result.text.encode("utf-8", "backslashreplace")


def _notice_secrets_in_argv(req: StageRequest, where: str, command: list[str]) -> None:
    """A `run.notice` when `command` puts a secret-named variable's value on the server's
    command line, which every user of the machine can read (`/proc/<pid>/cmdline`)."""
    from fabro_git.config.run_config import ENV_REFERENCE
    from fabro_git.events.catalogue import RunNotice
    from fabro_git.redact import is_secret_name

    named = {m.group(1) for part in command for m in ENV_REFERENCE.finditer(part)}
    secrets = sorted(name for name in named if is_secret_name(name))
    if secrets:
        req.emit(
            RunNotice(
                level="warn",
                code="secret_on_command_line",
                message=f"{where}.command puts {', '.join(secrets)} on the MCP server's "
                "command line, where every user of this machine can read it; pass it in "
                f"[{where}.env] instead",
            )
        )


def _mcp_toolsets(
    req: StageRequest, stage_env: dict[str, str], forward: Callable[[EventProps], None]
) -> tuple[list[ToolSet], Outcome | None]:
    """The toolset of the stage's MCP servers, each that cannot start reported; with the
    stage's failure instead when a required one is among them."""
    servers, broken = _mcp_specs(req, stage_env)
    for name, error, required in broken:
        forward(AgentMcpFailed(server_name=name, error=error))
        if required:
            return [], Outcome.failure(
                f"MCP server {name!r} is required and cannot start: {error}",
                DETERMINISTIC,
            )
    if not servers:
        return [], None
    from fabro_git.agent.mcp import toolset

    return [toolset(servers, log_dir=req.stage_dir)], None


async def _agent_outcome(
    req: StageRequest, result: AgentResult, spent: Usage, status_file: StatusFile
) -> Outcome:
    """The stage's outcome from how the agent's session ended."""
    touched = list(result.files_touched)
    if result.status == "failed":
        error = _error_text(result.error or {})
        return Outcome.failure(
            error,
            result.failure_class or DETERMINISTIC,
            files_touched=touched,
            usage=spent,
            response=result.text or None,
        )
    if result.status == "turn_limit":
        return Outcome.failure(
            f"agent stage {req.node.id} reached its turn limit ({result.turns} model calls) "
            "without a final answer",
            BUDGET,
            files_touched=touched,
            usage=spent,
        )
    value = await recorded_reply(req, result.text, result.text_file, result.text_chars or 0)
    outcome = await outcome_from_reply(req.node.id, result.text, value, status_file)
    outcome.files_touched = touched
    outcome.usage = spent
    return outcome
