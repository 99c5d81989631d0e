"""The agent loop: ask the model, run the tools it calls, repeat until it answers in text.

One `AgentSession` serves one agent stage. `run()` sends the conversation with the
profile's tools, streams the answer out as `agent.*` events, executes each tool call in
order (a failing tool is an error result the model reads, never a stage failure), and
goes round again until the model stops calling tools or the turn limit is reached.
Around that core:

- **Loop detection.** When the last `loop_window` calls repeat one pattern (one, two or
  three calls long), `agent.loop.detected` is emitted and the model is told to change
  course.
- **Compaction.** When the next request would fill most of the context window, the
  older turns are summarised by one extra model call and replaced by the summary, so a
  long session carries on instead of failing on an oversized request.
- **Steering.** `steer(text)` queues guidance; it joins the conversation as a user
  message before the next model call, never in the middle of a tool round.
- **Cancellation.** Trio cancellation (Ctrl-C, a stage timeout) stops the model's
  stream and kills the running shell's process group; the session's closing events
  are emitted all the same, and `result()` still describes the work done.
- **Tool sets.** Tools beyond the built-in ones (sub-agents, MCP servers) come from
  `toolsets`: async context managers entered when a run starts and left when it ends,
  inside the run's cancel scope, so whatever they start lives and dies with the run.

The conversation is a msgspec value (`Conversation.to_bytes()`), so a stage that keeps a
thread can store it in a checkpoint and a later visit can carry on from it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Literal, Protocol

import msgspec
import trio

from fabro_git.agent import memory as memory_files
from fabro_git.agent import skills as skill_files
from fabro_git.agent.mcp import McpRequiredError
from fabro_git.agent.permissions import PermissionGate
from fabro_git.agent.profiles import PROFILE_BASE, profile_of
from fabro_git.agent.tools import (
    PROFILE_TOOLS,
    TOOLS,
    Tool,
    ToolContext,
    ToolOutcome,
    check_arguments,
)
from fabro_git.agent.truncation import (
    DEFAULT_LIMITS,
    FALLBACK_LIMIT,
    OutputLimit,
    truncate_tool_output,
)
from fabro_git.agent.workspace import ToolError, Workspace
from fabro_git.events.catalogue import (
    AgentCompactionCompleted,
    AgentCompactionStarted,
    AgentError,
    AgentFailover,
    AgentInput,
    AgentLlmRetry,
    AgentLoopDetected,
    AgentMemoryLoaded,
    AgentProcessingEnd,
    AgentSessionActivated,
    AgentSessionDeactivated,
    AgentSessionEnded,
    AgentSessionStarted,
    AgentSkillActivated,
    AgentSkillsDiscovered,
    AgentSteeringInjected,
    AgentToolCompleted,
    AgentToolOutputDelta,
    AgentToolStarted,
    AgentTurnLimit,
    AgentWarning,
    RunNotice,
)
from fabro_git.events.envelope import EventProps
from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.llm import catalogue, usage
from fabro_git.llm.client import RetryPolicy, complete
from fabro_git.llm.errors import ContextTooLong, LlmError
from fabro_git.llm.types import (
    DEFAULT_IDLE_TIMEOUT,
    TEXT_KEPT,
    Message,
    ReasoningEffort,
    Request,
    Response,
    StreamEvent,
    Target,
    ToolCall,
    ToolResult,
    Usage,
    discard,
)

Emit = Callable[[EventProps], object]
# A source of extra tools for a session's runs: called with the session when a run
# starts, entered for the run, left when it ends (see `AgentSession.toolsets`).
ToolSet = Callable[["AgentSession"], AbstractAsyncContextManager[Mapping[str, Tool]]]
Status = Literal["completed", "turn_limit", "failed", "cancelled"]

# Compact when the next request is estimated to fill this share of the context window
# (above the layer's 80 % warning, so the warning comes first).
COMPACTION_SHARE = 0.85
CHARS_PER_TOKEN = 4
LOOP_WARNING = (
    "Loop detected: your last {window} tool calls repeat the same pattern and are not "
    "making progress. Stop and try a different approach."
)
INTERRUPTED = (
    "This tool call was interrupted (the stage was cancelled) before it finished; "
    "it may have partly run. Check its effects before relying on them."
)
SUMMARY_REQUEST = (
    "The conversation is about to be shortened. Write a summary of the work so far that "
    "lets you carry on without the earlier messages: the task, what you found, what you "
    "changed (files and why), what is left to do, and anything that failed. Answer with "
    "the summary only; do not call tools."
)


class AgentLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds of one run. `max_turns` counts model calls (0: no limit)."""

    max_turns: int = 200
    shell_timeout: float = 120.0
    shell_max_timeout: float = 600.0
    loop_window: int = 10
    max_tokens: int = 16384
    # Turns (an assistant message and its tool results) kept verbatim by a compaction.
    compaction_keep_turns: int = 4
    output_limits: dict[str, OutputLimit] = msgspec.field(default_factory=dict)


class Conversation(msgspec.Struct, kw_only=True):
    """Everything a later visit needs to carry on the same thread."""

    messages: list[Message] = msgspec.field(default_factory=list)
    turns: int = 0
    files_touched: list[str] = msgspec.field(default_factory=list)
    compactions: int = 0

    def to_bytes(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> Conversation:
        return msgspec.json.decode(data, type=cls)


class AgentResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one run did. `files_touched` lists the worktree-relative paths the file
    tools wrote or deleted; what a shell command changed is not in it (the stage's
    checkpoint diff has everything). `usage` and `cost` include compaction calls."""

    status: Status
    text: str
    usage: Usage
    cost: float | None
    files_touched: list[str]
    turns: int
    # `LlmError.to_dict()` of the failure that ended a failed run.
    error: JsonObject | None = None
    failure_class: str | None = None
    # A final reply longer than `TEXT_KEPT` characters, streamed to the session's
    # `text_file`: that file holds it whole (`text_chars` characters), `text` its start.
    text_file: str | None = None
    text_chars: int | None = None


def _add_usage(total: Usage, more: Usage) -> Usage:
    return Usage(
        input_tokens=total.input_tokens + more.input_tokens,
        output_tokens=total.output_tokens + more.output_tokens,
        reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens,
        cache_read_tokens=total.cache_read_tokens + more.cache_read_tokens,
        cache_write_tokens=total.cache_write_tokens + more.cache_write_tokens,
    )


def _signature(call: ToolCall) -> str:
    return call.name + ":" + msgspec.json.encode(call.arguments, order="sorted").decode()


def repeats(signatures: Sequence[str], window: int) -> bool:
    """True when the last `window` signatures are one pattern of 1, 2 or 3 calls repeated."""
    if window < 2 or len(signatures) < window:
        return False
    recent = list(signatures[-window:])
    for length in (1, 2, 3):
        if window % length or window // length < 2:
            continue
        pattern = recent[:length]
        if all(recent[i : i + length] == pattern for i in range(0, window, length)):
            return True
    return False


def _chars(message: Message) -> int:
    size = len(message.text) + len(message.reasoning or "")
    size += sum(
        len(call.name) + len(msgspec.json.encode(call.arguments)) for call in message.tool_calls
    )
    size += sum(len(result.content) for result in message.tool_results)
    return size


class ToolHooks(Protocol):
    """Hooks around each tool call (the engine's lifecycle hooks, for one stage)."""

    async def before_tool(
        self, name: str, call_id: str, arguments: Mapping[str, JsonValue]
    ) -> str | None:
        """A reason to refuse the call (the model reads it as the tool's error), or None
        to run it."""
        ...

    async def after_tool(self, name: str, call_id: str, output: str, is_error: bool) -> str | None:
        """A note for the model to read after the tool's output, or None."""
        ...


class AgentSession:
    """One agent stage's session. Create it, `await run(prompt)`, read the result.

    `emit` takes the `agent.*` property Structs; the caller stamps them with the stage's
    scope and `session_id` (`agent.session.started` and `.ended` are not stage-scoped).
    `env` supplies provider keys; `shell_env` is the shell tool's environment (by
    default `env` as `fabro_git.engine.stage_env` leaves it for a stage: no
    secret-named or git location variable).
    `on_process_group(pgid, running)` hears of each shell command's process group, for
    a stage that records them to kill after a crash. Each of `toolsets` adds tools for
    the length of a run; a tool set may name a built-in tool's name only to replace it.
    `tool_hooks` may refuse a tool call before it runs and add a note to its result.

    With `text_file`, each model reply streams to that file as it arrives, and only its
    first `TEXT_KEPT` characters are held (`fabro_git.llm.types.ReplyText`): the final
    reply, which ends the session and is never sent again, is the file (`AgentResult`'s
    `text_file`), stored as it is. A longer reply that comes with tool calls, and must
    be sent again with the next call, is cut to its first `TEXT_KEPT` characters in the
    conversation, with an `agent.warning` (`reply_cut`): a model's own context bounds a
    real one, so only a broken or hostile endpoint sends one, and memory stays bounded.

    `permissions` decides which calls run at all (`fabro_git.agent.permissions`); without
    it every tool runs.
    """

    def __init__(
        self,
        worktree: Path,
        *,
        target: Target,
        emit: Emit,
        fallbacks: Sequence[Target] = (),
        system_prompt: str | None = None,
        limits: AgentLimits | None = None,
        env: Mapping[str, str] | None = None,
        shell_env: Mapping[str, str] | None = None,
        conversation: Conversation | None = None,
        session_id: str | None = None,
        thread_id: str | None = None,
        visit: int = 1,
        skill_dirs: Sequence[Path] | None = None,
        context_window: int | None = None,
        reasoning_effort: ReasoningEffort | None = None,
        retry_policy: RetryPolicy | None = None,
        request_timeout: float | None = 600.0,
        stream_idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        on_process_group: Callable[[int, bool], object] | None = None,
        toolsets: Sequence[ToolSet] = (),
        tool_hooks: ToolHooks | None = None,
        guard_config: Path | None = None,
        text_file: str | None = None,
        permissions: PermissionGate | None = None,
    ) -> None:
        self.worktree = Path(worktree)
        self.text_file = text_file
        # An in-place run's checkout, whose `.fabro/` no tool may change.
        self.guard_config = guard_config
        self.target = target
        self.fallbacks = tuple(fallbacks)
        # Where the chain starts for the next call: after a failover the session stays
        # on the target that answered (a spent quota does not come back within a
        # session), rather than failing over again on every turn.
        self._chain = (target, *self.fallbacks)
        self.system_prompt = system_prompt
        self.limits = limits or AgentLimits()
        self.env: Mapping[str, str] = os.environ if env is None else env
        if shell_env is None:
            from fabro_git.engine.stage_env import stage_environment

            shell_env = stage_environment(self.env)
        self.shell_env = shell_env
        self.conversation = conversation or Conversation()
        self.session_id = session_id or f"ses_{uuid.uuid4().hex[:16]}"
        self.thread_id = thread_id
        self.visit = visit
        self.profile = profile_of(target)
        self.skill_dirs = (
            list(skill_dirs)
            if skill_dirs is not None
            else skill_files.default_skill_dirs(self.worktree)
        )
        info = catalogue.lookup(target.model)
        self.context_window = context_window or (info.context_window if info else None)
        self.reasoning_effort = reasoning_effort
        self.retry_policy = retry_policy or RetryPolicy()
        self.request_timeout = request_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.on_process_group = on_process_group
        self.toolsets = tuple(toolsets)
        self._emit = emit
        self.tool_hooks = tool_hooks
        self.permissions = permissions
        self._workspace = Workspace(self.worktree, guard_config=guard_config)
        self._context = self._tool_context()
        self._start_afresh()
        self._tools: dict[str, Tool] = {}
        self._extra_tools: dict[str, Tool] = {}
        self._steering: list[str] = []
        self._signatures: list[str] = []
        # Token count of the conversation as of the last response, and how many
        # messages it had then: the base of the next request's estimate.
        self._measured: tuple[int, int] | None = None
        self._warned = False

    def _tool_context(self) -> ToolContext:
        """What the tools work with: the workspace, the shell, and whom to tell what."""
        return ToolContext(
            workspace=self._workspace,
            shell_env=dict(self.shell_env),
            shell_default_timeout=self.limits.shell_timeout,
            shell_max_timeout=self.limits.shell_max_timeout,
            on_output=lambda delta: self._emit(AgentToolOutputDelta(delta=delta)),
            on_skill=self._skill_used,
            on_process_group=self.on_process_group,
        )

    def _start_afresh(self) -> None:
        """The state of one `run`, as it is before the run starts."""
        self._usage = Usage()
        self._cost: float | None = None
        self._turns = 0
        self._text = ""
        self._text_file: str | None = None
        self._text_chars: int | None = None
        self._status: Status = "cancelled"
        self._error: LlmError | None = None
        self._stopped: str | None = None  # why the session could not start

    # ------------------------------------------------------------------------ public

    async def run(self, prompt: str, *, preamble: str = "") -> AgentResult:
        """Work on `prompt` until the model is done, the turn limit, or a model error.

        Cancellation propagates (after the closing events); `result()` then reports
        status `cancelled` with what was done.
        """
        self._start_afresh()
        self._emit(AgentSessionStarted(provider=self.target.provider, model=self.target.model))
        try:
            self._emit(
                AgentSessionActivated(
                    thread_id=self.thread_id,
                    provider=self.target.provider,
                    model=self.target.model,
                    capabilities=["steer"],
                    visit=self.visit,
                )
            )
            async with contextlib.AsyncExitStack() as stack:
                self._extra_tools = {}
                for toolset in self.toolsets:
                    self._extra_tools.update(await stack.enter_async_context(toolset(self)))
                system = await self._prepare()
                text, skill = skill_files.expand_slash(prompt, self._context.skills)
                if skill is not None:
                    self._emit(
                        AgentSkillActivated(skill_name=skill.name, source="slash", visit=self.visit)
                    )
                self._close_interrupted_round()
                given = f"{preamble.rstrip()}\n\n{text}" if preamble.strip() else text
                self.conversation.messages.append(Message.user(given))
                self._emit(AgentInput(text=given))
                try:
                    self._status = await self._loop(system)
                except LlmError as err:
                    self._error = err
                    self._status = "failed"
                    self._emit(AgentError(error=err.to_dict()))
            self._emit(AgentProcessingEnd())
        except McpRequiredError as err:
            self._stopped = str(err)
            self._status = "failed"
            self._emit(AgentError(error={"kind": "mcp_required", "message": str(err)}))
            self._emit(AgentProcessingEnd())
        finally:
            # Reached on cancellation too; `emit` does not await, so no shield is needed.
            self._emit(AgentSessionDeactivated(visit=self.visit))
            self._emit(AgentSessionEnded())
        return self.result()

    def steer(self, text: str) -> None:
        """Queue guidance for the model: it joins the conversation as a user message
        before the next model call (after the running tool round, never within it)."""
        if text.strip():
            self._steering.append(text)

    def emit(self, props: EventProps) -> None:
        """Emit an event as this session's (a tool set's own events)."""
        self._emit(props)

    @property
    def extra_tools(self) -> Mapping[str, Tool]:
        """The tools the tool sets added to the running run."""
        return self._extra_tools

    def include(self, other: AgentResult, *, under: str = "") -> None:
        """Count another session's spending and files as this run's (a sub-agent's);
        `under` is its working directory relative to this session's worktree."""
        self._usage = _add_usage(self._usage, other.usage)
        if other.cost is not None:
            self._cost = (self._cost or 0.0) + other.cost
        for path in other.files_touched:
            self._context.touched[f"{under.rstrip('/')}/{path}" if under else path] = None

    def result(self) -> AgentResult:
        error: JsonObject | None = self._error.to_dict() if self._error else None
        failure_class = self._error.failure_class if self._error else None
        if self._stopped is not None:
            error, failure_class = (
                {"kind": "mcp_required", "message": self._stopped},
                "deterministic",
            )
        return AgentResult(
            status=self._status,
            text=self._text,
            text_file=self._text_file,
            text_chars=self._text_chars,
            usage=self._usage,
            cost=self._cost,
            files_touched=list(self._context.touched),
            turns=self._turns,
            error=error,
            failure_class=failure_class,
        )

    # ------------------------------------------------------------------------ setup

    async def _prepare(self) -> str:
        memory = await trio.to_thread.run_sync(
            memory_files.load_memory, self.worktree, self.profile
        )
        self._emit(
            AgentMemoryLoaded(
                provider_profile=self.profile,
                files=memory.files,
                total_loaded_bytes=memory.total_loaded_bytes,
                budget_bytes=memory_files.BUDGET_BYTES,
                visit=self.visit,
            )
        )
        skills = await trio.to_thread.run_sync(
            partial(skill_files.discover_skills, self.skill_dirs, worktree=self.worktree)
        )
        self._context.skills = skills
        self._emit(
            AgentSkillsDiscovered(
                provider_profile=self.profile,
                source_dirs=[str(directory) for directory in self.skill_dirs],
                skills=skill_files.summaries(skills),
                visit=self.visit,
            )
        )
        names = list(PROFILE_TOOLS[self.profile]) + (["use_skill"] if skills else [])
        self._tools = {name: TOOLS[name] for name in names} | self._extra_tools
        sections = [
            PROFILE_BASE[self.profile],
            "\n".join(
                [
                    "<environment>",
                    f"Working directory: {self._workspace.root}",
                    f"Platform: {platform.system().lower()}",
                    f"Today's date: {datetime.now(UTC).date().isoformat()}",
                    f"Model: {self.target.model}",
                    "</environment>",
                ]
            ),
        ]
        if self.permissions is not None:
            sections.append(self.permissions.prompt_section())
        if memory.text:
            sections.append("# Project instructions\n\n" + memory.text)
        if skills:
            sections.append(skill_files.prompt_section(skills))
        if self.system_prompt:
            sections.append(self.system_prompt)
        return "\n\n".join(sections)

    def _close_interrupted_round(self) -> None:
        """Answer the calls of a round a cancellation cut short: every provider refuses a
        conversation whose tool calls have no results."""
        messages = self.conversation.messages
        if messages and messages[-1].role == "assistant" and messages[-1].tool_calls:
            messages.append(
                Message.tool(
                    [
                        ToolResult(
                            tool_call_id=call.id,
                            content=INTERRUPTED,
                            is_error=True,
                        )
                        for call in messages[-1].tool_calls
                    ]
                )
            )

    def _skill_used(self, skill: skill_files.Skill) -> None:
        self._emit(AgentSkillActivated(skill_name=skill.name, source="tool", visit=self.visit))

    # ------------------------------------------------------------------------ loop

    async def _loop(self, system: str) -> Status:
        while True:
            if self.limits.max_turns and self._turns >= self.limits.max_turns:
                self._emit(AgentTurnLimit(max_turns=self.limits.max_turns))
                return "turn_limit"
            self._inject_steering()
            await self._compact(system)
            try:
                response = await self._ask(system)
            except ContextTooLong:
                # The estimate was short of the provider's count: compact now, once.
                if not await self._compact(system, force=True):
                    raise
                response = await self._ask(system)
            self._turns += 1
            self.conversation.turns += 1
            # Never the whole of a reply streamed to the file: see the class's docstring.
            self.conversation.messages.append(response.as_message(whole=False))
            self._measured = (
                response.usage.input_tokens + response.usage.output_tokens,
                len(self.conversation.messages),
            )
            self._text = response.text
            self._text_file, self._text_chars = response.text_file, response.text_chars
            self._emit(usage.message_event(response))
            warning = usage.context_warning(response, self.context_window)
            if warning is not None and not self._warned:
                self._warned = True
                self._emit(warning)
            if not response.tool_calls:
                return "completed"
            if response.text_file is not None:
                self._text_file = self._text_chars = None
                self._emit(
                    AgentWarning(
                        kind="reply_cut",
                        message=(
                            f"the model's reply of {response.length} characters came with "
                            f"tool calls; the conversation keeps its first {TEXT_KEPT} "
                            "characters"
                        ),
                        details={"characters": response.length, "kept": TEXT_KEPT},
                    )
                )
            results = [await self._execute(call) for call in response.tool_calls]
            self.conversation.messages.append(Message.tool(results))
            self._signatures += [_signature(call) for call in response.tool_calls]
            if repeats(self._signatures, self.limits.loop_window):
                self._signatures.clear()
                self._emit(AgentLoopDetected())
                self.conversation.messages.append(
                    Message.user(LOOP_WARNING.format(window=self.limits.loop_window))
                )

    def _inject_steering(self) -> None:
        queued, self._steering = self._steering, []
        for text in queued:
            self.conversation.messages.append(Message.user(text))
            self._emit(AgentSteeringInjected(text=text))

    def _request(self, system: str, messages: Sequence[Message]) -> Request:
        return Request(
            messages=tuple(messages),
            system=system,
            tools=tuple(tool.spec for tool in self._tools.values()),
            max_tokens=self.limits.max_tokens,
            reasoning_effort=self.reasoning_effort,
            timeout=self.request_timeout,
            idle_timeout=self.stream_idle_timeout,
            text_file=self.text_file,
        )

    async def _ask(self, system: str) -> Response:
        async def forward(event: StreamEvent) -> None:
            props = usage.stream_event(event)
            if props is not None:
                self._emit(props)

        response = await complete(
            self._request(system, self.conversation.messages),
            self._chain[0],
            fallbacks=self._chain[1:],
            env=self.env,
            sink=forward,
            policy=self.retry_policy,
            on_retry=self._emit_async,
            on_failover=self._emit_async,
            on_notice=self._emit_async,
        )
        self._stay_on(response.target)
        self._account(response)
        # A stream the client had buffered whole can end without a checkpoint; a
        # cancellation asked for meanwhile takes effect here, before its tools run.
        # (Raising from the sink instead would abandon the SDK's stream generator.)
        await trio.lowlevel.checkpoint()
        return response

    def _stay_on(self, answered: Target) -> None:
        """Start the next call's chain at the target that answered this one."""
        if answered in self._chain:
            self._chain = self._chain[self._chain.index(answered) :]

    async def _emit_async(self, props: AgentLlmRetry | AgentFailover | RunNotice) -> None:
        self._emit(props)

    def _account(self, response: Response) -> None:
        self._usage = _add_usage(self._usage, response.usage)
        cost = usage.estimate_cost(response.target.model, response.usage)
        if cost is not None:
            self._cost = (self._cost or 0.0) + cost

    # ------------------------------------------------------------------------ tools

    async def _execute(self, call: ToolCall) -> ToolResult:
        self._emit(
            AgentToolStarted(tool_name=call.name, tool_call_id=call.id, arguments=call.arguments)
        )
        hooks = self.tool_hooks
        ran = False
        try:
            tool = await self._admitted(call, hooks)
            ran = True
            outcome = await tool.run(call.arguments, self._context)
        except ToolError as exc:
            outcome = ToolOutcome(output=str(exc), is_error=True)
        except (OSError, UnicodeError) as exc:
            # The file system said no, or the model sent text no file can hold (a lone
            # surrogate): either way the model hears of it and may try again.
            outcome = ToolOutcome(output=f"{call.name} failed: {exc}", is_error=True)
        if ran and hooks is not None:
            note = await hooks.after_tool(call.name, call.id, outcome.output, outcome.is_error)
            if note is not None:
                outcome = ToolOutcome(
                    output=f"{outcome.output}\n\n{note}", is_error=outcome.is_error
                )
        self._emit(
            AgentToolCompleted(
                tool_name=call.name,
                tool_call_id=call.id,
                output=outcome.output,
                is_error=outcome.is_error,
            )
        )
        for path in self._context.touched:
            if path not in self.conversation.files_touched:
                self.conversation.files_touched.append(path)
        limit = self.limits.output_limits.get(call.name) or DEFAULT_LIMITS.get(
            call.name, FALLBACK_LIMIT
        )
        return ToolResult(
            tool_call_id=call.id,
            content=truncate_tool_output(outcome.output, limit),
            is_error=outcome.is_error,
        )

    async def _admitted(self, call: ToolCall, hooks: ToolHooks | None) -> Tool:
        """The tool `call` names, if it may run; else a `ToolError` telling the model why."""
        if call.unreadable is not None:
            raise ToolError(
                f"the arguments of this {call.name} call could not be read "
                f"({call.unreadable}); call it again with arguments that are one JSON object"
            )
        tool = self._tools.get(call.name)
        if tool is None:
            raise ToolError(
                f"there is no tool named {call.name!r}; the tools are {', '.join(self._tools)}"
            )
        check_arguments(tool, call.arguments)
        if self.permissions is not None:
            refusal = await self.permissions.check(call.name, call.arguments, self._emit)
            if refusal is not None:
                raise ToolError(refusal)
        if hooks is not None:
            refusal = await hooks.before_tool(call.name, call.id, call.arguments)
            if refusal is not None:
                raise ToolError(refusal)
        return tool

    # ------------------------------------------------------------------------ compaction

    def estimated_tokens(self, system: str) -> int:
        messages = self.conversation.messages
        if self._measured is not None and self._measured[1] <= len(messages):
            base, counted = self._measured
            return base + sum(_chars(m) for m in messages[counted:]) // CHARS_PER_TOKEN
        return (len(system) + sum(_chars(m) for m in messages)) // CHARS_PER_TOKEN

    async def _compact(self, system: str, *, force: bool = False) -> bool:
        """Summarise the older turns when the next request would come near the context
        window (or, with `force`, because the provider said it was too long). True if
        the history was shortened."""
        window = self.context_window
        estimate = self.estimated_tokens(system)
        if not force and (window is None or estimate < window * COMPACTION_SHARE):
            return False
        messages = self.conversation.messages
        starts = [i for i, m in enumerate(messages) if m.role == "assistant"]
        keep = self.limits.compaction_keep_turns
        if len(starts) <= keep:
            return False  # nothing old enough to summarise
        cut = starts[-keep] if keep else len(messages)
        older, preserved = messages[:cut], messages[cut:]
        self._emit(
            AgentCompactionStarted(estimated_tokens=estimate, context_window_size=window or 0)
        )
        summary = await complete(
            self._request(system, [*older, Message.user(SUMMARY_REQUEST)]),
            self._chain[0],
            fallbacks=self._chain[1:],
            env=self.env,
            sink=discard,
            policy=self.retry_policy,
            on_retry=self._emit_async,
            on_failover=self._emit_async,
            on_notice=self._emit_async,
        )
        self._stay_on(summary.target)
        self._account(summary)
        task = older[0].text if older and older[0].role == "user" else ""
        files = self.conversation.files_touched
        lines = [
            task,
            "[Earlier turns of this session were summarised to fit the context window.]",
            summary.text.strip(),
        ]
        if files:
            lines.append("Files changed so far: " + ", ".join(files))
        self.conversation.messages = [
            Message.user("\n\n".join(line for line in lines if line)),
            *preserved,
        ]
        self.conversation.compactions += 1
        self._measured = None
        self._warned = False
        self._emit(
            AgentCompactionCompleted(
                original_turn_count=len(older) + len(preserved),
                preserved_turn_count=len(preserved),
                summary_token_estimate=len(summary.text) // CHARS_PER_TOKEN,
                tracked_file_count=len(files),
            )
        )
        return True
