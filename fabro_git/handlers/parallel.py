"""Fan-out and fan-in.

Each branch of a `component` node walks the graph from one outgoing edge until it
reaches a fan-in (`tripleoctagon`) or the exit. A branch has a deep copy of the context,
its own worktree (detached at the run branch's tip) and its own ref under
`refs/fabro/parallel/<run>/<node>-<visit>/<n>`, where every branch stage is committed.
Branches run in a trio nursery under a `CapacityLimiter` of `max_parallel`.

The fan-in picks the best branch (status first, then the branch's order) and moves the
run branch to that branch's head: a fast-forward, since every branch starts at the tip.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from fabro_git.engine import outcome as oc
from fabro_git.engine.context import Context, context_delta
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.runner import RunFailed, Scope
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import DiskFull, FabroError, WorkflowError

RANK = {oc.SUCCEEDED: 0, oc.PARTIAL: 1, oc.SKIPPED: 2, oc.FAILED: 3}


@dataclass
class BranchResult:
    index: int
    id: str
    status: str
    head_sha: str | None
    context_updates: dict[str, Any]
    join: str | None
    error: str | None = None

    def record(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "index": self.index,
            "status": self.status,
            "head_sha": self.head_sha,
            "context_updates": self.context_updates,
        }
        if self.error:
            data["error"] = self.error
        return data


async def _walk_branch(req: StageRequest, scope: Scope, start: str) -> tuple[str, str | None, str | None]:
    """Run stages from `start` until a fan-in or exit. Returns (status, join node, error)."""
    runtime = req.runtime
    graph = scope.graph
    node_id: str | None = start
    status = oc.SUCCEEDED
    while node_id is not None:
        node = graph.nodes.get(node_id)
        if node is None:
            return oc.FAILED, None, f"branch reached unknown node {node_id!r}"
        if node.handler_type in ("parallel.fan_in", "exit"):
            return status, node_id, None
        visit = runtime._enter(scope, node)
        result = await runtime.execute_stage(scope, node, visit)
        status = result.status
        unrecorded = _commit_branch_stage(req, scope, node.id, result.status)
        if unrecorded is not None:
            return oc.FAILED, None, unrecorded
        decision = runtime.route(scope, node, result)
        if decision.error is not None:
            return oc.FAILED, None, decision.error
        node_id = decision.next_node
    return status, None, None


def _commit_branch_stage(req: StageRequest, scope: Scope, node_id: str, status: str) -> str | None:
    """Commit the branch stage's worktree on the branch's ref; the error when git could
    not, which fails the branch (its work must not go missing from the fan-in)."""
    from fabro_git.store import runs as runrefs
    from fabro_git.store import worktree as wt

    runtime = req.runtime
    if runtime.recorder is None or scope.ref is None or scope.tip is None:
        return None
    try:
        tree = wt.snapshot_tree(scope.worktree, exclude_globs=runtime.recorder.exclude_globs)
        message = runtime.recorder.redactor.mask_text(
            runrefs.branch_commit_message(runtime.run_id, node_id, status, scope.prefix.rstrip("/") or node_id)
        )
        sha = runtime.repo.write_commit(tree=tree, parents=[scope.tip], message=message)
        runtime.repo.update_ref(scope.ref, sha, old=scope.tip, message=f"fabro: branch stage {node_id}")
    except DiskFull:
        raise  # the whole run stops at its last checkpoint, not just this branch
    except FabroError as err:
        error = f"could not record the files of {node_id}: {err}"
        runtime.emit("checkpoint.failed", error=error, node_id=node_id)
        return error
    scope.tip = sha
    runtime.emit("git.commit", sha=sha, node_id=node_id)
    return None


def _fresh_refs_name(runtime: Any, node_id: str, visit: int) -> str:
    """The ref directory for this run of a fan-out: `<node>-<visit>`, or, when a retry or
    a resume runs the same visit again, `<node>-<visit>.<n>`. Branch refs are only ever
    created, never moved back, so a run's refs that were pushed stay fast-forwards."""
    from fabro_git.store import runs as runrefs

    name, n = f"{node_id}-{visit}", 1
    while runtime.repo.list_refs(f"{runrefs.PARALLEL_PREFIX}{runtime.run_id}/{name}"):
        n += 1
        name = f"{node_id}-{visit}.{n}"
    return name


async def fan_out(req: StageRequest) -> Outcome:
    from fabro_git.store import runs as runrefs
    from fabro_git.store import worktree as wt

    runtime = req.runtime
    node = req.node
    graph = req.graph
    edges = graph.outgoing(node.id)
    if not edges:
        raise WorkflowError(
            f"parallel node {node.id!r} has no outgoing edges to fan out to",
            path=graph.path,
            line=node.line,
            column=node.column,
        )
    policy = (node.get("join_policy") or "wait_all").strip().lower()
    if policy not in ("wait_all", "first_success"):
        raise WorkflowError(
            f"parallel node {node.id!r}: join_policy must be wait_all or first_success, not {policy!r}",
            path=graph.path,
            line=node.line,
            column=node.column,
        )
    limiter = trio.CapacityLimiter(max(1, node.get_int("max_parallel", 4)))
    base_sha = req.scope.tip
    recorder = runtime.recorder
    if recorder is not None and base_sha is not None:
        # Branches start from the worktree as it is now, committed.
        tree = recorder.stage_tree(node.id)
        if tree is not None and tree != runtime.repo.commit_info(base_sha).tree:
            base_sha = runtime.repo.write_commit(
                tree=tree,
                parents=[base_sha],
                message=recorder.redactor.mask_text(runrefs.fan_out_base_message(runtime.run_id, node.id)),
            )
    refs_name = _fresh_refs_name(runtime, node.id, req.visit) if recorder is not None else ""
    base_context = dict(req.context)
    results: list[BranchResult | None] = [None] * len(edges)
    started = time.monotonic()
    runtime.emit("parallel.started", visit=req.visit, branch_count=len(edges), node_id=node.id, node_label=node.label, stage_id=req.stage_id)
    done = trio.Event()

    async def branch(index: int, target: str, cancel_rest: trio.CancelScope) -> None:
        # A branch that cannot even start (its worktree or ref refused) is a failed
        # branch with that error, not an exception that takes its siblings down.
        try:
            await run_branch(index, target, cancel_rest)
        except DiskFull:
            raise
        except FabroError as err:
            results[index] = BranchResult(index, target, oc.FAILED, None, {}, None, str(err))
            runtime.emit("parallel.branch.completed", index=index, duration_ms=0, status=oc.FAILED, node_id=target)

    async def run_branch(index: int, target: str, cancel_rest: trio.CancelScope) -> None:
        async with limiter:
            tnode = graph.nodes.get(target)
            runtime.emit("parallel.branch.started", index=index, node_id=target, node_label=tnode.label if tnode else target)
            t0 = time.monotonic()
            worktree = runtime.scratch / "parallel" / f"{node.id}-{req.visit}" / str(index)
            ref = None
            if recorder is not None and base_sha is not None:
                ref = runrefs.parallel_ref(runtime.run_id, refs_name, index)
                runtime.repo.update_ref(ref, base_sha, old=None, message=f"fabro: branch {index} of {node.id}")
                if worktree.exists():
                    with contextlib.suppress(FabroError):
                        wt.remove_worktree(runtime.repo, worktree)
                    shutil.rmtree(worktree, ignore_errors=True)
                wt.add_worktree(runtime.repo, worktree, branch=None, commit=base_sha)
            else:
                worktree = req.worktree
            context = Context(base_context).fork()
            scope = Scope(
                kind="branch",
                graph=graph,
                context=context,
                worktree=worktree,
                visits=dict(req.scope.visits),
                outcomes={},
                completed=[],
                loop_signatures=req.scope.loop_signatures,
                restart_signatures=req.scope.restart_signatures,
                ref=ref,
                tip=base_sha,
            )
            error = None
            try:
                status, join, error = await _walk_branch(req, scope, target)
            except RunFailed as exc:
                status, join, error = oc.FAILED, None, str(exc)
            finally:
                if ref is not None:
                    with trio.CancelScope(shield=True), contextlib.suppress(FabroError):
                        wt.remove_worktree(runtime.repo, worktree)
            result = BranchResult(
                index=index,
                id=target,
                status=status,
                head_sha=scope.tip,
                context_updates=context_delta(base_context, context),
                join=join,
                error=error,
            )
            results[index] = result
            runtime.emit(
                "parallel.branch.completed",
                index=index,
                duration_ms=int((time.monotonic() - t0) * 1000),
                status=status,
                node_id=target,
                node_label=tnode.label if tnode else target,
            )
            if policy == "first_success" and status in (oc.SUCCEEDED, oc.PARTIAL) and not done.is_set():
                done.set()
                cancel_rest.cancel()

    async with trio.open_nursery() as nursery:
        for index, edge in enumerate(edges):
            nursery.start_soon(branch, index, edge.target, nursery.cancel_scope)

    finished = [r for r in results if r is not None]
    for index, edge in enumerate(edges):
        if results[index] is None:
            finished.append(BranchResult(index, edge.target, oc.SKIPPED, None, {}, None, "cancelled: another branch succeeded first"))
    finished.sort(key=lambda r: r.index)
    successes = sum(1 for r in finished if r.status in (oc.SUCCEEDED, oc.PARTIAL))
    failures = sum(1 for r in finished if r.status == oc.FAILED)
    runtime.emit(
        "parallel.completed",
        visit=req.visit,
        duration_ms=int((time.monotonic() - started) * 1000),
        success_count=successes,
        failure_count=failures,
        results=[{"id": r.id, "status": r.status, "context_updates": r.context_updates} for r in finished],
        node_id=node.id,
        node_label=node.label,
        stage_id=req.stage_id,
    )
    joins = [r.join for r in finished if r.join]
    join = joins[0] if joins else None
    records = [r.record() for r in finished]
    req.files["parallel_results.json"] = msgspec.json.format(msgspec.json.encode(records), indent=2) + b"\n"
    updates: dict[str, Any] = {"parallel.results": records}
    if policy == "wait_all":
        status = oc.SUCCEEDED if failures == 0 else oc.PARTIAL
        if successes == 0:
            status = oc.FAILED
    else:
        status = oc.SUCCEEDED if successes else oc.FAILED
    error = None if status != oc.FAILED else "every parallel branch failed: " + "; ".join(
        f"{r.id}: {r.error or r.status}" for r in finished
    )
    return Outcome(
        status=status,
        error=error,
        failure_class=oc.DETERMINISTIC if error else None,
        context_updates=updates,
        jump_to_node=join,
        notes=f"{successes} of {len(finished)} branches succeeded",
    )


async def fan_in(req: StageRequest) -> Outcome:
    from fabro_git.store.adopt import adopt_tree

    runtime = req.runtime
    records = req.context.get("parallel.results")
    if not isinstance(records, list) or not records:
        return Outcome.failure(f"fan-in {req.node.id!r} found no parallel results to merge")
    candidates = [r for r in records if r.get("status") in (oc.SUCCEEDED, oc.PARTIAL)]
    if not candidates:
        return Outcome.failure(f"fan-in {req.node.id!r}: every branch failed")
    best = sorted(candidates, key=lambda r: (RANK.get(r.get("status", ""), 9), r.get("index", 0)))[0]
    head = best.get("head_sha")
    recorder = runtime.recorder
    scope = req.scope
    if recorder is not None and head and scope.tip and head != scope.tip:
        # The branch's files become the worktree's; the fan-in's checkpoint commit then
        # has both the run branch and the branch head as parents, so `git log` shows
        # the branch's own commits and nothing on the run branch is rewritten.
        adopt_tree(req.worktree, head)
        runtime.merge_parents.append(head)
        runtime.emit("git.reset", sha=head, node_id=req.node.id, node_label=req.node.label)
    req.files["parallel_results.json"] = msgspec.json.format(msgspec.json.encode(records), indent=2) + b"\n"
    updates = {
        "parallel.fan_in.best_id": best["id"],
        "parallel.fan_in.best_outcome": best["status"],
    }
    if head:
        updates["parallel.fan_in.best_head_sha"] = head
    return Outcome.success(context_updates=updates, notes=f"selected branch {best['id']}")
