"""The run loop: walk the graph one stage at a time and record every stage.

A *scope* (`engine.scope`) is one walk over a graph with its own context and worktree:
the run itself, a parallel branch, or a sub-workflow. All three go through the one
`walk`: the same entry rules (visit limits), `execute_stage` (attempts and retries,
events, context keys), routing (`engine.routing`: edge selection, failure routing,
circuit breakers), goal gates and final status. Only what is recorded after each stage
differs, and the scope's recording (`engine.recording`) does it: the main scope
checkpoints to the meta ref and the run branch, a branch commits on its own ref, a
child leaves it to its parent's stage.

The runtime is what a stage may reach (`stage.StageServices`); what the run keeps
between checkpoints, and its door to git, is its ledger (`engine.ledger`).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgspec
import trio

from fabro_git.engine import attempt, walk_hooks
from fabro_git.engine.checkpoint import Checkpoint, Manifest, now_iso
from fabro_git.engine.context import Context, plain_object
from fabro_git.engine.emit import Emit
from fabro_git.engine.failures import failure_signature, is_tracked
from fabro_git.engine.ledger import OUTPUT_DIR, Ledger, PendingFile, both
from fabro_git.engine.lifecycle import LifecycleHooks
from fabro_git.engine.options import Options
from fabro_git.engine.outcome import (
    DETERMINISTIC,
    FAILED,
    PARTIAL,
    RETRY,
    SKIPPED,
    STRUCTURAL,
    SUCCEEDED,
    TRANSIENT,
    Outcome,
    StageRecord,
    event_failure_class,
    event_status,
)
from fabro_git.engine.recorder import Recorder
from fabro_git.engine.recording import FILES_TOUCHED_LIMIT, NO_WORKTREE_CHANGES, MainRecording
from fabro_git.engine.repo_guard import RepoGuard
from fabro_git.engine.retry import RetryPolicy, policy_for
from fabro_git.engine.routing import Router
from fabro_git.engine.scope import (
    ChildResult,
    Decision,
    FinishedStage,
    RunFailed,
    Scope,
    SpendingCapReached,
    Supervision,
    WalkEnd,
    final_status,
)
from fabro_git.engine.stage import Handler, StageRequest
from fabro_git.engine.walk_rules import (
    DEFAULT_LLM_STAGE_TIMEOUT,
    check_goal_gates,
    stage_timeout,
    visit_limit,
    walk_finished,
)
from fabro_git.events.catalogue import (
    StageCompleted,
    StageFailed,
    StageRetrying,
    StageStarted,
    StageUsage,
)
from fabro_git.events.envelope import Actor, EventProps
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as runrefs
from fabro_git.workflow import Graph, Node

if TYPE_CHECKING:
    from fabro_git.engine.interviewer import Interviewer
    from fabro_git.store.repo import GitRepo

# Names that callers import from here.
__all__ = [
    "DEFAULT_LLM_STAGE_TIMEOUT",
    "FILES_TOUCHED_LIMIT",
    "NO_WORKTREE_CHANGES",
    "ChildResult",
    "Decision",
    "Options",
    "RunFailed",
    "Runtime",
    "Scope",
    "SpendingCapReached",
    "Supervision",
    "WalkEnd",
    "final_status",
    "now_iso",
    "stage_timeout",
    "walk_finished",
]

T = TypeVar("T")

# Stages whose files_touched come from their tree diff (an agent's come from its tools):
# commands, a fan-in or a fan-out that merges (the chosen branch's files) and a manager
# loop (its child's).
TRACKS_TREE = frozenset({"command", "tool", "parallel", "parallel.fan_in", "stack.manager_loop"})


class StageRun(msgspec.Struct, kw_only=True):
    """One stage as `execute_stage` runs it: its names, its place, its retry budget."""

    node: Node
    visit: int
    stage_id: str
    qid: str
    index: int
    node_dir: str
    stage_dir: Path
    handler: Handler | None
    policy: RetryPolicy
    # Attempts cut off by a crash: numbered on from, but not taken from the budget.
    earlier: int
    started: float
    started_at: str

    @property
    def max_attempts(self) -> int:
        return self.policy.max_attempts + self.earlier


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
        recorder: Recorder,
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
        self.ledger = Ledger(
            run_id=run_id,
            repo=repo,
            recorder=recorder,
            checkpoint=checkpoint,
            hooks=self.hooks,
            emit=self.emit,
            scratch=scratch,
        )
        self.rng = random.Random()
        self.router = Router(self.emit, self.rng)
        self.emitted = 0
        # Agent stages in flight that take steering text (`git fabro steer`).
        self.steer_targets: list[Callable[[str], None]] = []
        # What a stage may not change in the user's repository (see `repo_guard`).
        self.repo_guard = RepoGuard(self.ledger)

    # -- what the session reads and sets ---------------------------------------------

    @property
    def cp(self) -> Checkpoint:
        return self.ledger.checkpoint

    @property
    def pending_files(self) -> dict[str, PendingFile]:
        return self.ledger.pending_files

    @pending_files.setter
    def pending_files(self, files: dict[str, PendingFile]) -> None:
        self.ledger.pending_files = files

    @property
    def resumed_attempts(self) -> dict[str, int]:
        return self.ledger.resumed_attempts

    @resumed_attempts.setter
    def resumed_attempts(self, attempts: dict[str, int]) -> None:
        self.ledger.resumed_attempts = attempts

    @property
    def activity(self) -> int:
        """Signs of life for the stall watchdog: events emitted and git calls done."""
        return self.emitted + self.ledger.calls_done

    @property
    def store_busy(self) -> int:
        return self.ledger.calls_busy

    def active_ms(self) -> int:
        return self.ledger.active_ms()

    async def store_call(self, fn: Callable[..., T], *args: object) -> T:
        return await self.ledger.call(fn, *args)

    def steer(self, text: str) -> bool:
        """Hand `text` to every agent stage in flight; False when none is listening."""
        for target in list(self.steer_targets):
            target(text)
        return bool(self.steer_targets)

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
        actor: Actor | None = None,
    ) -> None:
        """Emit an event's properties Struct, with the envelope's stage and
        agent-session fields."""
        self.emitted += 1
        self.emit_event(
            event,
            node_id=node_id,
            node_label=node_label,
            stage_id=stage_id,
            session_id=session_id,
            parent_session_id=parent_session_id,
            actor=actor,
        )

    # -- the main walk -----------------------------------------------------------------

    def main_scope(self) -> Scope:
        cp = self.cp
        return Scope(
            recording=MainRecording(self.ledger, max_cost=self.options.max_cost),
            graph=self.graph,
            context=Context(cp.context_values),
            worktree=self.worktree,
            visits=cp.node_visits,
            outcomes=cp.node_outcomes,
            completed=cp.completed_nodes,
            loop_signatures=cp.loop_failure_signatures,
            restart_signatures=cp.restart_failure_signatures,
            ref=self.recorder.run_ref,
            tip=self.recorder.run_tip,
            output_dir=self.scratch / OUTPUT_DIR,
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
                gates = check_goal_gates(scope, self.emit)
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
            decision = await self._decide(scope, node, result)
            stage = FinishedStage(node, visit, stage_id, result)
            await scope.recording.record(
                scope, stage, decision, then=self._look_ahead(scope, decision)
            )
            if decision.error is not None:
                raise RunFailed(decision.error)
            if decision.next_node is None:
                return WalkEnd(final_status(scope))
            node_id = decision.next_node

    def _look_ahead(self, scope: Scope, decision: Decision) -> Callable[[], None] | None:
        """Blocking work for the checkpoint's trip: the look before the next stage, its
        asset baseline too when it runs commands (`RepoGuard.look_ahead`)."""
        node = scope.graph.nodes.get(decision.next_node or "")
        if node is None or decision.error is not None:
            return None
        work = None
        if node.handler_type in attempt.RUNS_COMMANDS:
            include = attempt.asset_include(self.manifest.run_config)
            work = functools.partial(attempt.AssetWatch.snapshot, scope.worktree, include)
        return functools.partial(self.repo_guard.look_ahead, scope.qualified(node.id), work)

    async def _decide(self, scope: Scope, node: Node, result: Outcome) -> Decision:
        """Where the walk goes after the stage: its end hooks, routing, the goal gates
        where it would end, the edge hooks."""
        stopped = await walk_hooks.stage_end(self.hooks, scope, node, result)
        if stopped is not None:
            return stopped
        if node.handler_type == "exit":
            return Decision(None)
        decision = self.router.route(scope, node, result)
        if decision.ends_walk:
            # A stage with no edge to take ends the walk as the exit would, goal gates
            # included: routing around the exit must not skip them.
            return check_goal_gates(scope, self.emit)
        if decision.next_node is not None and decision.edge is not None:
            return await walk_hooks.edge_selected(self.hooks, self.emit, scope, decision)
        return decision

    def _node(self, scope: Scope, node_id: str) -> Node:
        node = scope.graph.nodes.get(node_id)
        if node is None:
            where = scope.recording.workflow_name
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

    # -- one stage -----------------------------------------------------------------------

    def _emit_stage(self, run: StageRun, event: EventProps) -> None:
        """Emit one of the stage's own events, stamped with it."""
        self.emit(event, node_id=run.qid, node_label=run.node.label, stage_id=run.stage_id)

    async def execute_stage(self, scope: Scope, node: Node, visit: int, stage_id: str) -> Outcome:
        """Run the stage: its attempts, then its record, then `stage.completed`."""
        run = self._open_stage(scope, node, visit, stage_id)
        result, attempts, files = await self._attempts(scope, run)
        if node.get_bool("auto_status", False) and result.status not in (SUCCEEDED, SKIPPED):
            result.notes = (
                result.notes + "; " if result.notes else ""
            ) + f"auto_status: was {result.status}"
            result.status = SUCCEEDED
        signature = self._failed(run, result)
        duration_ms = int((time.monotonic() - run.started) * 1000)
        if node.handler_type in TRACKS_TREE and not result.files_touched:
            result.files_touched = await scope.recording.files_touched(scope, stage_id)
        updates = await self._offload(scope, result, run.node_dir, files)
        self._apply(scope, node, result, signature, updates)
        record = result.to_record(
            node_id=run.qid,
            visit=visit,
            attempt=attempts,
            started_at=run.started_at,
            duration_ms=duration_ms,
            failure_signature=signature,
        )
        self._keep(scope, run, record, files)
        self._count_usage(result)
        self._emit_stage(run, self._completed(scope, run, result, record))
        return result

    def _open_stage(self, scope: Scope, node: Node, visit: int, stage_id: str) -> StageRun:
        qid = scope.qualified(node.id)
        self.cp.stage_index += 1
        node_dir = qid.replace("/", f"/{runrefs.NODES_DIR}/") if scope.prefix else node.id
        node_dir = runrefs.node_dir_name(node_dir, visit)
        stage_dir = self.scratch / "nodes" / node_dir  # made if the handler asks for it
        scope.context.set("current_node", node.id)
        scope.context.set("internal.node_visit_count", visit)
        return StageRun(
            node=node,
            visit=visit,
            stage_id=stage_id,
            qid=qid,
            index=self.cp.stage_index,
            node_dir=node_dir,
            stage_dir=stage_dir,
            handler=self.handlers(node.handler_type),
            policy=policy_for(node, scope.graph),
            earlier=self.ledger.resumed_attempts.pop(stage_id, 0),
            started=time.monotonic(),
            started_at=now_iso(),
        )

    async def _attempts(
        self, scope: Scope, run: StageRun
    ) -> tuple[Outcome, int, dict[str, bytes | Path]]:
        """The attempt loop: run the stage until it ends or its retries do. The outcome,
        the attempt it ended on (numbered on from a crash's), the stage's files."""
        node = run.node
        attempt = 1
        while True:
            # A checkpoint per attempt, so Ctrl-C and the watchdog get through even when
            # every handler on the path finishes without awaiting anything.
            await trio.lowlevel.checkpoint()
            scope.context.set(f"internal.retry_count.{node.id}", attempt - 1)
            number = run.earlier + attempt
            self._emit_stage(
                run,
                StageStarted(
                    index=run.index,
                    handler_type=node.handler_type,
                    attempt=number,
                    max_attempts=run.max_attempts,
                ),
            )
            request = StageRequest(
                _services=self,
                _scope=scope,
                graph=scope.graph,
                node=node,
                context=scope.context,
                visit=run.visit,
                attempt=number,
                stage_id=run.stage_id,
                worktree=scope.worktree,
                node_dir=run.node_dir,
                _stage_dir=run.stage_dir,
            )
            result = await self._attempt(scope, run, request)
            retryable = result.status == RETRY or (
                result.status == FAILED and result.failure_class == TRANSIENT
            )
            if not (retryable and await self._retrying(run, result, attempt)):
                return self._exhausted(node, result, retryable), number, request.files
            delay = run.policy.delay_for(attempt, self.rng)
            self.cp.node_retries[run.qid] = self.cp.node_retries.get(run.qid, 0) + 1
            attempt += 1
            self._emit_stage(
                run,
                StageRetrying(
                    index=run.index,
                    attempt=run.earlier + attempt,
                    max_attempts=run.max_attempts,
                    delay_ms=int(delay * 1000),
                ),
            )
            await trio.sleep(delay)

    async def _attempt(self, scope: Scope, run: StageRun, request: StageRequest) -> Outcome:
        """One attempt: the `stage_start` hooks, then the handler, guarded."""
        node = run.node
        if self.hooks.wants("stage_start"):
            hooked = await walk_hooks.stage_start(
                self.hooks, node, run.qid, request.attempt, run.max_attempts
            )
            if hooked is not None:
                return hooked
        if run.handler is None:
            return Outcome.failure(f"no handler for node type {node.handler_type!r}", STRUCTURAL)
        assets = attempt.AssetWatch.of(request, attempt.asset_include(self.manifest.run_config))
        call = functools.partial(
            attempt.call_handler, run.handler, request, scope, in_place=self.options.in_place
        )
        # The stage's tree is taken on the guard's trip after it, with the assets.
        tree = (
            scope.recording.tree_after_stage(scope, run.stage_id)
            if node.handler_type in TRACKS_TREE
            else None
        )
        # The look before it, taken at the last checkpoint when nothing came between.
        ahead = self.repo_guard.ahead_of(run.qid)
        if assets is None:
            return await self.repo_guard.around(request, call, after=tree, ahead=ahead)
        if ahead is not None and assets.use(ahead.taken):
            result = await self.repo_guard.around(
                request, call, after=both(assets.capture, tree), ahead=ahead
            )
        else:
            result = await self.repo_guard.around(
                request, call, before=assets.baseline, after=both(assets.capture, tree)
            )
        await assets.keep(scratch=self.scratch, pending_files=self.ledger.pending_files)
        return result

    async def _retrying(self, run: StageRun, result: Outcome, attempt: int) -> bool:
        """Whether a retryable attempt is retried (budget left, no hook blocks it); if
        so, its failure is announced as one that will be retried."""
        if attempt >= run.policy.max_attempts or not await walk_hooks.retry_allowed(
            self.hooks, run.node, run.qid, result, run.earlier + attempt + 1, run.max_attempts
        ):
            return False
        self._emit_stage(
            run,
            StageFailed(
                index=run.index,
                error=result.error or "retry requested",
                failure_class=event_failure_class(result.failure_class or TRANSIENT),
                failure_signature=failure_signature(run.qid, result.failure_class, result.error),
                will_retry=True,
            ),
        )
        # A tree taken during or after the attempt (an agent CLI's, the guard's) is not
        # the stage's.
        self.ledger.stage_trees.pop(run.stage_id, None)
        self.ledger.stage_files.pop(run.stage_id, None)
        self.ledger.scan_hooks.pop(run.stage_id, None)
        return True

    @staticmethod
    def _exhausted(node: Node, result: Outcome, retryable: bool) -> Outcome:
        """The last attempt's outcome as the stage's: a retry asked for with no attempt
        left fails (or partially succeeds, where the node allows it)."""
        allow_partial = node.get_bool("allow_partial", False)
        if result.status == RETRY:
            result.status = PARTIAL if allow_partial else FAILED
            if result.status == FAILED and not result.error:
                result.error = "retries exhausted"
        elif result.status == FAILED and retryable and allow_partial:
            result.status = PARTIAL
        return result

    def _failed(self, run: StageRun, result: Outcome) -> str | None:
        """A failed stage's signature, announced with `stage.failed`. A conditional node
        carries the previous stage's outcome through for its edge conditions: that is
        routing data, not a failure of its own."""
        if result.status != FAILED or run.node.handler_type == "conditional":
            return None
        result.failure_class = result.failure_class or DETERMINISTIC
        signature = failure_signature(run.qid, result.failure_class, result.error)
        self._emit_stage(
            run,
            StageFailed(
                index=run.index,
                error=result.error or "stage failed",
                failure_class=event_failure_class(result.failure_class),
                failure_signature=signature,
                will_retry=False,
            ),
        )
        return signature

    def _keep(
        self, scope: Scope, run: StageRun, record: StageRecord, files: Mapping[str, bytes | Path]
    ) -> None:
        """The stage's record in its walk, and its files for the next checkpoint."""
        node_id = run.node.id
        scope.outcomes[node_id] = record
        scope.completed.append(node_id)
        scope.steps += 1
        pending = self.ledger.pending_files
        directory = runrefs.node_dir(run.node_dir)
        pending[f"{directory}/{runrefs.NODE_STATUS}"] = (
            msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n"
        )
        for name, data in files.items():
            pending[f"{directory}/{name}"] = data

    def _count_usage(self, result: Outcome) -> None:
        if result.usage is not None:
            self.cp.total_cost += result.usage.cost or 0.0
            self.cp.tokens.add(result.usage)

    def _completed(
        self, scope: Scope, run: StageRun, result: Outcome, record: StageRecord
    ) -> StageCompleted:
        usage = None
        if result.usage is not None:
            usage = StageUsage(
                **{k: v for k, v in msgspec.structs.asdict(result.usage).items() if v is not None}
            )
        return StageCompleted(
            index=run.index,
            duration_ms=record.get("duration_ms", 0),
            status=event_status(result.status),
            preferred_label=result.preferred_label,
            suggested_next_ids=list(result.suggested_next_ids),
            usage=usage,
            error=result.error,
            failure_class=event_failure_class(result.failure_class)
            if result.status == FAILED and result.failure_class
            else None,
            failure_signature=record.get("failure_signature"),
            context_updates=plain_object(result.context_updates) or None,
            jump_to_node=result.jump_to_node,
            node_visits=dict(scope.visits),
            loop_failure_signatures=dict(scope.loop_signatures) or None,
            restart_failure_signatures=dict(scope.restart_signatures) or None,
            response=attempt.event_response(result),
            notes=result.notes,
            files_touched=list(result.files_touched),
            attempt=record.get("attempt", run.earlier + 1),
            max_attempts=run.max_attempts,
        )

    async def _offload(
        self, scope: Scope, result: Outcome, node_dir: str, files: Mapping[str, bytes | Path]
    ) -> JsonObject:
        """Offload the stage's large context values; the next checkpoint records them.
        The record keeps pointers to the visit's own files; returns the updates as the
        context takes them (pointers to each key's current file). The values are
        written on a worker thread, and meanwhile they and the stage's files are
        scanned for secrets and stored as blobs for the checkpoint."""
        ledger = self.ledger
        artifacts = ledger.artifacts
        offloaded = artifacts.plan_stage(
            result.context_updates, runrefs.node_slug(node_dir), tag=scope.branch_tag
        )
        if offloaded.pending:
            recorder = self.recorder
            stage_files = [data for data in files.values() if isinstance(data, bytes)]

            def meanwhile(values: list[tuple[object, bytes]]) -> None:
                recorder.premask(values, stage_files)

            await ledger.call(artifacts.write_stage, offloaded, meanwhile)
        result.context_updates = offloaded.record
        for name, data in offloaded.written.items():
            # A long reply's text file is one blob with its response.md (see artifacts).
            ledger.pending_files[runrefs.artifact_path(name, text=isinstance(data, Path))] = data
        return offloaded.context

    def _apply(
        self,
        scope: Scope,
        node: Node,
        result: Outcome,
        signature: str | None,
        updates: JsonObject,
    ) -> None:
        context = scope.context
        context.update(updates)
        context.set("outcome", result.status)
        if result.preferred_label:
            context.set("preferred_label", result.preferred_label)
        else:
            context.remove("preferred_label")
        if result.status == FAILED:
            context.set("failure_class", result.failure_class)
            context.set("failure_signature", signature)
        else:
            context.remove("failure_class")
            context.remove("failure_signature")
        if signature and is_tracked(result.failure_class):
            scope.loop_signatures[signature] = scope.loop_signatures.get(signature, 0) + 1
