"""Parallel branches: their worktrees, their refs, their commits, and the fan-in's adoption.

A fan-out in any scope (the run, a branch, a child workflow) starts its branches from the
scope's worktree as it is now, committed as the *base*. Each branch gets its own worktree
(detached at the base) and its own ref under `refs/fabro/parallel/<run>/<node>-<visit>/<n>`;
after every branch stage, the branch's worktree is committed on that ref. The branches
walk the graph in a trio nursery under a `CapacityLimiter`, each with a deep copy of the
context, until their join node (the nearest node every branch reaches, a fan-in or any
other stage), or else a fan-in or the exit. The fan-in, or the fan-out itself when the
join is another kind of stage, takes the winning branch's files into its scope's
worktree and adds the branch head as a parent of the scope's next commit.

Every git call here runs on a worker thread (`Runtime.store_call`), so branches do not
wait on each other's git work and the watchdog is never held up.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from fabro_git.engine import outcome as oc
from fabro_git.engine.context import Context, context_delta
from fabro_git.errors import DiskFull, FabroError
from fabro_git.events.catalogue import (
    CheckpointFailed,
    GitCommit,
    GitReset,
    ParallelBranchCompleted,
    ParallelBranchStarted,
)
from fabro_git.store import runs as runrefs

if TYPE_CHECKING:
    from fabro_git.engine.runner import Runtime, Scope
    from fabro_git.workflow import Node

BRANCH_STOPS = frozenset({"parallel.fan_in", "exit"})


class BranchResult(msgspec.Struct):
    index: int
    id: str
    status: str
    head_sha: str | None
    context_updates: dict[str, Any] = msgspec.field(default_factory=dict)
    join: str | None = None
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


class BranchPlan(msgspec.Struct):
    """What a fan-out asks for: the branch starts, how they join, how many at once."""

    targets: list[str]
    join_policy: str = "wait_all"  # or "first_success"
    max_parallel: int = 4
    # The node every branch reaches first (`Graph.join_node`): branches stop in front
    # of it, and the fan-out's scope runs it and what follows, once.
    join: str | None = None


async def run_branches(
    runtime: Runtime, parent: Scope, node: Node, visit: int, plan: BranchPlan
) -> list[BranchResult]:
    """Run every branch of `plan` to its fan-in; one result per target, in order."""
    from fabro_git.engine.runner import RunFailed, Scope

    limiter = trio.CapacityLimiter(max(1, plan.max_parallel))
    qid = parent.qualified(node.id)
    recorder = runtime.recorder
    isolated = recorder is not None and parent.tip is not None
    base_sha = await runtime.store_call(_fan_out_base, runtime, parent, qid) if isolated else None
    refs_name = await runtime.store_call(_fresh_refs_name, runtime, qid, visit) if isolated else ""
    base_context = dict(parent.context)
    results: list[BranchResult | None] = [None] * len(plan.targets)
    done = trio.Event()

    async def branch(index: int, target: str, cancel_rest: trio.CancelScope) -> None:
        # A branch that cannot even start (its worktree or ref refused) is a failed
        # branch with that error, not an exception that takes its siblings down.
        try:
            async with limiter:
                await run_one(index, target, cancel_rest)
        except DiskFull:
            raise
        except FabroError as err:
            results[index] = BranchResult(index, target, oc.FAILED, None, error=str(err))
            runtime.emit(
                ParallelBranchCompleted(
                    index=index, duration_ms=0, status=oc.event_status(oc.FAILED)
                ),
                node_id=parent.qualified(target),
            )

    async def run_one(index: int, target: str, cancel_rest: trio.CancelScope) -> None:
        tnode = parent.graph.nodes.get(target)
        label = tnode.label if tnode else target
        runtime.emit(
            ParallelBranchStarted(index=index), node_id=parent.qualified(target), node_label=label
        )
        started = time.monotonic()
        worktree = runtime.scratch / "parallel" / f"{qid}-{visit}" / str(index)
        ref = None
        if isolated:
            assert base_sha is not None
            ref = _branch_ref(runtime, refs_name, index)
            await runtime.store_call(
                _open_branch, runtime, worktree, ref, base_sha, f"fabro: branch {index} of {qid}"
            )
        else:
            worktree = parent.worktree
        scope = Scope(
            kind="branch",
            graph=parent.graph,
            context=Context(base_context).fork(),
            worktree=worktree,
            visits=dict(parent.visits),
            outcomes={},
            completed=[],
            loop_signatures=parent.loop_signatures,
            restart_signatures=parent.restart_signatures,
            ref=ref,
            tip=base_sha,
            prefix=parent.prefix,
            stop_at=BRANCH_STOPS,
            stop_nodes=parent.stop_nodes | {plan.join} if plan.join else parent.stop_nodes,
        )
        join = error = None
        try:
            end = await runtime.walk(scope, target)
            status, join = end.status, end.stopped_at
        except RunFailed as exc:
            status, error = oc.FAILED, str(exc)
        finally:
            if ref is not None:
                with trio.CancelScope(shield=True), contextlib.suppress(FabroError):
                    await runtime.store_call(_close_branch, runtime, worktree)
        results[index] = BranchResult(
            index=index,
            id=target,
            status=status,
            head_sha=scope.tip,
            context_updates=context_delta(base_context, scope.context),
            join=join,
            error=error,
        )
        duration_ms = int((time.monotonic() - started) * 1000)
        runtime.emit(
            ParallelBranchCompleted(
                index=index, duration_ms=duration_ms, status=oc.event_status(status)
            ),
            node_id=parent.qualified(target),
            node_label=label,
        )
        if (
            plan.join_policy == "first_success"
            and status in (oc.SUCCEEDED, oc.PARTIAL)
            and not done.is_set()
        ):
            done.set()
            cancel_rest.cancel()

    async with trio.open_nursery() as nursery:
        for index, target in enumerate(plan.targets):
            nursery.start_soon(branch, index, target, nursery.cancel_scope)

    finished = []
    for index, target in enumerate(plan.targets):
        result = results[index]
        if result is None:
            result = BranchResult(
                index, target, oc.SKIPPED, None, error="cancelled: another branch succeeded first"
            )
        finished.append(result)
    return finished


def commit_branch_stage(
    runtime: Runtime, scope: Scope, node_id: str, status: str, stage_id: str
) -> None:
    """Commit a branch stage's worktree on the branch's ref (on a worker thread), with
    the tree its files_touched came from when there is one.

    RunFailed when git cannot, which fails the branch: its work must not go missing
    from the fan-in. A full disk stops the whole run at its last checkpoint instead.
    """
    from fabro_git.engine.runner import RunFailed
    from fabro_git.store import worktree as wt

    recorder = runtime.recorder
    early = scope.stage_trees.pop(stage_id, None)
    if recorder is None or scope.ref is None or scope.tip is None:
        return
    qid = scope.qualified(node_id)
    try:
        tree = early or wt.snapshot_tree(scope.worktree, exclude_globs=recorder.exclude_globs)
        message = recorder.redactor.mask_text(
            runrefs.branch_commit_message(
                runtime.run_id, qid, status, scope.prefix.rstrip("/") or node_id
            )
        )
        parents = [scope.tip, *scope.merge_parents]
        sha = runtime.repo.write_commit(tree=tree, parents=parents, message=message)
        runtime.repo.update_ref(scope.ref, sha, old=scope.tip, message=f"fabro: branch stage {qid}")
    except DiskFull:
        raise
    except FabroError as err:
        error = f"could not record the files of {qid}: {err}"
        runtime.emit(CheckpointFailed(error=error), node_id=qid)
        raise RunFailed(error) from err
    scope.merge_parents.clear()
    scope.tip = sha
    runtime.emit(GitCommit(sha=sha), node_id=qid)


async def adopt_branch(runtime: Runtime, scope: Scope, node: Node, head: str) -> None:
    """The fan-in's choice: the branch's files become the scope's worktree, and the scope's
    next commit has both its tip and the branch head as parents, so `git log` shows the
    branch's own commits and nothing already committed is rewritten."""
    from fabro_git.store.adopt import adopt_tree

    if runtime.recorder is None or scope.tip is None or head == scope.tip:
        return
    await runtime.store_call(adopt_tree, scope.worktree, head)
    scope.merge_parents.append(head)
    runtime.emit(GitReset(sha=head), node_id=scope.qualified(node.id), node_label=node.label)


def worktree_tree(runtime: Runtime, worktree: Path, qid: str) -> str | None:
    """A scope's worktree as it is now, as a tree (on a worker thread): the run's own
    worktree through the recorder (which adopts commits a stage made there), a branch's
    by a scan of its own index."""
    from fabro_git.store import worktree as wt

    recorder = runtime.recorder
    assert recorder is not None
    if recorder.worktree is not None and Path(worktree) == Path(recorder.worktree):
        return recorder.stage_tree(qid)
    return wt.snapshot_tree(worktree, exclude_globs=recorder.exclude_globs)


def _fan_out_base(runtime: Runtime, parent: Scope, qid: str) -> str:
    """The branches' starting commit: the scope's worktree as it is now, on its tip."""
    recorder = runtime.recorder
    assert recorder is not None and parent.tip is not None
    tree = worktree_tree(runtime, parent.worktree, qid)
    if tree is None or tree == runtime.repo.commit_info(parent.tip).tree:
        return parent.tip
    return runtime.repo.write_commit(
        tree=tree,
        parents=[parent.tip],
        message=recorder.redactor.mask_text(runrefs.fan_out_base_message(runtime.run_id, qid)),
    )


def _fresh_refs_name(runtime: Runtime, qid: str, visit: int) -> str:
    """The ref directory for this run of a fan-out: `<node>-<visit>`, or, when a retry or
    a resume runs the same visit again, `<node>-<visit>.<n>`. Branch refs are only ever
    created, never moved back, so a run's refs that were pushed stay fast-forwards."""
    from fabro_git.store import runs as runrefs

    name, n = f"{qid}-{visit}", 1
    while runtime.repo.list_refs(f"{runrefs.PARALLEL_PREFIX}{runtime.run_id}/{name}"):
        n += 1
        name = f"{qid}-{visit}.{n}"
    return name


def _branch_ref(runtime: Runtime, refs_name: str, index: int) -> str:
    from fabro_git.store import runs as runrefs

    return runrefs.parallel_ref(runtime.run_id, refs_name, index)


def _open_branch(runtime: Runtime, worktree: Path, ref: str, base_sha: str, message: str) -> None:
    from fabro_git.store import worktree as wt

    runtime.repo.update_ref(ref, base_sha, old=None, message=message)
    if worktree.exists():
        with contextlib.suppress(FabroError):
            wt.remove_worktree(runtime.repo, worktree)
        shutil.rmtree(worktree, ignore_errors=True)
    wt.add_worktree(runtime.repo, worktree, branch=None, commit=base_sha)


def _close_branch(runtime: Runtime, worktree: Path) -> None:
    from fabro_git.store import worktree as wt

    wt.remove_worktree(runtime.repo, worktree)
