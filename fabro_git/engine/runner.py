"""The run loop: walk the graph one stage at a time and checkpoint after every stage.

A *scope* is one walk over a graph with its own context and worktree: the run itself,
a parallel branch (own worktree and ref, stops at the fan-in), or a sub-workflow (runs
inside its parent's stage). All three go through the one `walk`: the same entry rules
(visit limits), `execute_stage` (timeout, retries, events, context keys), `route` (edge
selection, failure routing, circuit breakers), goal gates and final status. Only what
is recorded after each stage differs: the main scope checkpoints to the meta ref and the
run branch, a branch commits on its own ref, a child leaves it to its parent's stage.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
import traceback
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import msgspec
import trio

from fabro_git.config.locations import make_private_dir
from fabro_git.config.protected import ConfigSnapshot, config_change_refused
from fabro_git.engine import child_progress, clean_start
from fabro_git.engine import outcome as oc
from fabro_git.engine.checkpoint import Checkpoint, Manifest
from fabro_git.engine.context import CheckpointCopy, Context, context_delta, plain
from fabro_git.engine.edges import select_edge
from fabro_git.engine.emit import Emit
from fabro_git.engine.failures import failure_signature, is_tracked, may_cross_loop_restart
from fabro_git.engine.lifecycle import LifecycleHooks
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.recorder import Recorder
from fabro_git.engine.repo_guard import RepoGuard
from fabro_git.engine.retry import policy_for
from fabro_git.engine.stage import Handler, StageRequest
from fabro_git.errors import DiskFull, FabroError, disk_full_in
from fabro_git.events import catalogue as ev
from fabro_git.events.envelope import EventProps, format_ts
from fabro_git.outputs.artifacts import ArtifactStore, ResolvedContext, referenced_names
from fabro_git.store import runs as runrefs
from fabro_git.workflow import Edge, Graph, Node

if TYPE_CHECKING:
    from fabro_git.engine.clean_start import CleanMark
    from fabro_git.engine.interviewer import Interviewer
    from fabro_git.outputs.assets import Snapshot
    from fabro_git.store.repo import GitRepo

T = TypeVar("T")


def now_iso() -> str:
    return format_ts(time.time_ns() // 1_000_000)


class RunFailed(Exception):
    """Ends the walk: the run cannot go on (visit limit, circuit breaker, no route...)."""


class SpendingCapReached(Exception):
    """The run's model cost passed its cap (`--max-cost`, `[run] max_cost`) at the
    checkpoint just saved: the run stops there, resumable as after an interrupt."""

    def __init__(self, cost: float, cap: float) -> None:
        from fabro_git.events.render import format_cost

        self.cost, self.cap = cost, cap
        super().__init__(
            f"the run has spent about {format_cost(cost)}, past its cap of {format_cost(cap)}"
        )


class Options(msgspec.Struct):
    auto_approve: bool = False
    answers: list[str] = msgspec.field(default_factory=list)
    dry_run: bool = False
    in_place: bool = False
    model: str | None = None
    provider: str | None = None
    interactive: bool = False
    # Live replication: the remote the run pushes its refs to after every checkpoint.
    push_remote: str | None = None
    # Running in the background (`run -d`): its gates wait for `git fabro attach`.
    detached: bool = False
    # Write `retro.json` at the run's end (`run --no-retro` turns it off for the run).
    retro: bool = True
    # Ask the run's model for the retro's narrative too (`run --retro-narrative`).
    retro_narrative: bool = False
    # US dollars the run may spend on models; None: no cap.
    max_cost: float | None = None
    # Hears each line a command stage prints, as it prints it (`run -v`): (node id, line).
    on_output: Callable[[str, str], None] | None = None


# The run itself, a parallel branch, or a child workflow.
ScopeKind = Literal["main", "branch", "child"]


class Scope(msgspec.Struct):
    kind: ScopeKind
    graph: Graph
    context: Context
    worktree: Path
    visits: dict[str, int]
    outcomes: dict[str, dict[str, Any]]
    completed: list[str]
    loop_signatures: dict[str, int]
    restart_signatures: dict[str, int]
    ref: str | None = None
    tip: str | None = None
    prefix: str = ""
    steps: int = 0
    # Handler types the walk stops in front of, without running them (a branch: fan-in, exit).
    stop_at: frozenset[str] = frozenset()
    # Nodes the walk stops in front of, whatever their type (a branch: its join node).
    stop_nodes: frozenset[str] = frozenset()
    # Heads merged into the scope's next commit (the fan-in's chosen branch).
    merge_parents: list[str] = msgspec.field(default_factory=list)
    # Trees of the worktree computed for a stage's files_touched, by stage id: a
    # branch's commit of the stage reuses its own.
    stage_trees: dict[str, str] = msgspec.field(default_factory=dict)
    # A child workflow makes no commits: the tree after its last stage, which the next
    # stage's files_touched is diffed against (None: its tip's tree).
    base_tree: str | None = None
    # A child workflow's progress ref (see `child_progress`), None where nothing keeps it.
    progress_ref: str | None = None
    # Why a child's manager stopped it (see `Supervision`): the stage in flight is cut
    # off through `halt_scope` and the walk goes no further.
    halted: str | None = None
    halt_scope: Any = None

    def halt(self, reason: str) -> None:
        self.halted = reason
        if self.halt_scope is not None:
            self.halt_scope.cancel()

    def qualified(self, node_id: str) -> str:
        return f"{self.prefix}{node_id}"


class Decision(msgspec.Struct):
    """Where a walk goes after a stage: a next node, an error that ends it failed, or
    neither, which ends it where it stands (an exit, or a stage with no edge to take)."""

    next_node: str | None
    error: str | None = None

    @property
    def ends_walk(self) -> bool:
        return self.next_node is None and self.error is None


class WalkEnd(msgspec.Struct):
    """How a walk ended: its final status, and the node it stopped in front of (a
    branch's fan-in or exit), if any."""

    status: str
    stopped_at: str | None = None


class Supervision(msgspec.Struct, frozen=True):
    """A manager loop's controls over its child workflow: every `poll_interval` seconds
    a cycle checks `stop_condition` on the child's context (true: the child stops, the
    stage succeeds); after `max_cycles` cycles the child stops and the stage fails. A
    child that ends on its own ends the stage at once, between polls."""

    poll_interval: float = 45.0
    max_cycles: int = 1000
    stop_condition: str | None = None


class ChildResult(msgspec.Struct):
    """A child workflow's end: its status (failed with `error`), the stages it ran, and
    the context keys it set."""

    status: str
    steps: int
    context_updates: dict[str, Any]
    error: str | None = None
    notes: str | None = None


def final_status(scope: Scope) -> str:
    """How a walk that reached its end went: failed when its last stage failed (a failure
    a condition routed to the end, say into a fan-in), else partially succeeded if any
    of its stages did, else succeeded."""
    if scope.completed and scope.outcomes.get(scope.completed[-1], {}).get("status") == oc.FAILED:
        return oc.FAILED
    statuses = {rec.get("status") for rec in scope.outcomes.values()}
    return oc.PARTIAL if oc.PARTIAL in statuses else oc.SUCCEEDED


class Runtime:
    """Run-wide services shared by every scope and handler."""

    def __init__(
        self,
        *,
        run_id: str,
        repo: GitRepo,
        graph: Graph,
        manifest: Manifest,
        checkpoint: Checkpoint,
        emit_event: Emit,
        recorder: Recorder | None,
        scratch: Path,
        worktree: Path,
        interviewer: Interviewer,
        options: Options,
        handlers: Callable[[str], Handler | None],
        hooks: LifecycleHooks | None = None,
    ) -> None:
        self.run_id = run_id
        self.repo = repo
        self.graph = graph
        self.manifest = manifest
        self.cp = checkpoint
        self.emit_event = emit_event
        self.recorder = recorder
        self.scratch = scratch
        self.worktree = worktree
        self.interviewer = interviewer
        self.options = options
        self.handlers = handlers
        self.hooks = hooks or LifecycleHooks(
            [],
            run_id=run_id,
            workflow=graph.name,
            host_dir=worktree,
            scratch=scratch,
            emit=emit_event,
        )
        self.rng = random.Random()
        # A Path value is a file streamed into git at the checkpoint (a command's whole output).
        self.pending_files: dict[str, bytes | Path | None] = {}
        self.artifacts = ArtifactStore(scratch)
        # The stage tree computed for `files_touched` before stage.completed, by stage
        # id, for its checkpoint to reuse (or the error computing it, to raise there).
        self._stage_trees: dict[str, str | FabroError | None] = {}
        # What a scan of the worktree for a stage's tree found running, by stage id, and
        # what the last checkpoint's scan left (see `clean_start`).
        self.scan_hooks: dict[str, int | None] = {}
        self.clean_mark: CleanMark | None = None
        # One git call at a time, each on a worker thread (see `store_call`).
        self._store_lock = trio.Lock()
        self._tree_cache: dict[str, str] = {}
        self._context_copy = CheckpointCopy()
        # Signs of life for the stall watchdog: events emitted, git calls in flight.
        self.activity = 0
        self.store_busy = 0
        self.run_started = time.monotonic()
        self.active_base_ms = checkpoint.active_ms
        # Attempts a crash cut off, by stage_id: a stage run again after resume counts on
        # from them. Only the stages up to the first checkpoint after resume can use them.
        self.resumed_attempts: dict[str, int] = {}
        # Agent stages in flight that take steering text (`git fabro steer`).
        self.steer_targets: list[Callable[[str], None]] = []
        # The edge `route` chose last (from, to, label), for the edge_selected hooks.
        self._last_edge: tuple[str, str, str | None] | None = None
        # What a stage may not change in the user's repository (see `repo_guard`).
        self.repo_guard = RepoGuard(self)

    def steer(self, text: str) -> bool:
        """Hand `text` to every agent stage in flight; False when none is listening."""
        for target in list(self.steer_targets):
            target(text)
        return bool(self.steer_targets)

    # -- events ------------------------------------------------------------------------

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
    ) -> None:
        """Emit an event's properties Struct, with the envelope's stage and
        agent-session fields."""
        self.activity += 1
        self.emit_event(
            event,
            node_id=node_id,
            node_label=node_label,
            stage_id=stage_id,
            session_id=session_id,
            parent_session_id=parent_session_id,
        )

    async def store_call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking git call on a worker thread, one at a time: the trio loop (other
        branches, the watchdog, Ctrl-C) goes on meanwhile."""
        async with self._store_lock:
            self.store_busy += 1
            try:
                return await trio.to_thread.run_sync(fn, *args)
            finally:
                self.store_busy -= 1
                self.activity += 1

    def active_ms(self) -> int:
        return self.active_base_ms + int((time.monotonic() - self.run_started) * 1000)

    # -- the main walk -----------------------------------------------------------------

    def main_scope(self) -> Scope:
        cp = self.cp
        return Scope(
            kind="main",
            graph=self.graph,
            context=Context(cp.context_values),
            worktree=self.worktree,
            visits=cp.node_visits,
            outcomes=cp.node_outcomes,
            completed=cp.completed_nodes,
            loop_signatures=cp.loop_failure_signatures,
            restart_signatures=cp.restart_failure_signatures,
            ref=self.recorder.run_ref if self.recorder else None,
            tip=self.recorder.run_tip if self.recorder else None,
        )

    async def run_main(self, scope: Scope) -> str:
        """Walk from the checkpoint's next node to the exit. Returns the final status."""
        start = self.graph.start_node()
        assert start is not None  # validation refused graphs without one
        if self.cp.next_node_id is None and walk_finished(self.cp, self.graph):
            # Resumed after the last stage's checkpoint: only the finish is left.
            return final_status(scope)
        end = await self.walk(scope, self.cp.next_node_id or start.id)
        return end.status

    async def walk(self, scope: Scope, node_id: str) -> WalkEnd:
        """The one walk, for every scope: from `node_id` to the exit, a stage with no edge
        to take, or a node the scope stops in front of. Goal gates are checked wherever
        the walk would end. RunFailed when it cannot go on."""
        while True:
            if scope.halted is not None:
                return WalkEnd(final_status(scope))
            node = self._node(scope, node_id)
            stops = node.handler_type in scope.stop_at or node.id in scope.stop_nodes
            if node.handler_type == "exit" or stops:
                gates = self._check_goal_gates(scope)
                if gates.error is not None:
                    raise RunFailed(gates.error)
                if gates.next_node is not None:
                    node_id = gates.next_node
                    continue
                if stops:
                    return WalkEnd(final_status(scope), node.id)
            visit = self._enter(scope, node)
            stage_id = self._new_stage_id(scope, node)
            result = await self.execute_stage(scope, node, visit, stage_id)
            stopped = await self._stage_end_hooks(scope, node, result)
            if stopped is not None:
                decision = stopped
            elif node.handler_type == "exit":
                decision = Decision(None)
            else:
                self._last_edge = None
                decision = self.route(scope, node, result)
                if decision.ends_walk:
                    # A stage with no edge to take ends the walk as the exit would, goal
                    # gates included: routing around the exit must not skip them.
                    decision = self._check_goal_gates(scope)
                elif decision.next_node is not None and self._last_edge is not None:
                    decision = await self._edge_hooks(scope, decision)
            await self._record(scope, node, visit, stage_id, result, decision)
            if scope.kind == "main":
                await self._checkpoint_hooks(node, result)
                cap = self.options.max_cost
                if cap is not None and decision.next_node is not None and self.cp.total_cost > cap:
                    raise SpendingCapReached(self.cp.total_cost, cap)
            if decision.error is not None:
                raise RunFailed(decision.error)
            if decision.next_node is None:
                return WalkEnd(final_status(scope))
            node_id = decision.next_node

    # -- lifecycle hooks at the walk's decision points -----------------------------------

    async def _stage_end_hooks(self, scope: Scope, node: Node, result: Outcome) -> Decision | None:
        """`stage_complete` or `stage_failed`; a block ends the walk failed there (the
        stage itself stays recorded as it ended)."""
        event = "stage_failed" if result.status == oc.FAILED else "stage_complete"
        if not self.hooks.wants(event):
            return None
        decision = await self.hooks.fire(
            event,
            node_id=scope.qualified(node.id),
            node_label=node.label,
            handler_type=node.handler_type,
            status=result.status,
            failure_reason=result.error if result.status == oc.FAILED else None,
        )
        return Decision(None, decision.describe(event)) if decision.action == "block" else None

    async def _edge_hooks(self, scope: Scope, decision: Decision) -> Decision:
        """`edge_selected`: a block ends the walk failed, an override goes to `edge_to`."""
        if not self.hooks.wants("edge_selected") or self._last_edge is None:
            return decision
        edge_from, edge_to, label = self._last_edge
        said = await self.hooks.fire(
            "edge_selected", edge_from=edge_from, edge_to=edge_to, edge_label=label
        )
        if said.action == "block":
            return Decision(None, said.describe("edge_selected"))
        if said.action == "override" and said.edge_to is not None:
            if said.edge_to not in scope.graph.nodes:
                return Decision(
                    None,
                    f"{said.describe('edge_selected')}, to {said.edge_to!r}, which is no node of the workflow",
                )
            self.emit(
                ev.RunNotice(
                    level="info",
                    code="hook_override",
                    message=f"{said.describe('edge_selected')}: going to {said.edge_to} instead of {edge_to}",
                )
            )
            return Decision(said.edge_to)
        return decision

    async def _checkpoint_hooks(self, node: Node, result: Outcome) -> None:
        """`checkpoint_saved`; a block stops the run at the checkpoint just saved."""
        if not self.hooks.wants("checkpoint_saved"):
            return
        said = await self.hooks.fire(
            "checkpoint_saved",
            node_id=node.id,
            node_label=node.label,
            status=result.status,
            git_commit_sha=self.recorder.run_tip if self.recorder else None,
        )
        if said.action == "block":
            raise RunFailed(said.describe("checkpoint_saved"))

    async def _stage_start_hooks(
        self, node: Node, qid: str, attempt: int, max_attempts: int
    ) -> Outcome | None:
        """`stage_start`: a block fails the stage (routed as any failure), a skip ends it
        skipped without running it, an override skips it and jumps to `edge_to`."""
        said = await self.hooks.fire(
            "stage_start",
            node_id=qid,
            node_label=node.label,
            handler_type=node.handler_type,
            attempt=attempt,
            max_attempts=max_attempts,
        )
        if said.action == "block":
            return Outcome.failure(said.describe("stage_start"), oc.DETERMINISTIC)
        if said.action in ("skip", "override"):
            return Outcome(
                status=oc.SKIPPED,
                notes=said.describe("stage_start"),
                jump_to_node=said.edge_to if said.action == "override" else None,
            )
        return None

    async def _retry_allowed(
        self, node: Node, qid: str, result: Outcome, attempt: int, max_attempts: int
    ) -> bool:
        """`stage_retrying`: a block ends the stage with its failure instead of a retry."""
        if not self.hooks.wants("stage_retrying"):
            return True
        said = await self.hooks.fire(
            "stage_retrying",
            node_id=qid,
            node_label=node.label,
            handler_type=node.handler_type,
            failure_reason=result.error,
            attempt=attempt,
            max_attempts=max_attempts,
        )
        if said.action != "block":
            return True
        result.error = (
            f"{result.error or 'retry requested'} (no retry: {said.describe('stage_retrying')})"
        )
        return False

    async def _record(
        self,
        scope: Scope,
        node: Node,
        visit: int,
        stage_id: str,
        result: Outcome,
        decision: Decision,
    ) -> None:
        """What a scope keeps of a finished stage: the main run checkpoints, a branch
        commits on its ref, a child leaves its files to its parent's stage."""
        if scope.kind == "main":
            # A failed walk names its last stage as next, so a run cut off before the
            # finish resumes there rather than looking finished.
            next_node = node.id if decision.error is not None else decision.next_node
            await self.store_call(
                partial(self._checkpoint, scope, node, visit, stage_id, result, next_node=next_node)
            )
        elif scope.kind == "branch":
            from fabro_git.engine.branches import commit_branch_stage

            await self.store_call(
                commit_branch_stage, self, scope, node.id, result.status, stage_id
            )
        else:
            if node.handler_type not in NO_WORKTREE_CHANGES:
                await self._advance_child_tree(scope, stage_id)
            if decision.next_node is not None and scope.progress_ref is not None:
                await self.store_call(child_progress.save, self, scope, decision.next_node)

    async def run_child(
        self,
        parent: Scope,
        node: Node,
        graph: Graph,
        stage_id: str | None = None,
        supervision: Supervision | None = None,
    ) -> ChildResult:
        """Walk a child workflow inside `node`'s stage (`stage_id`): the parent's worktree
        and tip, a copy of its context, and stage ids under `<node>/`. A rerun of the
        stage after a crash goes on from the child's last completed stage."""
        from fabro_git.store.runs import child_progress_ref

        start = graph.start_node()
        assert start is not None  # validation refused graphs without one
        scope = Scope(
            kind="child",
            graph=graph,
            context=parent.context.fork(),
            worktree=parent.worktree,
            visits={},
            outcomes={},
            completed=[],
            loop_signatures={},
            restart_signatures={},
            tip=parent.tip,
            prefix=f"{parent.qualified(node.id)}/",
            merge_parents=parent.merge_parents,
        )
        before = dict(parent.context)
        begin = start.id
        if stage_id is not None and self.recorder is not None and parent.tip is not None:
            scope.progress_ref = child_progress_ref(self.run_id, stage_id)
            begin = await self._resume_child(scope, begin)
        try:
            if supervision is None:
                end = await self.walk(scope, begin)
            else:
                end = await self._supervised_walk(scope, begin, supervision)
        except RunFailed as exc:
            result = ChildResult(
                oc.FAILED, scope.steps, context_delta(before, scope.context), str(exc)
            )
        else:
            result = ChildResult(end.status, scope.steps, context_delta(before, scope.context))
        if scope.halted is not None:
            # The manager's word decides: a stop condition that held is a success, cycles
            # run out a failure, whatever the stage it cut off made of it.
            stopped = scope.halted.startswith("stop condition")
            result.status = oc.SUCCEEDED if stopped else oc.FAILED
            result.error = None if stopped else scope.halted
            result.notes = scope.halted
        if scope.progress_ref is not None:
            await self.store_call(child_progress.drop, self, scope.progress_ref)
        return result

    async def _supervised_walk(self, scope: Scope, begin: str, rules: Supervision) -> WalkEnd:
        """Walk the child while its manager polls it (see `Supervision`)."""
        from fabro_git.outputs.artifacts import ResolvedContext
        from fabro_git.workflow.conditions import evaluate_condition

        async def poll() -> None:
            for cycle in range(1, rules.max_cycles + 1):
                await trio.sleep(rules.poll_interval)
                context = scope.context
                if rules.stop_condition and evaluate_condition(
                    rules.stop_condition,
                    outcome=str(context.get("outcome") or ""),
                    preferred_label=context.get("preferred_label"),
                    context=ResolvedContext(context),
                ):
                    scope.halt(f"stop condition {rules.stop_condition!r} held at cycle {cycle}")
                    return
            scope.halt(
                f"the child workflow was still running after {rules.max_cycles} cycles "
                f"of {rules.poll_interval:g}s (manager.max_cycles)"
            )

        end: WalkEnd | RunFailed = WalkEnd(oc.FAILED)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            try:
                end = await self.walk(scope, begin)
            except RunFailed as exc:
                end = exc  # raised outside the nursery, not inside an exception group
            nursery.cancel_scope.cancel()
        if isinstance(end, RunFailed):
            raise end
        return end

    async def _resume_child(self, scope: Scope, start: str) -> str:
        """Put a child scope back where its progress ref says it stood (its files into
        the worktree, its walk's state); the node to walk from."""
        from fabro_git.store.adopt import adopt_tree

        assert scope.progress_ref is not None
        found = await self.store_call(child_progress.load, self, scope.progress_ref)
        if found is None:
            return start
        sha, state = found
        await self.store_call(adopt_tree, scope.worktree, sha)
        scope.visits.update(state.visits)
        scope.outcomes.update(state.outcomes)
        scope.completed.extend(state.completed)
        scope.loop_signatures.update(state.loop_signatures)
        scope.restart_signatures.update(state.restart_signatures)
        scope.context = Context(state.context)
        scope.steps = state.steps
        scope.base_tree = await self.store_call(self._tip_tree, sha)
        self.emit(
            ev.RunNotice(
                level="info",
                code="child_resumed",
                message=f"child workflow {scope.prefix.rstrip('/')} goes on at {state.next_node}, "
                f"after the {len(state.completed)} stages it had completed",
            )
        )
        return state.next_node

    def _node(self, scope: Scope, node_id: str) -> Node:
        node = scope.graph.nodes.get(node_id)
        if node is None:
            where = {
                "main": "the workflow",
                "branch": "the branch's workflow",
                "child": "the child workflow",
            }[scope.kind]
            raise RunFailed(f"{where} has no node {scope.qualified(node_id)!r}")
        return node

    def _enter(self, scope: Scope, node: Node) -> int:
        visit = scope.visits.get(node.id, 0) + 1
        bound = visit_limit(node, scope.graph, dry_run=self.options.dry_run)
        ran = visit - 1
        if bound.across_restarts:
            ran = max(ran, scope.completed.count(node.id))
        if bound.most and ran >= bound.most:
            raise RunFailed(
                f"node {scope.qualified(node.id)} has run {ran} times, its limit ({bound.source}); "
                "the run is stuck in a cycle"
            )
        scope.visits[node.id] = visit
        return visit

    def _new_stage_id(self, scope: Scope, node: Node) -> str:
        """The stage_id of the stage about to run: `<qualified node>@<serial>`, the
        serial counted over the whole run (see `Checkpoint.stage_serials`), so no two
        executions share one even where visit counts start again or overlap."""
        qid = scope.qualified(node.id)
        serial = self.cp.stage_serials.get(qid, 0) + 1
        self.cp.stage_serials[qid] = serial
        return f"{qid}@{serial}"

    def _check_goal_gates(self, scope: Scope) -> Decision:
        """Where a walk would end: go on (no next node), retry from a gate's retry
        target, or fail when an unsatisfied gate has none."""
        gate = self._unsatisfied_goal_gate(scope)
        if gate is None:
            return Decision(None)
        target = self._goal_gate_target(scope.graph, gate)
        if target is None:
            return Decision(
                None,
                f"goal gate unsatisfied for node {scope.qualified(gate.id)} and no retry target",
            )
        self.emit(
            ev.RunNotice(
                level="warn",
                code="goal_gate_retry",
                message=f"goal gate {gate.id} is not satisfied; retrying from {target}",
            )
        )
        return Decision(target)

    def _unsatisfied_goal_gate(self, scope: Scope) -> Node | None:
        for node_id, record in scope.outcomes.items():
            node = scope.graph.nodes.get(node_id)
            if (
                node is not None
                and node.get_bool("goal_gate", False)
                and record.get("status") not in (oc.SUCCEEDED, oc.PARTIAL)
            ):
                return node
        return None

    def _goal_gate_target(self, graph: Graph, gate: Node) -> str | None:
        for value in (
            gate.get("retry_target"),
            gate.get("fallback_retry_target"),
            graph.attrs.get("retry_target"),
            graph.attrs.get("fallback_retry_target"),
        ):
            if value and value in graph.nodes:
                return value
        return None

    # -- one stage -----------------------------------------------------------------------

    async def execute_stage(self, scope: Scope, node: Node, visit: int, stage_id: str) -> Outcome:
        graph = scope.graph
        qid = scope.qualified(node.id)
        label = node.label
        handler = self.handlers(node.handler_type)
        policy = policy_for(node, graph)
        self.cp.stage_index += 1
        index = self.cp.stage_index
        node_dir = qid.replace("/", f"/{runrefs.NODES_DIR}/") if scope.prefix else node.id
        node_dir = runrefs.node_dir_name(node_dir, visit)
        stage_dir = self.scratch / "nodes" / node_dir
        make_private_dir(stage_dir)
        ctx = scope.context
        ctx.set("current_node", node.id)
        ctx.set("internal.node_visit_count", visit)
        started = time.monotonic()
        started_at = now_iso()
        result: Outcome
        attempt = 1
        # Attempts cut off by a crash are numbered but do not use up the retry budget.
        earlier = self.resumed_attempts.pop(stage_id, 0)
        max_attempts = policy.max_attempts + earlier
        files: dict[str, bytes | Path] = {}
        while True:
            # A checkpoint per attempt, so Ctrl-C and the watchdog get through even when
            # every handler on the path finishes without awaiting anything.
            await trio.lowlevel.checkpoint()
            ctx.set(f"internal.retry_count.{node.id}", attempt - 1)
            self.emit(
                ev.StageStarted(
                    index=index,
                    handler_type=node.handler_type,
                    attempt=earlier + attempt,
                    max_attempts=max_attempts,
                ),
                node_id=qid,
                node_label=label,
                stage_id=stage_id,
            )
            request = StageRequest(
                _runtime=self,
                _scope=scope,
                graph=graph,
                node=node,
                context=ctx,
                visit=visit,
                attempt=earlier + attempt,
                stage_id=stage_id,
                worktree=scope.worktree,
                stage_dir=stage_dir,
                node_dir=node_dir,
            )
            hooked = None
            if self.hooks.wants("stage_start"):
                hooked = await self._stage_start_hooks(node, qid, earlier + attempt, max_attempts)
            if hooked is not None:
                result = hooked
            elif handler is None:
                result = Outcome.failure(
                    f"no handler for node type {node.handler_type!r}", oc.STRUCTURAL
                )
            else:
                assets = await self._asset_baseline(node, scope)
                result = await self.repo_guard.around(
                    request, functools.partial(self._call_handler, handler, request, node)
                )
                if assets is not None:
                    await self._capture_assets(request, assets)
            files = request.files
            retryable = result.status == oc.RETRY or (
                result.status == oc.FAILED and result.failure_class == oc.TRANSIENT
            )
            if (
                retryable
                and attempt < policy.max_attempts
                and await self._retry_allowed(
                    node, qid, result, earlier + attempt + 1, max_attempts
                )
            ):
                self.emit(
                    ev.StageFailed(
                        index=index,
                        error=result.error or "retry requested",
                        failure_class=oc.event_failure_class(result.failure_class or oc.TRANSIENT),
                        failure_signature=failure_signature(
                            qid, result.failure_class, result.error
                        ),
                        will_retry=True,
                    ),
                    node_id=qid,
                    node_label=label,
                    stage_id=stage_id,
                )
                # A tree taken during the attempt (an agent CLI's) is not the stage's.
                self._stage_trees.pop(stage_id, None)
                self.scan_hooks.pop(stage_id, None)
                delay = policy.delay_for(attempt, self.rng)
                self.cp.node_retries[qid] = self.cp.node_retries.get(qid, 0) + 1
                attempt += 1
                self.emit(
                    ev.StageRetrying(
                        index=index,
                        attempt=earlier + attempt,
                        max_attempts=max_attempts,
                        delay_ms=int(delay * 1000),
                    ),
                    node_id=qid,
                    node_label=label,
                    stage_id=stage_id,
                )
                await trio.sleep(delay)
                continue
            if result.status == oc.RETRY:
                result.status = oc.PARTIAL if node.get_bool("allow_partial", False) else oc.FAILED
                if result.status == oc.FAILED and not result.error:
                    result.error = "retries exhausted"
            elif result.status == oc.FAILED and retryable and node.get_bool("allow_partial", False):
                result.status = oc.PARTIAL
            break
        if node.get_bool("auto_status", False) and result.status not in (oc.SUCCEEDED, oc.SKIPPED):
            result.notes = (
                result.notes + "; " if result.notes else ""
            ) + f"auto_status: was {result.status}"
            result.status = oc.SUCCEEDED
        signature = None
        # A conditional node carries the previous stage's outcome through for its edge
        # conditions; that is routing data, not a failure of its own.
        passthrough = node.handler_type == "conditional"
        if result.status == oc.FAILED and not passthrough:
            result.failure_class = result.failure_class or oc.DETERMINISTIC
            signature = failure_signature(qid, result.failure_class, result.error)
            self.emit(
                ev.StageFailed(
                    index=index,
                    error=result.error or "stage failed",
                    failure_class=oc.event_failure_class(result.failure_class),
                    failure_signature=signature,
                    will_retry=False,
                ),
                node_id=qid,
                node_label=label,
                stage_id=stage_id,
            )
        duration_ms = int((time.monotonic() - started) * 1000)
        if node.handler_type in TRACKS_TREE and not result.files_touched:
            result.files_touched = await self._files_touched(scope, stage_id)
        updates = await self._offload(scope, result, node_dir, files)
        self._apply(scope, node, result, signature, updates)
        record = result.to_record()
        record.update(
            node_id=qid,
            visit=visit,
            attempt=earlier + attempt,
            started_at=started_at,
            duration_ms=duration_ms,
        )
        if signature:
            record["failure_signature"] = signature
        scope.outcomes[node.id] = record
        scope.completed.append(node.id)
        scope.steps += 1
        self.pending_files[f"{runrefs.node_dir(node_dir)}/{runrefs.NODE_STATUS}"] = (
            msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n"
        )
        for name, data in files.items():
            self.pending_files[f"{runrefs.node_dir(node_dir)}/{name}"] = data
        usage = None
        if result.usage is not None:
            usage = ev.StageUsage(
                **{k: v for k, v in msgspec.structs.asdict(result.usage).items() if v is not None}
            )
            self.cp.total_cost += result.usage.cost or 0.0
            self.cp.tokens.add(result.usage)
        completed = ev.StageCompleted(
            index=index,
            duration_ms=duration_ms,
            status=oc.event_status(result.status),
            preferred_label=result.preferred_label,
            suggested_next_ids=list(result.suggested_next_ids),
            usage=usage,
            error=result.error,
            failure_class=oc.event_failure_class(result.failure_class)
            if result.status == oc.FAILED and result.failure_class
            else None,
            failure_signature=signature,
            context_updates=plain(result.context_updates) or None,
            jump_to_node=result.jump_to_node,
            node_visits=dict(scope.visits),
            loop_failure_signatures=dict(scope.loop_signatures) or None,
            restart_failure_signatures=dict(scope.restart_signatures) or None,
            response=_event_response(result),
            notes=result.notes,
            files_touched=list(result.files_touched),
            attempt=earlier + attempt,
            max_attempts=max_attempts,
        )
        self.emit(completed, node_id=qid, node_label=label, stage_id=stage_id)
        return result

    async def _call_handler(self, handler: Handler, request: StageRequest, node: Node) -> Outcome:
        """Run the handler inside the stage's one cancel scope: the node's `timeout`
        bounds every handler type alike. A timeout is a transient failure, unless the
        handler said what it ends with (`StageRequest.on_timeout`)."""
        timeout = stage_timeout(node)
        # In the user's checkout, `.fabro/` is theirs: a stage that changed it fails, and
        # the change is put back, even when the stage was cut off.
        config, refused = None, None
        if self.options.in_place:
            # No `.fabro/` (one lstat): nothing to read, so no trip to a worker thread.
            if os.path.lexists(request.worktree / ".fabro"):
                config = await trio.to_thread.run_sync(ConfigSnapshot, request.worktree)
            else:
                config = ConfigSnapshot(request.worktree)
        scope = request._scope
        try:
            with trio.CancelScope() as halt:
                scope.halt_scope = halt
                try:
                    with trio.move_on_after(timeout if timeout else float("inf")) as deadline:
                        result = await self._guarded(handler, request, node)
                finally:
                    scope.halt_scope = None
            if halt.cancelled_caught:
                result = Outcome.failure(f"stopped by its manager: {scope.halted}", oc.CANCELED)
            elif deadline.cancelled_caught:
                assert timeout is not None
                if request.timeout_outcome is not None:
                    result = await request.timeout_outcome(timeout)
                else:
                    result = Outcome.failure(
                        f"{node.handler_type} stage {node.id} timed out after {timeout:g}s",
                        oc.TRANSIENT,
                    )
        finally:
            # Nothing the stage started outlives it, daemons that left its groups too;
            # then nothing is left to change `.fabro/` behind the check.
            request.sweep()
            if config is not None and config.may_have_changed:
                with trio.CancelScope(shield=True):
                    refused = await trio.to_thread.run_sync(
                        partial(config_change_refused, config, what=f"stage {node.id}")
                    )
        if refused is not None:
            return Outcome.failure(refused, oc.DETERMINISTIC)
        return result

    async def _guarded(self, handler: Handler, request: StageRequest, node: Node) -> Outcome:
        try:
            return await handler(request)
        except trio.Cancelled:
            raise
        except Exception as exc:
            if disk_full_in(exc) is not None:
                raise  # not the stage's failure: the run stops at its last checkpoint
            if isinstance(exc, FabroError):
                return Outcome.failure(str(exc), oc.DETERMINISTIC)
            # A handler bug must not take the run's state with it.
            request.files["handler-error.txt"] = "".join(traceback.format_exception(exc)).encode()
            return Outcome.failure(
                f"handler error in {node.id}: {type(exc).__name__}: {exc}", oc.DETERMINISTIC
            )

    @property
    def asset_include(self) -> tuple[str, ...]:
        """`[run.artifacts] include`: the run's own globs of files to capture as assets,
        beside the known test-report paths."""
        config = self.manifest.settings.get("config") or {}
        return tuple((config.get("artifacts") or {}).get("include") or ())

    async def _asset_baseline(self, node: Node, scope: Scope) -> Snapshot | None:
        """The asset files before a stage that runs commands (None for other stages)."""
        if node.handler_type not in RUNS_COMMANDS:
            return None
        from fabro_git.outputs import assets

        return await trio.to_thread.run_sync(assets.baseline, scope.worktree, self.asset_include)

    async def _capture_assets(self, request: StageRequest, before: Snapshot) -> None:
        """Copy the assets the attempt wrote to scratch and, at the next checkpoint, the
        meta ref; one `asset.captured` per file."""
        from fabro_git.outputs import assets
        from fabro_git.store.runs import asset_dir, node_slug

        found = await trio.to_thread.run_sync(
            assets.capture, request.worktree, before, self.asset_include
        )
        if found.empty:
            return
        slug = node_slug(request.node_dir)
        directory = asset_dir(slug, request.attempt)
        kept = await trio.to_thread.run_sync(assets.keep, self.scratch, directory, found)
        self.pending_files.update(kept)
        for item in found.files:
            request.emit(
                ev.AssetCaptured(
                    attempt=request.attempt,
                    node_slug=slug,
                    path=item.path,
                    mime=item.mime,
                    content_md5=item.md5,
                    content_sha256=item.sha256,
                    bytes=len(item.data),
                )
            )

    async def _files_touched(self, scope: Scope, stage_id: str) -> list[str]:
        """The paths the stage changed: its worktree's tree against the scope's last
        recorded one (the main run's checkpoint, a branch's last commit on its ref, the
        tree after a child workflow's previous stage).

        The tree is computed here, before stage.completed, and the checkpoint or branch
        commit reuses it: computing it writes objects only, so it is as safe to do early
        as late.
        """
        if scope.kind != "main":
            return await self._scope_files_touched(scope, stage_id)
        recorder = self.recorder
        if recorder is None or recorder.run_tip is None or recorder.worktree is None:
            return []
        before = recorder.run_tip
        self.scan_hooks[stage_id] = clean_start.hooks_seen(self)
        node_id = stage_id.rpartition("@")[0]

        def tree_and_files() -> tuple[str | FabroError | None, list[str], Exception | None]:
            # One trip to a worker thread for the three steps: each trip costs a thread
            # hand-off, which a loaded machine makes dear.
            try:
                tree = recorder.stage_tree(node_id)
            except FabroError as err:
                return err, [], None  # the checkpoint reports it
            if tree is None:
                return None, [], None
            try:
                old = self._tip_tree(before)
            except Exception as err:  # raised below, once the tree is kept
                return tree, [], err
            try:
                return tree, self.repo.changed_paths(old, tree, limit=FILES_TOUCHED_LIMIT), None
            except FabroError:
                return tree, [], None

        tree, files, error = await self.store_call(tree_and_files)
        self._stage_trees[stage_id] = tree
        if error is not None:
            raise error
        return files

    async def _scope_files_touched(self, scope: Scope, stage_id: str) -> list[str]:
        """`_files_touched` in a parallel branch or a child workflow."""
        from fabro_git.engine.branches import worktree_tree

        tip = scope.tip
        if self.recorder is None or tip is None:
            return []
        qid = stage_id.rpartition("@")[0]
        try:
            tree = await self.store_call(worktree_tree, self, scope.worktree, qid)
        except FabroError:
            return []  # a branch's commit meets the same error and fails the branch
        if tree is None:
            return []
        scope.stage_trees[stage_id] = tree
        old = scope.base_tree
        if old is None:
            old = await self.store_call(self._tip_tree, tip)
        with contextlib.suppress(FabroError):
            return await self.store_call(
                partial(self.repo.changed_paths, old, tree, limit=FILES_TOUCHED_LIMIT)
            )
        return []

    async def _advance_child_tree(self, scope: Scope, stage_id: str) -> None:
        """A child workflow's stage is done: its tree becomes the base of the next
        stage's files_touched (computed now if the stage did not need it itself)."""
        from fabro_git.engine.branches import worktree_tree

        tree = scope.stage_trees.pop(stage_id, None)
        if tree is None and self.recorder is not None and scope.tip is not None:
            with contextlib.suppress(FabroError):
                qid = stage_id.rpartition("@")[0]
                tree = await self.store_call(worktree_tree, self, scope.worktree, qid)
        if tree is not None:
            scope.base_tree = tree

    def _stage_tree(self, node: Node, stage_id: str) -> str | None:
        """The stage's tree: the one `_files_touched` computed, else a fresh scan."""
        assert self.recorder is not None
        if stage_id not in self._stage_trees:
            self.scan_hooks[stage_id] = clean_start.hooks_seen(self)
            return self.recorder.stage_tree(node.id)
        early = self._stage_trees.pop(stage_id)
        if isinstance(early, FabroError):
            raise early
        return early

    async def _offload(
        self, scope: Scope, result: Outcome, node_dir: str, files: Mapping[str, bytes | Path]
    ) -> dict[str, Any]:
        """Offload the stage's large context values; the next checkpoint records them.
        The record keeps pointers to the visit's own files; returns the updates as the
        context takes them (pointers to each key's current file). The values are
        written on a worker thread, and meanwhile they and the stage's files are
        scanned for secrets and stored as blobs for the checkpoint."""
        from fabro_git.store.runs import PARALLEL_PREFIX, artifact_path, node_slug

        tag = None
        if scope.kind == "branch" and scope.ref:
            # Branches may set the same key at once: each keeps its own file.
            tag = scope.ref.removeprefix(f"{PARALLEL_PREFIX}{self.run_id}/")
        offloaded = self.artifacts.plan_stage(result.context_updates, node_slug(node_dir), tag=tag)
        if offloaded.pending:
            meanwhile = None
            recorder = self.recorder
            if recorder is not None:
                stage_files = [data for data in files.values() if isinstance(data, bytes)]

                def meanwhile(values: list[tuple[Any, bytes]]) -> None:
                    recorder.premask(values, stage_files)

            await self.store_call(self.artifacts.write_stage, offloaded, meanwhile)
        result.context_updates = offloaded.record
        for name, data in offloaded.written.items():
            # A long reply's text file is one blob with its response.md (see artifacts).
            self.pending_files[artifact_path(name, text=isinstance(data, Path))] = data
        return offloaded.context

    def _prune_artifacts(self, files: dict[str, bytes | Path | None]) -> None:
        """Drop the current-value artifacts the checkpoint no longer points to, here and
        on the meta ref; count the values offloaded over the run."""
        from fabro_git.store.runs import artifact_path

        cp = self.cp
        if not self.artifacts.names():
            # Nothing offloaded, so nothing to prune: skip the scan of the whole history.
            cp.artifact_count = 0
            return
        keep = referenced_names(cp.context_values, cp.node_outcomes.values())
        for name in self.artifacts.prune(keep):
            files[artifact_path(name)] = files[artifact_path(name, text=True)] = None
        cp.artifact_count = sum("/" in name for name in self.artifacts.names())

    def _apply(
        self,
        scope: Scope,
        node: Node,
        result: Outcome,
        signature: str | None,
        updates: dict[str, Any],
    ) -> None:
        ctx = scope.context
        ctx.update(updates)
        ctx.set("outcome", result.status)
        if result.preferred_label:
            ctx.set("preferred_label", result.preferred_label)
        else:
            ctx.remove("preferred_label")
        if result.status == oc.FAILED:
            ctx.set("failure_class", result.failure_class)
            ctx.set("failure_signature", signature)
        else:
            ctx.remove("failure_class")
            ctx.remove("failure_signature")
        if signature and is_tracked(result.failure_class):
            scope.loop_signatures[signature] = scope.loop_signatures.get(signature, 0) + 1

    # -- routing -------------------------------------------------------------------------

    def route(self, scope: Scope, node: Node, result: Outcome) -> Decision:
        graph = scope.graph
        qid = scope.qualified(node.id)
        limit = graph.get_int("loop_restart_signature_limit", 3)
        sig = scope.context.get("failure_signature") if result.status == oc.FAILED else None
        if (
            sig
            and is_tracked(result.failure_class)
            and limit
            and scope.loop_signatures.get(sig, 0) >= limit
        ):
            return Decision(None, _same_failure(qid, result, scope.loop_signatures[sig], limit))
        if result.jump_to_node:
            if result.jump_to_node not in graph.nodes:
                return Decision(
                    None, f"{qid} asked to jump to unknown node {result.jump_to_node!r}"
                )
            self._edge_event(scope, node, result, result.jump_to_node, None, None, "jump", True)
            return Decision(result.jump_to_node)
        # A fan-out's edges are its branches, already run: when none reached a fan-in,
        # there is no edge left to take.
        fanned_out = node.handler_type == "parallel"
        selection = None
        if not fanned_out:
            selection = select_edge(
                graph,
                node,
                status=result.status,
                preferred_label=result.preferred_label,
                suggested_next_ids=result.suggested_next_ids,
                # A condition on an offloaded key sees its value, not the pointer.
                context=ResolvedContext(scope.context),
                rng=self.rng,
            )
        if (
            result.status == oc.FAILED
            and node.handler_type != "conditional"
            and (selection is None or selection.reason != "condition")
        ):
            for key, scope_attrs in (
                ("retry_target", node.attrs),
                ("fallback_retry_target", node.attrs),
                ("retry_target", graph.attrs),
                ("fallback_retry_target", graph.attrs),
            ):
                target = scope_attrs.get(key)
                if target and target in graph.nodes:
                    self._edge_event(scope, node, result, target, None, None, key, True)
                    return Decision(target)
            return Decision(None, f"stage {qid} failed: {result.error or 'no reason given'}")
        if selection is None:
            if result.status == oc.FAILED:  # a conditional node passing a failure on
                return Decision(
                    None,
                    f"no outgoing edge of {qid} matches (status {result.status}); "
                    "add an unconditional edge or a condition that covers this outcome",
                )
            return self._dead_end(scope, node, result, fanned_out=fanned_out)
        edge = selection.edge
        self._notice_no_directive(scope, node, result, edge, selection.reason)
        if edge.loop_restart:
            if result.status == oc.FAILED and not may_cross_loop_restart(result.failure_class):
                return Decision(
                    None,
                    f"loop_restart blocked: failure_class={result.failure_class} (requires transient_infra)",
                )
            if sig:
                scope.restart_signatures[sig] = scope.restart_signatures.get(sig, 0) + 1
                if limit and scope.restart_signatures[sig] >= limit:
                    count = scope.restart_signatures[sig]
                    return Decision(None, _same_failure(qid, result, count, limit))
            self._edge_event(
                scope,
                node,
                result,
                edge.target,
                edge.label,
                edge.condition,
                selection.reason,
                False,
            )
            self.emit(ev.LoopRestart(from_node=qid, to_node=scope.qualified(edge.target)))
            self._restart(scope)
            return Decision(edge.target)
        self._edge_event(
            scope, node, result, edge.target, edge.label, edge.condition, selection.reason, False
        )
        return Decision(edge.target)

    def _notice_no_directive(
        self, scope: Scope, node: Node, result: Outcome, edge: Edge, reason: str
    ) -> None:
        """A reply with no directive where the node offers a choice of labelled or
        conditional edges: say which edge it took and why, and how a reply chooses. A
        reviewer that answers `ok` otherwise goes down an edge nobody chose, silently."""
        if result.directive_given is not False:
            return
        edges = scope.graph.outgoing(node.id)
        if len(edges) < 2 or not any(e.label or e.condition for e in edges):
            return
        qid = scope.qualified(node.id)
        taken = f"{qid} -> {scope.qualified(edge.target)}"
        if edge.label:
            taken += f" ({edge.label!r})"
        if reason == "condition":
            why = f"it counts as {result.status}, and the condition {edge.condition!r} matched"
        else:
            unmatched = "no condition matched, and " if any(e.condition for e in edges) else ""
            why = (
                f"it counts as {result.status}; {unmatched}this is the unconditional edge "
                "of highest weight (then first by target name)"
            )
        labels = [e.label for e in edges if e.label and not e.condition]
        ask = (
            f'{{"preferred_next_label": "{labels[0]}"}}'
            if labels
            else '{"outcome": "succeeded"|"failed"}'
        )
        message = (
            f"{qid}'s reply gave no routing directive, so the run took {taken}: {why}; "
            f"to choose, the reply ends with a JSON object such as {ask} "
            "(see Replies in git-fabro(1))"
        )
        self.emit(
            ev.RunNotice(
                level="info" if reason == "condition" else "warn",
                code="no_directive",
                message=message,
            ),
            node_id=qid,
            node_label=node.label,
        )

    def _dead_end(self, scope: Scope, node: Node, result: Outcome, *, fanned_out: bool) -> Decision:
        """A stage that did not fail and has no edge to take ends its walk, as the exit would."""
        qid, walk = scope.qualified(node.id), _WALK_NAMES[scope.kind]
        if fanned_out:
            message = (
                f"{qid} finished {result.status}, but none of its branches reached a fan-in, so "
                f"{walk} ends there and no branch's changes are merged; lead the branches to a "
                "fan-in (shape=tripleoctagon) for the workflow to go on"
            )
        else:
            message = (
                f"{qid} finished {result.status} and has no outgoing edge to take, so {walk} "
                "ends there; add an edge from it if the workflow should go on"
            )
        self.emit(
            ev.RunNotice(level="warn", code="no_outgoing_edge", message=message),
            node_id=qid,
            node_label=node.label,
        )
        return Decision(None)

    def _restart(self, scope: Scope) -> None:
        """A loop restart starts the walk afresh from the target: visits and context reset."""
        keep = {
            k: v
            for k, v in scope.context.items()
            if k.startswith(("graph.", "internal.run_id", "internal.work_dir"))
        }
        for key in list(scope.context):
            scope.context.remove(key)
        scope.context.update(keep)
        scope.visits.clear()

    def _edge_event(
        self,
        scope: Scope,
        node: Node,
        result: Outcome,
        target: str,
        label: str | None,
        condition: str | None,
        reason: str,
        is_jump: bool,
    ) -> None:
        self._last_edge = (scope.qualified(node.id), scope.qualified(target), label)
        self.emit(
            ev.EdgeSelected(
                from_node=scope.qualified(node.id),
                to_node=scope.qualified(target),
                label=label,
                condition=condition,
                reason=reason,
                preferred_label=result.preferred_label,
                suggested_next_ids=list(result.suggested_next_ids),
                stage_status=oc.event_status(result.status),
                is_jump=is_jump,
            )
        )

    # -- checkpoints -----------------------------------------------------------------------

    def _tip_tree(self, commit: str) -> str:
        tree = self._tree_cache.get(commit)
        if tree is None:
            tree = self._tree_cache[commit] = self.repo.commit_info(commit).tree
        return tree

    def _checkpoint(
        self,
        scope: Scope,
        node: Node,
        visit: int,
        stage_id: str,
        result: Outcome,
        *,
        next_node: str | None,
    ) -> None:
        cp = self.cp
        self.resumed_attempts.clear()
        cp.current_node = node.id
        cp.next_node_id = next_node
        cp.context_values = self._context_copy.of(scope.context, cp.context_values)
        cp.timestamp = now_iso()
        cp.active_ms = self.active_ms()
        recorder = self.recorder
        files = self.pending_files
        self.pending_files = {}
        self._prune_artifacts(files)
        if recorder is None:
            return
        tree: str | None
        scanned = self.scan_hooks.pop(stage_id, None)
        if (
            node.handler_type in NO_WORKTREE_CHANGES
            and not scope.merge_parents
            and recorder.run_tip
        ):
            # These stages run no user code, so the tree cannot have changed: skip the scan.
            tree = self._tip_tree(recorder.run_tip)
            scanned = None
        else:
            try:
                tree = self._stage_tree(node, stage_id)
                scanned = self.scan_hooks.pop(stage_id, scanned)
            except DiskFull:
                self._forget_unrecorded_stage(scope)
                raise  # the run stops resumable, as for every other full-disk write
            except FabroError as err:
                self._forget_unrecorded_stage(scope)
                raise RunFailed(str(err)) from err
        recorder.plan_commit(cp, node.id, result.status, tree, scope.merge_parents)
        scope.merge_parents.clear()
        scope_kw = {"node_id": node.id, "node_label": node.label, "stage_id": stage_id}
        meta_sha = recorder.snapshot(
            "checkpoint", f"checkpoint {node.id}@{visit}", cp, files, scope=scope_kw
        )
        if meta_sha is None:
            self.pending_files = {**files, **self.pending_files}
            cp.pending_commit = None
            self._forget_unrecorded_stage(scope)
            # Going on would pile stages onto a record git does not hold (and end with a
            # success nothing backs); stop, so resume redoes this stage from the last
            # checkpoint git does hold.
            raise RunFailed(
                f"the checkpoint after {node.id} could not be written to git (see the error above)"
            )
        before = recorder.run_tip
        sha = recorder.commit_pending(cp, node_label=node.label)
        if sha is None and cp.pending_commit is not None:
            raise RunFailed(
                f"the run-branch commit for {node.id} could not be made (see the error above)"
            )
        if sha is not None and tree is not None:
            self._tree_cache[sha] = tree
        scope.tip = recorder.run_tip
        clean_start.after_checkpoint(
            self, node.handler_type, scanned=scanned, tree=tree, sha=sha, parent=before
        )
        diff = None
        if (
            sha is not None
            and before is not None
            and tree is not None
            and tree != self._tip_tree(before)
        ):
            from fabro_git.store import worktree as wt

            with contextlib.suppress(FabroError):
                diff = self.repo.small_tree_diff(self._tip_tree(before), tree, max_bytes=20_000)
                if diff is None:
                    diff = wt.diff_text(self.worktree, before, sha, max_bytes=20_000)
                diff = diff or None
        self.emit(
            ev.CheckpointCompleted(
                status=oc.event_status(result.status),
                git_commit_sha=sha or recorder.run_tip,
                diff=diff,
            ),
            node_id=node.id,
            node_label=node.label,
        )

    def _forget_unrecorded_stage(self, scope: Scope) -> None:
        """The stage's checkpoint never reached git: put the walk back to the last one
        that did, so the failure snapshot, and the resume after it, hold the stage once
        (as the one to run again), not as done and then again as done."""
        try:
            durable = self.recorder.durable_checkpoint() if self.recorder else None
        except FabroError:
            durable = None  # git cannot even read it back; the failure says why
        if durable is None:
            return
        cp = self.cp
        cp.current_node = durable.current_node
        cp.completed_nodes[:] = durable.completed_nodes
        for name in (
            "node_visits",
            "node_retries",
            "node_outcomes",
            "loop_failure_signatures",
            "restart_failure_signatures",
        ):
            mine = getattr(cp, name)  # the scope holds these very objects: change in place
            mine.clear()
            mine.update(getattr(durable, name))
        current = scope.context.get("current_node")
        for key in list(scope.context):
            scope.context.remove(key)
        scope.context.update(durable.context_values)
        if current is not None:
            scope.context.set("current_node", current)


_WALK_NAMES = {"main": "the run", "branch": "its parallel branch", "child": "its child workflow"}

NO_WORKTREE_CHANGES = frozenset({"start", "exit", "conditional", "human", "wait"})

# Stages whose files_touched come from their tree diff (an agent's come from its tools):
# commands, a fan-in or a fan-out that merges (the chosen branch's files) and a manager
# loop (its child's).
TRACKS_TREE = frozenset({"command", "tool", "parallel", "parallel.fan_in", "stack.manager_loop"})
# Seconds a model stage (prompt or agent) may run when its node sets no `timeout`: a
# provider that keeps a stream alive without finishing cannot hold the run for ever.
DEFAULT_LLM_STAGE_TIMEOUT = 30 * 60.0


def stage_timeout(node: Node) -> float | None:
    """The node's `timeout` in seconds; for a model stage without one, the default."""
    from fabro_git.engine.model_choice import LLM_TYPES

    timeout = node.get_duration("timeout", None)
    if timeout is None and node.handler_type in LLM_TYPES:
        return DEFAULT_LLM_STAGE_TIMEOUT
    return timeout


# Stages that run commands in the worktree: their test assets are captured.
RUNS_COMMANDS = frozenset({"command", "tool", "agent", "codergen"})
# Paths listed at most in one stage's files_touched.
FILES_TOUCHED_LIMIT = 1000


def walk_finished(cp: Checkpoint, graph: Graph) -> bool:
    """True when the checkpoint was taken after the walk's last stage: the walk is over.

    That checkpoint (after the exit, or after a stage with no edge to take) has no next
    node, which otherwise means "not started yet"; a run killed between it and the
    `finalize` snapshot must not start over from start. A failed walk's checkpoint names
    its last stage as next, so it never looks finished.
    """
    last = cp.current_node
    return cp.next_node_id is None and last is not None and last in graph.nodes


# A dry run simulates every agent, so no agent ever sets the context key a loop waits
# for: without a bound, a dry run of a fix-and-verify loop would go round forever.
DRY_RUN_VISIT_LIMIT = 10


class VisitLimit(NamedTuple):
    most: int  # 0: no limit
    source: str
    # The dry-run bound holds across loop restarts, which reset visit counts: it exists
    # so that a dry run always ends.
    across_restarts: bool = False


def visit_limit(node: Node, graph: Graph, *, dry_run: bool) -> VisitLimit:
    """How many times `node` may run in one walk, and where that number comes from.

    The node's `max_visits` wins, then the graph's `max_node_visits` (0 turns the limit
    off); with neither, a dry run stops at DRY_RUN_VISIT_LIMIT and a real run never does.
    """
    own = node.get_int("max_visits", 0)
    if own > 0:
        return VisitLimit(own, f"max_visits={own} on the node")
    graph_limit = graph.get_int("max_node_visits", -1)
    if graph_limit >= 0:
        return VisitLimit(graph_limit, f"max_node_visits={graph_limit} on the graph")
    if dry_run:
        source = f"{DRY_RUN_VISIT_LIMIT} in a dry run; max_node_visits or max_visits changes it"
        return VisitLimit(DRY_RUN_VISIT_LIMIT, source, across_restarts=True)
    return VisitLimit(0, "none")


def _event_response(result: Outcome) -> str | None:
    """The response `stage.completed` carries: a large one is there already as its
    offloaded context value (`response.<node>`), and the event names it by its
    `file://` pointer rather than holding the text once more."""
    from fabro_git.outputs.artifacts import OFFLOAD_THRESHOLD, pointer_name

    response = result.response
    if response is None:
        return response
    for key, value in result.context_updates.items():
        if key.startswith("response.") and pointer_name(value) is not None:
            return str(value)
    if len(response) <= OFFLOAD_THRESHOLD:
        return response
    left = len(response) - OFFLOAD_THRESHOLD
    return f"{response[:OFFLOAD_THRESHOLD]}\n[... {left} more characters, in response.md]"


def _same_failure(qid: str, result: Outcome, count: int, limit: int) -> str:
    """Why a loop stopped, in the words of the failure itself: the signature that
    counted the repeats is the engine's bookkeeping, not something to show."""
    # The headline of the error: `command exited with status 1`, not the output after it.
    why = (result.error or "no reason given").strip().splitlines()[0].split(": ", 1)[0]
    if len(why) > 200:
        why = why[:199] + "…"
    return (
        f"stage {qid} failed the same way {count} times ({why}); stopping, as another "
        f"try would fail again (the graph's loop_restart_signature_limit is {limit})"
    )
