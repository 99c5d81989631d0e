"""Sub-agents: an agent hands a scoped task to a child session and reads its answer.

The four tools (`spawn_agent`, `send_input`, `wait`, `close_agent`) are a tool set
(`session.ToolSet`) of the parent session. A child is an `AgentSession` of its own, with
a fresh conversation, working in the parent's worktree (or a directory of it) with the
same tools, and running concurrently with its parent in a nursery opened for the
parent's run. That nursery sits inside the stage's cancel scope, so Ctrl-C or the
node's `timeout` cancels every child with its parent, and a parent run that ends closes
the children it leaves behind.

One `SubAgents` serves a stage: it holds the limits the whole tree shares (how deep it
may nest, how many children may run at once), numbers the children `sub_1`, `sub_2`, …
across the stage, and stamps each child's events with the child's `session_id` and its
parent's as `parent_session_id`. The streamed deltas of children are left out: their
messages and tool calls say what they did.

Lifecycle events are the parent's: `agent.sub.spawned`, then `agent.sub.completed` (a
run that ended with an answer or at its turn limit) or `agent.sub.failed` for each run
of the child, and `agent.sub.closed` once, when `close_agent` or the end of the parent's
run removes it. A child's tokens, cost and files count as its parent's, so a stage's
usage includes its whole tree.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import trio

from fabro_git.agent.session import AgentResult, AgentSession, ToolSet
from fabro_git.agent.tools import Tool, ToolArguments, ToolContext, ToolOutcome, builtin
from fabro_git.agent.workspace import ToolError, Workspace
from fabro_git.events.catalogue import (
    AgentSubClosed,
    AgentSubCompleted,
    AgentSubFailed,
    AgentSubSpawned,
)
from fabro_git.events.envelope import EventProps
from fabro_git.jsondata import JsonObject
from fabro_git.llm import catalogue
from fabro_git.llm.types import Target

DEFAULT_MAX_DEPTH = 1
DEFAULT_MAX_RUNNING = 4
TOOL_NAMES = ("spawn_agent", "send_input", "wait", "close_agent")
SUB_AGENT_PROMPT = (
    "You are a sub-agent: another agent handed you the task in the first message and "
    "will read your final answer. Work on that task only, with your tools, in the shared "
    "worktree (other agents may be changing other files meanwhile). End with a short "
    "report of what you did and found, as plain text."
)

# stamp(props, session_id, parent_session_id): emit a child's event as the stage's.
Stamp = Callable[[EventProps, str, str | None], None]
Status = Literal["running", "completed", "failed", "closed"]


@dataclass
class _Child:
    agent_id: str
    depth: int
    session: AgentSession
    # The child's working directory relative to the parent's worktree ("" for the same).
    under: str
    status: Status = "running"
    result: AgentResult | None = None
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope | None = None


_AGENT_ID = msgspec.Meta(description="The id spawn_agent returned, e.g. sub_1.")
_TASK = msgspec.Meta(description="The task, in full: it sees nothing else.")
_WORKING_DIR = msgspec.Meta(description="A directory of the worktree to confine it to.")
_MODEL = msgspec.Meta(description="Another model (default: yours).")
_MAX_TURNS = msgspec.Meta(description="Most model calls it may make (default: no limit).")


class SpawnArguments(ToolArguments):
    task: Annotated[str, _TASK]
    working_dir: Annotated[str, _WORKING_DIR] | None = None
    model: Annotated[str, _MODEL] | None = None
    max_turns: Annotated[int, _MAX_TURNS] | None = None


class SendInputArguments(ToolArguments):
    agent_id: Annotated[str, _AGENT_ID]
    message: str


class AgentIdArguments(ToolArguments):
    """The one argument of `wait` and `close_agent`."""

    agent_id: Annotated[str, _AGENT_ID]


DESCRIPTIONS = {
    "spawn_agent": "Start a sub-agent on a scoped task. It has its own conversation and "
    "the same tools, works in the same worktree, and runs while you go on; call wait "
    "for its report. Returns its agent_id.",
    "send_input": "Send a sub-agent a message: a running one reads it before its next "
    "model call; a finished one starts working again on it.",
    "wait": "Wait until a sub-agent finishes and return its report: its final "
    "text, whether it succeeded, and the turns it used.",
    "close_agent": "Stop a sub-agent (if it is still working) and remove it. Files it "
    "changed stay changed.",
}


class SubAgents:
    """The sub-agents of one agent stage. `toolsets()` are the root session's;
    `max_depth` bounds the nesting (a root's children are at depth 1) and
    `max_running` the children running at once in the whole tree."""

    def __init__(
        self,
        stamp: Stamp,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_running: int = DEFAULT_MAX_RUNNING,
    ) -> None:
        self.stamp = stamp
        self.max_depth = max_depth
        self.max_running = max_running
        self.running = 0
        self._numbers = itertools.count(1)

    def toolsets(self) -> list[ToolSet]:
        """The root session's tool sets: none when sub-agents are turned off."""
        return [self.toolset_at(0)] if self.max_depth > 0 else []

    def toolset_at(self, depth: int) -> ToolSet:
        """The tool set of a session `depth` levels below the stage's own agent."""

        def open_team(
            session: AgentSession,
        ) -> contextlib.AbstractAsyncContextManager[Mapping[str, Tool]]:
            return _team(self, session, depth)

        return open_team

    def next_id(self) -> str:
        return f"sub_{next(self._numbers)}"


@contextlib.asynccontextmanager
async def _team(
    crew: SubAgents, session: AgentSession, depth: int
) -> AsyncIterator[Mapping[str, Tool]]:
    """The tools of one parent run, and the nursery its children run in."""
    team = _Team(crew, session, depth)
    try:
        async with trio.open_nursery() as nursery:
            team.nursery = nursery
            try:
                yield team.tools()
            finally:
                team.close_all()
    except BaseExceptionGroup as group:
        raise _unwrapped(group) from None
    finally:
        team.close_all()  # a child that finished as it was being cancelled


def _unwrapped(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a nursery wrapped (children raise nothing but `Cancelled`), so
    callers see the parent's own error, or the stage's cancellation, as it was."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        else:
            leaves.append(error)

    walk(group)
    others = [leaf for leaf in leaves if not isinstance(leaf, trio.Cancelled)]
    if len(others) > 1:
        return group
    return others[0] if others else leaves[0]


class _Team:
    def __init__(self, crew: SubAgents, parent: AgentSession, depth: int) -> None:
        self.crew = crew
        self.parent = parent
        self.depth = depth
        self.nursery: trio.Nursery | None = None
        self.children: dict[str, _Child] = {}

    def tools(self) -> dict[str, Tool]:
        tools = (
            builtin("spawn_agent", DESCRIPTIONS["spawn_agent"], SpawnArguments, self.spawn),
            builtin("send_input", DESCRIPTIONS["send_input"], SendInputArguments, self.send_input),
            builtin("wait", DESCRIPTIONS["wait"], AgentIdArguments, self.wait),
            builtin("close_agent", DESCRIPTIONS["close_agent"], AgentIdArguments, self.close),
        )
        return {tool.spec.name: tool for tool in tools}

    # ------------------------------------------------------------------------ tools

    async def spawn(self, arguments: SpawnArguments, context: ToolContext) -> ToolOutcome:
        crew, parent = self.crew, self.parent
        task = arguments.task.strip()
        if not task:
            raise ToolError("spawn_agent: the task is empty; say what the sub-agent is to do")
        if self.depth >= crew.max_depth:
            raise ToolError(
                f"spawn_agent: sub-agents may nest {crew.max_depth} deep and this agent is "
                f"at depth {self.depth}, so it cannot start another; do the work yourself"
            )
        self._check_room()
        root, under = self._working_dir(arguments.working_dir)
        target, fallbacks = self._model(arguments.model)
        max_turns = arguments.max_turns or 0
        if max_turns < 0:
            raise ToolError("spawn_agent: max_turns must be 0 (no limit) or more")
        agent_id = crew.next_id()
        session_id = f"ses_{uuid.uuid4().hex[:16]}"
        shared = {n: t for n, t in parent.extra_tools.items() if n not in TOOL_NAMES}

        def forward(props: EventProps) -> None:
            if not props.NAME.endswith(".delta"):
                crew.stamp(props, session_id, parent.session_id)

        child = AgentSession(
            root,
            target=target,
            fallbacks=fallbacks,
            emit=forward,
            system_prompt=SUB_AGENT_PROMPT,
            limits=msgspec.structs.replace(parent.limits, max_turns=max_turns),
            env=parent.env,
            shell_env=parent.shell_env,
            session_id=session_id,
            visit=parent.visit,
            skill_dirs=parent.skill_dirs,
            reasoning_effort=parent.reasoning_effort,
            retry_policy=parent.retry_policy,
            request_timeout=parent.request_timeout,
            stream_idle_timeout=parent.stream_idle_timeout,
            on_process_group=parent.on_process_group,
            tool_hooks=parent.tool_hooks,
            # The parent's gate: a child works at its level, and is asked as it is.
            permissions=parent.permissions,
            guard_config=parent.guard_config,
            toolsets=[_fixed(shared), crew.toolset_at(self.depth + 1)],
        )
        entry = _Child(agent_id, self.depth + 1, child, under)
        self.children[agent_id] = entry
        parent.emit(AgentSubSpawned(agent_id=agent_id, depth=entry.depth, task=task))
        self._start(entry, task)
        return ToolOutcome(
            output=f"Started sub-agent {agent_id}. It works on its own until it answers: "
            f'call wait with agent_id "{agent_id}" for its report.'
        )

    async def send_input(self, arguments: SendInputArguments, context: ToolContext) -> ToolOutcome:
        entry = self._child(arguments.agent_id)
        message = arguments.message
        if not message.strip():
            raise ToolError("send_input: the message is empty")
        if entry.status == "running":
            entry.session.steer(message)
            return ToolOutcome(
                output=f"{entry.agent_id} reads the message before its next model call."
            )
        self._check_room()
        entry.status, entry.done = "running", trio.Event()
        self._start(entry, message)
        return ToolOutcome(
            output=f"{entry.agent_id} had finished; it now works on the message. "
            "Call wait for its new report."
        )

    async def wait(self, arguments: AgentIdArguments, context: ToolContext) -> ToolOutcome:
        entry = self._child(arguments.agent_id)
        await entry.done.wait()
        result = entry.result
        assert result is not None
        success = result.status == "completed"
        lines = [
            f"agent_id: {entry.agent_id}",
            f"status: {entry.status}",
            f"success: {'true' if success else 'false'}",
            f"turns_used: {result.turns}",
        ]
        if result.status == "turn_limit":
            lines.append("note: it reached its turn limit; this is its last output")
        if entry.status == "failed":
            lines.append(f"error: {_error_text(result.error)}")
        if result.files_touched:
            lines.append("files_touched: " + ", ".join(_under(entry.under, result.files_touched)))
        lines += ["", result.text or "(no text)"]
        return ToolOutcome(output="\n".join(lines), is_error=entry.status == "failed")

    async def close(self, arguments: AgentIdArguments, context: ToolContext) -> ToolOutcome:
        entry = self._child(arguments.agent_id)
        if entry.status == "running":
            assert entry.scope is not None
            entry.scope.cancel()
            await entry.done.wait()
            return ToolOutcome(output=f"{entry.agent_id} was stopped and closed.")
        self._closed(entry)
        return ToolOutcome(output=f"{entry.agent_id} was closed.")

    # ------------------------------------------------------------------------ running

    def _start(self, entry: _Child, message: str) -> None:
        assert self.nursery is not None
        self.crew.running += 1
        entry.scope = trio.CancelScope()
        self.nursery.start_soon(self._drive, entry, message)

    async def _drive(self, entry: _Child, message: str) -> None:
        """One run of a child, to its end; nothing but the stage's cancellation leaves."""
        assert entry.scope is not None
        result: AgentResult | None = None
        error: JsonObject | None = None
        try:
            with entry.scope:
                try:
                    result = await entry.session.run(message)
                except Exception as exc:  # a bug in the child must not end its parent
                    error = {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"}
        finally:
            self.crew.running -= 1
            spent = entry.session.result()
            self.parent.include(spent, under=entry.under)
            entry.result = result or spent
            if result is None and error is None:
                # Cancelled: by close_agent, the parent's end, or the stage's.
                self._closed(entry)
            elif error is not None:
                entry.status = "failed"
                entry.result = msgspec.structs.replace(spent, status="failed", error=error)
                self.parent.emit(
                    AgentSubFailed(agent_id=entry.agent_id, depth=entry.depth, error=error)
                )
            elif result is not None and result.status == "failed":
                entry.status = "failed"
                self.parent.emit(
                    AgentSubFailed(
                        agent_id=entry.agent_id, depth=entry.depth, error=result.error or {}
                    )
                )
            elif result is not None:
                entry.status = "completed"
                self.parent.emit(
                    AgentSubCompleted(
                        agent_id=entry.agent_id,
                        depth=entry.depth,
                        success=result.status == "completed",
                        turns_used=result.turns,
                    )
                )
            entry.done.set()

    def close_all(self) -> None:
        """Close every child: a finished one now, a running one as its cancelled run
        unwinds."""
        for entry in self.children.values():
            if entry.status == "running" and entry.scope is not None:
                entry.scope.cancel()
            else:
                self._closed(entry)

    def _closed(self, entry: _Child) -> None:
        if entry.status == "closed":
            return
        entry.status = "closed"
        self.parent.emit(AgentSubClosed(agent_id=entry.agent_id, depth=entry.depth))

    # ------------------------------------------------------------------------ checks

    def _child(self, agent_id: str) -> _Child:
        entry = self.children.get(agent_id)
        if entry is None:
            known = ", ".join(self.children) or "none yet"
            raise ToolError(f"no sub-agent {agent_id!r} of yours; yours are: {known}")
        if entry.status == "closed":
            raise ToolError(f"{agent_id} was closed; spawn a new sub-agent for more work")
        return entry

    def _check_room(self) -> None:
        crew = self.crew
        if crew.running >= crew.max_running:
            raise ToolError(
                f"{crew.running} sub-agents are running, the most a stage may run at once; "
                "wait for one (or close one) first"
            )

    def _working_dir(self, value: str | None) -> tuple[Path, str]:
        worktree = self.parent.worktree
        if not value:
            return worktree, ""
        real = Workspace(worktree).resolve(value)
        if not real.is_dir():
            raise ToolError(
                f"spawn_agent: working_dir {value!r} is not a directory of the worktree"
            )
        under = real.relative_to(worktree.resolve()).as_posix()
        return real, "" if under == "." else under

    def _model(self, name: str | None) -> tuple[Target, tuple[Target, ...]]:
        parent = self.parent
        if not name or name == parent.target.model:
            return parent.target, parent.fallbacks
        from fabro_git.suggest import close_names

        info = catalogue.lookup(name)
        if info is None:
            near = close_names(name, catalogue.names())
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise ToolError(f"spawn_agent: unknown model {name!r}{hint}")
        provider = catalogue.PROVIDERS[info.provider]
        if not catalogue.configured(provider, parent.env):
            raise ToolError(
                f"spawn_agent: model {info.id} needs {' or '.join(provider.key_env)}, "
                "which is not set; use your own model"
            )
        return Target(provider=info.provider, model=info.id), ()


def _fixed(tools: Mapping[str, Tool]) -> ToolSet:
    """A tool set of tools that already exist (a parent's, shared with its children)."""

    @contextlib.asynccontextmanager
    async def shared(session: AgentSession) -> AsyncIterator[Mapping[str, Tool]]:
        yield tools

    return shared


def _under(under: str, paths: list[str]) -> list[str]:
    return [f"{under}/{path}" if under else path for path in paths]


def _error_text(error: JsonObject | None) -> str:
    if not error:
        return "unknown error"
    who = "/".join(str(error[k]) for k in ("provider", "model") if error.get(k))
    status = f" (HTTP {error['status']})" if error.get("status") is not None else ""
    message = str(error.get("message") or error)
    return f"{who}{status}: {message}" if who else message
