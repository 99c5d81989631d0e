"""The run loop: walk the graph one stage at a time and checkpoint after every stage.

A *scope* is one walk over a graph with its own context and worktree: the run itself,
a parallel branch (own worktree and ref, stops at the fan-in), or a sub-workflow (runs
inside its parent's stage). All three share `execute_stage` (retries, events, context
keys) and `route` (edge selection, failure routing, circuit breakers); only the main
scope writes checkpoints to the meta ref.
"""

from __future__ import annotations

import contextlib
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import trio

from fabro_git.engine import outcome as oc
from fabro_git.engine.checkpoint import Checkpoint, Manifest
from fabro_git.engine.context import Context
from fabro_git.engine.edges import select_edge
from fabro_git.engine.failures import failure_signature, is_tracked, may_cross_loop_restart
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.recorder import Recorder
from fabro_git.engine.retry import policy_for
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import FabroError
from fabro_git.workflow import Graph, Node


def now_iso() -> str:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class RunFailed(Exception):
    """Ends the walk: the run cannot go on (visit limit, circuit breaker, no route...)."""


@dataclass
class Options:
    auto_approve: bool = False
    answers: list[str] = field(default_factory=list)
    dry_run: bool = False
    in_place: bool = False
    model: str | None = None
    provider: str | None = None
    interactive: bool = False


@dataclass
class Scope:
    kind: str  # "main", "branch" or "child"
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

    def qualified(self, node_id: str) -> str:
        return f"{self.prefix}{node_id}"


@dataclass
class Decision:
    next_node: str | None
    error: str | None = None


class Runtime:
    """Run-wide services shared by every scope and handler."""

    def __init__(
        self,
        *,
        run_id: str,
        repo: Any,
        graph: Graph,
        manifest: Manifest,
        checkpoint: Checkpoint,
        emit_event: Callable[..., Any],
        recorder: Recorder | None,
        scratch: Path,
        worktree: Path,
        interviewer: Any,
        options: Options,
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
        self.rng = random.Random()
        self.pending_files: dict[str, bytes | None] = {}
        # Heads merged into the next run-branch commit (the fan-in's chosen branch).
        self.merge_parents: list[str] = []
        self._tree_cache: dict[str, str] = {}
        self.last_activity = time.monotonic()
        self.run_started = time.monotonic()
        self.active_base_ms = checkpoint.active_ms

    # -- events ------------------------------------------------------------------------

    def emit(self, event: str, /, **kw: Any) -> None:
        self.last_activity = time.monotonic()
        self.emit_event(event, **kw)

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
        graph = self.graph
        start = graph.start_node()
        assert start is not None  # validation refused graphs without one
        if self.cp.next_node_id is None and walk_finished(self.cp, graph):
            # Resumed after the exit node's checkpoint: only the finish is left.
            return self._final_status(scope)
        node_id = self.cp.next_node_id or start.id
        while True:
            node = self._node(graph, node_id)
            if node.handler_type == "exit":
                gate = self._unsatisfied_goal_gate(scope)
                if gate is not None:
                    target = self._goal_gate_target(graph, gate)
                    if target is None:
                        raise RunFailed(f"goal gate unsatisfied for node {gate.id} and no retry target")
                    self.emit(
                        "run.notice",
                        level="warn",
                        code="goal_gate_retry",
                        message=f"goal gate {gate.id} is not satisfied; retrying from {target}",
                    )
                    node_id = target
                    continue
            visit = self._enter(scope, node)
            result = await self.execute_stage(scope, node, visit)
            if node.handler_type == "exit":
                self._checkpoint(scope, node, visit, result, next_node=None)
                return self._final_status(scope)
            decision = self.route(scope, node, result)
            self._checkpoint(scope, node, visit, result, next_node=decision.next_node)
            if decision.error is not None:
                raise RunFailed(decision.error)
            assert decision.next_node is not None
            node_id = decision.next_node

    def _node(self, graph: Graph, node_id: str) -> Node:
        node = graph.nodes.get(node_id)
        if node is None:
            raise RunFailed(f"the workflow has no node {node_id!r}")
        return node

    def _enter(self, scope: Scope, node: Node) -> int:
        visit = scope.visits.get(node.id, 0) + 1
        limit = node.get_int("max_visits", 0) or scope.graph.get_int("max_node_visits", 0)
        if limit and visit > limit:
            raise RunFailed(
                f"node {scope.qualified(node.id)} would run a {_ordinal(visit)} time, over its limit of {limit}"
                " (max_visits / max_node_visits)"
            )
        scope.visits[node.id] = visit
        return visit

    def _final_status(self, scope: Scope) -> str:
        statuses = {rec.get("status") for rec in scope.outcomes.values()}
        return oc.PARTIAL if oc.PARTIAL in statuses else oc.SUCCEEDED

    def _unsatisfied_goal_gate(self, scope: Scope) -> Node | None:
        for node_id, record in scope.outcomes.items():
            node = scope.graph.nodes.get(node_id)
            if node is not None and node.get_bool("goal_gate", False) and record.get("status") not in (oc.SUCCEEDED, oc.PARTIAL):
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

    async def execute_stage(self, scope: Scope, node: Node, visit: int) -> Outcome:
        from fabro_git.handlers import handler_for

        graph = scope.graph
        qid = scope.qualified(node.id)
        label = node.label
        stage_id = f"{qid}@{visit}"
        handler = handler_for(node.handler_type)
        policy = policy_for(node, graph)
        self.cp.stage_index += 1
        index = self.cp.stage_index
        node_dir = qid.replace("/", "/nodes/") if scope.prefix else node.id
        node_dir = node_dir if visit == 1 else f"{node_dir}-{visit}"
        stage_dir = self.scratch / "nodes" / node_dir
        stage_dir.mkdir(parents=True, exist_ok=True)
        ctx = scope.context
        ctx.set("current_node", node.id)
        ctx.set("internal.node_visit_count", visit)
        started = time.monotonic()
        started_at = now_iso()
        result: Outcome
        attempt = 1
        files: dict[str, bytes] = {}
        while True:
            # A checkpoint per attempt, so Ctrl-C and the watchdog get through even when
            # every handler on the path finishes without awaiting anything.
            await trio.lowlevel.checkpoint()
            ctx.set(f"internal.retry_count.{node.id}", attempt - 1)
            self.emit(
                "stage.started",
                index=index,
                handler_type=node.handler_type,
                attempt=attempt,
                max_attempts=policy.max_attempts,
                node_id=qid,
                node_label=label,
                stage_id=stage_id,
            )
            request = StageRequest(
                runtime=self,
                scope=scope,
                graph=graph,
                node=node,
                context=ctx,
                visit=visit,
                attempt=attempt,
                stage_id=stage_id,
                worktree=scope.worktree,
                stage_dir=stage_dir,
                node_dir=node_dir,
            )
            if handler is None:
                result = Outcome.failure(f"no handler for node type {node.handler_type!r}", oc.STRUCTURAL)
            else:
                result = await self._call_handler(handler, request, node)
            files = request.files
            retryable = result.status == oc.RETRY or (
                result.status == oc.FAILED and result.failure_class == oc.TRANSIENT
            )
            if retryable and attempt < policy.max_attempts:
                self.emit(
                    "stage.failed",
                    index=index,
                    error=result.error or "retry requested",
                    failure_class=result.failure_class or oc.TRANSIENT,
                    failure_signature=failure_signature(qid, result.failure_class, result.error),
                    will_retry=True,
                    node_id=qid,
                    node_label=label,
                    stage_id=stage_id,
                )
                delay = policy.delay_for(attempt, self.rng)
                self.cp.node_retries[qid] = self.cp.node_retries.get(qid, 0) + 1
                attempt += 1
                self.emit(
                    "stage.retrying",
                    index=index,
                    attempt=attempt,
                    max_attempts=policy.max_attempts,
                    delay_ms=int(delay * 1000),
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
            result.notes = (result.notes + "; " if result.notes else "") + f"auto_status: was {result.status}"
            result.status = oc.SUCCEEDED
        signature = None
        # A conditional node carries the previous stage's outcome through for its edge
        # conditions; that is routing data, not a failure of its own.
        passthrough = node.handler_type == "conditional"
        if result.status == oc.FAILED and not passthrough:
            result.failure_class = result.failure_class or oc.DETERMINISTIC
            signature = failure_signature(qid, result.failure_class, result.error)
            self.emit(
                "stage.failed",
                index=index,
                error=result.error or "stage failed",
                failure_class=result.failure_class,
                failure_signature=signature,
                will_retry=False,
                node_id=qid,
                node_label=label,
                stage_id=stage_id,
            )
        duration_ms = int((time.monotonic() - started) * 1000)
        self._apply(scope, node, result, signature)
        record = result.to_record()
        record.update(
            node_id=qid,
            visit=visit,
            attempt=attempt,
            started_at=started_at,
            duration_ms=duration_ms,
        )
        if signature:
            record["failure_signature"] = signature
        scope.outcomes[node.id] = record
        scope.completed.append(node.id)
        scope.steps += 1
        self.pending_files[f"nodes/{node_dir}/status.json"] = msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n"
        for name, data in files.items():
            self.pending_files[f"nodes/{node_dir}/{name}"] = data
        completed_props: dict[str, Any] = dict(
            index=index,
            duration_ms=duration_ms,
            status=result.status,
            preferred_label=result.preferred_label,
            suggested_next_ids=list(result.suggested_next_ids),
            error=result.error,
            failure_class=result.failure_class if result.status == oc.FAILED else None,
            failure_signature=signature,
            context_updates=_jsonable(result.context_updates) or None,
            jump_to_node=result.jump_to_node,
            node_visits=dict(scope.visits),
            response=result.response,
            notes=result.notes,
            files_touched=list(result.files_touched),
            attempt=attempt,
            max_attempts=policy.max_attempts,
        )
        if result.usage is not None:
            completed_props["usage"] = {k: v for k, v in vars(result.usage).items() if v is not None}
        if scope.loop_signatures:
            completed_props["loop_failure_signatures"] = dict(scope.loop_signatures)
        if scope.restart_signatures:
            completed_props["restart_failure_signatures"] = dict(scope.restart_signatures)
        self.emit("stage.completed", node_id=qid, node_label=label, stage_id=stage_id, **completed_props)
        return result

    async def _call_handler(self, handler: Any, request: StageRequest, node: Node) -> Outcome:
        try:
            result: Outcome = await handler(request)
            return result
        except trio.Cancelled:
            raise
        except FabroError as err:
            return Outcome.failure(str(err), oc.DETERMINISTIC)
        except Exception as exc:  # a handler bug must not take the run's state with it
            request.files["handler-error.txt"] = "".join(traceback.format_exception(exc)).encode()
            return Outcome.failure(f"handler error in {node.id}: {type(exc).__name__}: {exc}", oc.DETERMINISTIC)

    def _apply(self, scope: Scope, node: Node, result: Outcome, signature: str | None) -> None:
        ctx = scope.context
        ctx.update(result.context_updates)
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
        if sig and is_tracked(result.failure_class) and limit and scope.loop_signatures.get(sig, 0) >= limit:
            return Decision(
                None,
                f"deterministic failure cycle detected: signature {sig!r} repeated "
                f"{scope.loop_signatures[sig]} times (limit {limit})",
            )
        if result.jump_to_node:
            if result.jump_to_node not in graph.nodes:
                return Decision(None, f"{qid} asked to jump to unknown node {result.jump_to_node!r}")
            self._edge_event(scope, node, result, result.jump_to_node, None, None, "jump", True)
            return Decision(result.jump_to_node)
        selection = select_edge(
            graph,
            node,
            status=result.status,
            preferred_label=result.preferred_label,
            suggested_next_ids=result.suggested_next_ids,
            context=scope.context,
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
            return Decision(
                None,
                f"no outgoing edge of {qid} matches (status {result.status}); "
                "add an unconditional edge or a condition that covers this outcome",
            )
        edge = selection.edge
        if edge.loop_restart:
            if result.status == oc.FAILED and not may_cross_loop_restart(result.failure_class):
                return Decision(
                    None, f"loop_restart blocked: failure_class={result.failure_class} (requires transient_infra)"
                )
            if sig:
                scope.restart_signatures[sig] = scope.restart_signatures.get(sig, 0) + 1
                if limit and scope.restart_signatures[sig] >= limit:
                    return Decision(
                        None,
                        f"loop restart circuit breaker: signature {sig!r} repeated "
                        f"{scope.restart_signatures[sig]} times (limit {limit})",
                    )
            self._edge_event(scope, node, result, edge.target, edge.label, edge.condition, selection.reason, False)
            self.emit("loop.restart", from_node=qid, to_node=scope.qualified(edge.target))
            self._restart(scope)
            return Decision(edge.target)
        self._edge_event(scope, node, result, edge.target, edge.label, edge.condition, selection.reason, False)
        return Decision(edge.target)

    def _restart(self, scope: Scope) -> None:
        """A loop restart starts the walk afresh from the target: visits and context reset."""
        keep = {k: v for k, v in scope.context.items() if k.startswith(("graph.", "internal.run_id", "internal.work_dir"))}
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
        self.emit(
            "edge.selected",
            from_node=scope.qualified(node.id),
            to_node=scope.qualified(target),
            label=label,
            condition=condition,
            reason=reason,
            preferred_label=result.preferred_label,
            suggested_next_ids=list(result.suggested_next_ids),
            stage_status=result.status,
            is_jump=is_jump,
        )

    # -- checkpoints -----------------------------------------------------------------------

    def _tip_tree(self, commit: str) -> str:
        tree = self._tree_cache.get(commit)
        if tree is None:
            tree = self._tree_cache[commit] = self.repo.commit_info(commit).tree
        return tree

    def _checkpoint(self, scope: Scope, node: Node, visit: int, result: Outcome, *, next_node: str | None) -> None:
        cp = self.cp
        cp.current_node = node.id
        cp.next_node_id = next_node
        cp.context_values = _jsonable(scope.context.snapshot())
        cp.timestamp = now_iso()
        cp.active_ms = self.active_ms()
        recorder = self.recorder
        files = self.pending_files
        self.pending_files = {}
        if recorder is None:
            return
        tree: str | None
        if node.handler_type in NO_WORKTREE_CHANGES and not self.merge_parents and recorder.run_tip:
            # These stages run no user code, so the tree cannot have changed: skip the scan.
            tree = self._tip_tree(recorder.run_tip)
        else:
            try:
                tree = recorder.stage_tree(node.id)
            except FabroError as err:
                self._forget_unrecorded_stage(scope)
                raise RunFailed(str(err)) from err
        recorder.plan_commit(cp, node.id, result.status, tree, self.merge_parents)
        self.merge_parents = []
        scope_kw = {"node_id": node.id, "node_label": node.label, "stage_id": f"{node.id}@{visit}"}
        meta_sha = recorder.snapshot("checkpoint", f"checkpoint {node.id}@{visit}", cp, files, scope=scope_kw)
        if meta_sha is None:
            self.pending_files = {**files, **self.pending_files}
            cp.pending_commit = None
            self._forget_unrecorded_stage(scope)
            # Going on would pile stages onto a record git does not hold (and end with a
            # success nothing backs); stop, so resume redoes this stage from the last
            # checkpoint git does hold.
            raise RunFailed(f"the checkpoint after {node.id} could not be written to git (see the error above)")
        before = recorder.run_tip
        sha = recorder.commit_pending(cp, node_label=node.label)
        if sha is None and cp.pending_commit is not None:
            raise RunFailed(f"the run-branch commit for {node.id} could not be made (see the error above)")
        if sha is not None and tree is not None:
            self._tree_cache[sha] = tree
        scope.tip = recorder.run_tip
        diff = None
        if sha is not None and before is not None and tree is not None and tree != self._tip_tree(before):
            from fabro_git.store import worktree as wt

            with contextlib.suppress(FabroError):
                diff = self.repo.small_tree_diff(self._tip_tree(before), tree, max_bytes=20_000)
                if diff is None:
                    diff = wt.diff_text(self.worktree, before, sha, max_bytes=20_000)
                diff = diff or None
        self.emit(
            "checkpoint.completed",
            status=result.status,
            git_commit_sha=sha or recorder.run_tip,
            diff=diff,
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


NO_WORKTREE_CHANGES = frozenset({"start", "exit", "conditional", "human", "wait"})


def walk_finished(cp: Checkpoint, graph: Graph) -> bool:
    """True when the checkpoint was taken after an exit node: the walk is over.

    The exit checkpoint has no next node, which otherwise means "not started yet"; a
    run killed between it and the `finalize` snapshot must not start over from start.
    """
    last = graph.nodes.get(cp.current_node) if cp.current_node else None
    return cp.next_node_id is None and last is not None and last.handler_type == "exit"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _jsonable(value: Any) -> Any:
    """Context values as plain JSON data (anything else becomes its string form)."""
    result: Any = msgspec.json.decode(msgspec.json.encode(value, enc_hook=str))
    return result
