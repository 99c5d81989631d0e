"""What a handler is given: the stage's node, a read-only view of the context, where to
work, and the few things a stage may ask of the engine.

This is the whole of a handler's reach. It emits events already stamped with its stage,
asks a person through the interviewer, runs a child workflow or parallel branches (the
engine owns their walks, worktrees and refs), tells of the process groups it starts, and
records files for the stage's entry on the meta ref. Nothing here reaches the store; the
engine does every git call. An LLM stage runs an agent session on the same terms:
`emit` for its `agent.*` events, `worktree` as its workspace, `on_process_group` for
its shell commands, and trio cancellation to stop it.

Cancellation is trio's: the engine runs the handler inside the stage's cancel scope (its
`timeout`, Ctrl-C, the watchdog). A handler that can say something useful when it is cut
off registers `on_timeout`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
import trio

from fabro_git.engine import branches, child_walks, threads
from fabro_git.engine.clean_start import CleanStart
from fabro_git.engine.clean_start import touched_since as clean_touched_since
from fabro_git.engine.scope import Scope
from fabro_git.jsondata import JsonValue

if TYPE_CHECKING:
    from fabro_git.config.run_config import AgentConfig, McpServerConfig
    from fabro_git.engine.branches import BranchPlan, BranchResult
    from fabro_git.engine.checkpoint import Manifest
    from fabro_git.engine.interviewer import Interviewer
    from fabro_git.engine.ledger import Ledger
    from fabro_git.engine.lifecycle import HookDecision, LifecycleHooks, StageToolHooks
    from fabro_git.engine.options import Options
    from fabro_git.engine.outcome import Outcome, StageRecord
    from fabro_git.engine.scope import ChildResult, Supervision, WalkEnd
    from fabro_git.events.envelope import EventProps
    from fabro_git.store.touched import WorktreeSnapshot
    from fabro_git.workflow import Graph, Node


class StageServices(Protocol):
    """What of the run a stage reaches through its request (`runner.Runtime` is it)."""

    run_id: str
    manifest: Manifest
    options: Options
    interviewer: Interviewer
    hooks: LifecycleHooks
    ledger: Ledger
    steer_targets: list[Callable[[str], None]]

    def emit(
        self,
        event: EventProps,
        /,
        *,
        node_id: str | None = None,
        node_label: str | None = None,
        stage_id: str | None = None,
        session_id: str | None = None,
        parent_session_id: str | None = None,
    ) -> None: ...

    async def walk(self, scope: Scope, node_id: str) -> WalkEnd: ...


@contextlib.contextmanager
def deadline_stopped(scope: trio.CancelScope | None) -> Iterator[None]:
    """Hold `scope`'s deadline still for the body: what was left of it when the body
    began is left of it when the body ends."""
    if scope is None or scope.deadline == math.inf:
        yield
        return
    left = scope.deadline - trio.current_time()
    scope.deadline = math.inf
    try:
        yield
    finally:
        scope.deadline = trio.current_time() + left


class StageRequest(msgspec.Struct):
    graph: Graph
    node: Node
    context: Mapping[str, JsonValue]
    visit: int
    attempt: int
    stage_id: str
    worktree: Path
    node_dir: str
    _services: StageServices
    _scope: Scope
    # The stage's own scratch directory (`nodes/<dir>/`): see `stage_dir`.
    _stage_dir: Path
    # Files for the stage's `nodes/<dir>/` entry on the meta ref, beyond status.json: their
    # bytes, or the path of a file in scratch that the checkpoint streams into git.
    files: dict[str, bytes | Path] = msgspec.field(default_factory=dict)
    # What the stage ends with when its `timeout` cuts it off (default: a transient failure).
    timeout_outcome: Callable[[float], Awaitable[Outcome]] | None = None
    # The record files of the process groups the stage told of, by group id.
    _groups: dict[int, Path | None] = msgspec.field(default_factory=dict)
    # The mark the stage's processes carry, once one is to start, and the pids alive
    # before it (`sweep`).
    _mark: str | None = None
    _pids_before: set[int] | None = None
    # The cancel scope of the stage's `timeout`, while the handler runs under it.
    _timeout_scope: trio.CancelScope | None = None
    _stage_dir_made: bool = False

    # -- where the stage writes in scratch -----------------------------------------------

    @property
    def stage_dir(self) -> Path:
        """The stage's own scratch directory (`nodes/<dir>/`), for the files a handler
        writes as it runs (a reply, an agent CLI's output, an MCP server's log). Made
        the first time it is asked for: most stages write none, and a directory made
        at every stage costs the file system an inode each."""
        if not self._stage_dir_made:
            from fabro_git.config.locations import make_private_dir

            make_private_dir(self._stage_dir)
            self._stage_dir_made = True
        return self._stage_dir

    @property
    def output_dir(self) -> Path:
        """Where a command stage streams its output (`stdout.log`, `stderr.log`): one
        directory per walk (`Ledger.output_dir`), which each command stage of the walk
        writes over. A stage keeps what it needs of its output before it ends
        (`handlers.command`), so the next one may."""
        scope = self._scope
        scope.output_dir = self._services.ledger.output_dir(scope.output_dir)
        return scope.output_dir

    # -- facts about the run -------------------------------------------------------------

    @property
    def node_id(self) -> str:
        """The node's id as events name it: `<child node>/<node>` inside a sub-workflow."""
        return self._scope.qualified(self.node.id)

    @property
    def run_id(self) -> str:
        return self._services.run_id

    @property
    def goal(self) -> str:
        return self._services.manifest.goal

    @property
    def inputs(self) -> dict[str, str]:
        return dict(self._services.manifest.inputs)

    @property
    def git_dir(self) -> Path:
        """The user's repository's common git directory (its config, hooks, refs)."""
        return Path(self._services.ledger.repo.git_dir)

    @property
    def dry_run(self) -> bool:
        return self._services.options.dry_run

    @property
    def in_place(self) -> bool:
        """Whether the run works in the user's checkout (`--in-place`): its `.fabro/` is
        then the user's configuration, which no stage may change."""
        return self._services.options.in_place

    @property
    def run_model(self) -> tuple[str | None, str | None]:
        """The run's model and provider: `--model`/`--provider` over `[run.model]`."""
        options = self._services.options
        return options.model, options.provider

    @property
    def model_fallbacks(self) -> list[str]:
        """`[run.model] fallbacks` of the run's configuration."""
        return self._services.manifest.run_config.model_fallbacks

    @property
    def mcp_servers(self) -> dict[str, McpServerConfig]:
        """`[run.agent.mcps]` of the run's configuration: server name → its table."""
        return dict(self.agent_config.mcps)

    @property
    def agent_config(self) -> AgentConfig:
        """`[run.agent]` of the run's configuration (how `backend="cli"` stages run, the
        MCP servers and model requests of `backend="api"` ones)."""
        from fabro_git.config.run_config import AgentConfig

        agent = self._services.manifest.run_config.agent
        return agent if agent is not None else AgentConfig()

    @property
    def completed(self) -> Mapping[str, StageRecord]:
        """The outcome records of the stages this walk has completed, by node id."""
        return self._scope.outcomes

    @property
    def previous_node(self) -> str | None:
        """The node whose stage this walk completed last (the one the run came from)."""
        completed = self._scope.completed
        return completed[-1] if completed else None

    @property
    def process_groups(self) -> Path:
        """Where a stage records the process groups it starts, so the run's end (or a
        resume after a crash) can kill what they leave running."""
        from fabro_git.engine import process_groups

        return process_groups.records_dir(self._services.ledger.scratch)

    @property
    def sandbox_env(self) -> dict[str, str]:
        """`[run.sandbox.env]` of the run's configuration, its references unresolved."""
        return self._services.manifest.run_config.sandbox_env

    @property
    def process_mark(self) -> str:
        """The mark every process this stage starts carries in its environment, so that
        none outlives the stage (`fabro_git.engine.reaper`)."""
        if self._mark is None:
            from fabro_git.engine import process_groups, reaper

            self._pids_before = reaper.pids_lately()
            self._mark = process_groups.process_mark(self.process_groups)
            process_groups.running_stages.add(self._mark)
        return self._mark

    def environment(self, *, keys: tuple[str, ...] = ()) -> dict[str, str]:
        """The environment of a process the stage starts (`fabro_git.engine.stage_env`),
        with the host's values of `keys` too."""
        from fabro_git.engine.repo_guard import allows_push, push_environment
        from fabro_git.engine.stage_env import stage_environment

        env = stage_environment(sandbox=self.sandbox_env, keys=keys, mark=self.process_mark)
        # Its pushes fail as ordinary git errors unless the workflow says `allow_push`.
        env.update(
            push_environment(env, self.git_dir, allow_push=allows_push(self.graph, self.node))
        )
        return env

    def timed_by(self, scope: trio.CancelScope | None) -> None:
        """The engine tells the stage which cancel scope is its `timeout`."""
        self._timeout_scope = scope

    @contextlib.contextmanager
    def timeout_stopped(self) -> Iterator[None]:
        """While the stage waits on others (for one of its batch's LLM slots), its
        `timeout` stands still: the time waited is added to its deadline."""
        with deadline_stopped(self._timeout_scope):
            yield

    def sweep(self) -> None:
        """Kill whatever the stage started that is still running (the engine calls this
        when the stage ends)."""
        if self._mark is not None:
            from fabro_git.engine import process_groups

            process_groups.running_stages.discard(self._mark)
            # What carries its mark, then what left the stage's groups and was
            # re-parented to this process, mark or none (`env -i`).
            process_groups.sweep_stage(self._mark, since=self._pids_before)

    @property
    def output_listener(self) -> Callable[[str, str], None] | None:
        """Who wants a command's output line by line as it is printed (`run -v`): called
        with the node id and the line; None when nobody does."""
        return self._services.options.on_output

    @property
    def interviewer(self) -> Interviewer:
        return self._services.interviewer

    @property
    def person_at_terminal(self) -> bool:
        """Whether a person at the run's terminal may be asked to let an agent go beyond
        its permission level: not under `--auto-approve` or `--answer`, nor without a
        terminal (scripted answers are for human gates, not for widening what an agent
        may do)."""
        import sys

        options = self._services.options
        if options.auto_approve or options.answers or not options.interactive:
            return False
        try:
            return sys.stdin is not None and sys.stdin.isatty()
        except (OSError, ValueError):
            return False

    # -- what a stage may do -------------------------------------------------------------

    def emit(
        self,
        props: EventProps,
        *,
        session_id: str | None = None,
        parent_session_id: str | None = None,
    ) -> None:
        """Emit an event stamped with this stage (node id, label and stage id), and with
        the agent session it comes from, if any."""
        self._services.emit(
            props,
            node_id=self.node_id,
            node_label=self.node.label,
            stage_id=self.stage_id,
            session_id=session_id,
            parent_session_id=parent_session_id,
        )

    def emit_session(
        self, props: EventProps, *, session_id: str, parent_session_id: str | None = None
    ) -> None:
        """Emit an agent session's lifecycle event, which is not stage-scoped: it carries
        the session ids alone (a sub-agent's names its parent's)."""
        self._services.emit(props, session_id=session_id, parent_session_id=parent_session_id)

    @contextlib.contextmanager
    def take_steering(self, receive: Callable[[str], None]) -> Iterator[None]:
        """While the block runs, text sent with `git fabro steer` goes to `receive`."""
        targets = self._services.steer_targets
        targets.append(receive)
        try:
            yield
        finally:
            targets.remove(receive)

    def on_process_group(self, pgid: int, running: bool) -> None:
        """Hear of a process group the stage started (`running`) or saw end. It stays
        recorded while any of it is alive, so the run's end, or a resume after a crash,
        kills what it left running."""
        from fabro_git.engine import process_groups

        if running:
            self._groups[pgid] = process_groups.record(self.process_groups, pgid)
        else:
            if not process_groups.alive(pgid):
                process_groups.forget(self._groups.pop(pgid, None))
            # What the group left running is now this process's child: noted for the
            # watcher, should this process be killed before the stage ends.
            process_groups.record_adopted(self.process_groups)

    async def fire_hook(self, event: str, **fields: JsonValue) -> HookDecision:
        """Fire the run's lifecycle hooks for `event`, stamped with this stage's node."""
        return await self._services.hooks.fire(
            event,
            node_id=self.node_id,
            node_label=self.node.label,
            handler_type=self.node.handler_type,
            **fields,
        )

    @property
    def tool_hooks(self) -> StageToolHooks | None:
        """The tool-call hooks for an agent session in this stage; None when no hook
        listens for tool events."""
        from fabro_git.engine.lifecycle import TOOL_EVENTS, StageToolHooks

        hooks = self._services.hooks
        if not any(hooks.wants(event) for event in TOOL_EVENTS):
            return None
        return StageToolHooks(hooks, node_id=self.node_id, node_label=self.node.label)

    async def snapshot_worktree(self) -> WorktreeSnapshot | CleanStart:
        """The worktree as the stage finds it, for `touched_since`: its dirty files and
        their stat data, or, when the last checkpoint's scan still says what it is,
        that (no scan at all; see `clean_start`)."""
        from fabro_git.store.touched import take_snapshot

        start = self._scope.recording.clean_start(self._scope)
        if start is not None:
            return start
        return await trio.to_thread.run_sync(take_snapshot, self.worktree)

    async def touched_since(
        self, before: WorktreeSnapshot | CleanStart, *, limit: int
    ) -> list[str]:
        """The paths changed since `before` was taken, commits the stage made included:
        the `files_touched` of a stage whose program edits files with its own tools."""
        from fabro_git.store.touched import take_snapshot, touched_paths

        if isinstance(before, CleanStart):
            scope = self._scope
            touched = await scope.recording.files_touched(scope, self.stage_id)
            return await clean_touched_since(self._services.ledger, touched, before, limit=limit)
        snapshot = before

        def diff() -> list[str]:
            # The checkpoint rewrites the index next: this scan need not.
            after = take_snapshot(self.worktree, keep_cache=False)
            return touched_paths(self.worktree, snapshot, after, limit=limit)

        return await trio.to_thread.run_sync(diff)

    def _branch_thread(self, thread_id: str) -> str | None:
        """A parallel branch's own copy of a thread: branches running side by side
        each carry the thread on from the fan-out, never into one another."""
        scope = self._scope
        return f"{thread_id}@{scope.ref}" if scope.branch_tag is not None and scope.ref else None

    async def load_thread(self, thread_id: str) -> bytes | None:
        """The conversation of `thread_id` as the last stage of that thread left it
        (None for a new thread): kept on the meta ref, so a resume finds it. In a
        parallel branch, the branch's own copy, else the thread as the fan-out left it."""
        ledger = self._services.ledger
        own = self._branch_thread(thread_id)
        if own is not None:
            data = await threads.load(ledger, own)
            if data is not None:
                return data
        return await threads.load(ledger, thread_id)

    def save_thread(self, thread_id: str, data: bytes) -> None:
        """Keep the conversation of `thread_id` for the next stage of that thread; it is
        written with this stage's checkpoint (in a parallel branch, as the branch's own
        copy)."""
        threads.save(self._services.ledger, self._branch_thread(thread_id) or thread_id, data)

    def on_timeout(self, outcome: Callable[[float], Awaitable[Outcome]]) -> None:
        """What the stage ends with if its `timeout` (in seconds, passed in) cuts it off.
        It is awaited once the handler has been cancelled, outside the stage's cancel
        scope: it may still ask the engine what the stage did (`touched_since`)."""
        self.timeout_outcome = outcome

    async def run_child(self, graph: Graph, supervision: Supervision | None = None) -> ChildResult:
        """Walk `graph` as a child workflow in this stage's worktree, with a copy of the
        context; its stages are named `<this node>/<child node>`. A manager loop's
        `supervision` polls it, and may stop it."""
        services = self._services
        return await child_walks.run_child(
            services.ledger,
            services.walk,
            self._scope,
            self.node,
            graph,
            self.stage_id,
            supervision,
        )

    async def run_branches(self, plan: BranchPlan) -> list[BranchResult]:
        """Run parallel branches from this stage, each in its own worktree and on its own
        ref, until each reaches a fan-in or the exit."""
        services = self._services
        return await branches.run_branches(
            services.ledger, services.walk, self._scope, self.node, self.visit, plan
        )

    async def adopt_branch(self, head: str) -> None:
        """Take a finished branch's files into this stage's worktree; the stage's commit
        then has the branch head as a second parent."""
        await branches.adopt_branch(self._services.ledger, self._scope, self.node, head)


# The name the design speaks of; one type.
StageContext = StageRequest

Handler = Callable[[StageRequest], Awaitable["Outcome"]]
