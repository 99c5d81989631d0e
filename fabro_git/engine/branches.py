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

Every git call here runs on a worker thread (`Ledger.call`), so branches do not wait on
each other's git work and the watchdog is never held up.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from fabro_git.engine.context import Context, context_delta
from fabro_git.engine.outcome import FAILED, PARTIAL, SKIPPED, SUCCEEDED, event_status
from fabro_git.engine.recording import BranchRecording
from fabro_git.engine.scope import RunFailed, Scope, WalkEnd
from fabro_git.errors import DiskFull, FabroError
from fabro_git.events.catalogue import GitReset, ParallelBranchCompleted, ParallelBranchStarted
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as runrefs
from fabro_git.store import worktree as worktrees

if TYPE_CHECKING:
    from fabro_git.engine.ledger import Ledger
    from fabro_git.workflow import Node

# The walk a branch takes: its scope, from its first node.
Walk = Callable[[Scope, str], Awaitable[WalkEnd]]

BRANCH_STOPS = frozenset({"parallel.fan_in", "exit"})


class BranchResult(msgspec.Struct):
    index: int
    id: str
    status: str
    head_sha: str | None
    context_updates: JsonObject = msgspec.field(default_factory=dict)
    join: str | None = None
    error: str | None = None

    def record(self) -> JsonObject:
        data: JsonObject = {
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
    ledger: Ledger, walk: Walk, parent: Scope, node: Node, visit: int, plan: BranchPlan
) -> list[BranchResult]:
    """Run every branch of `plan` to its fan-in; one result per target, in order."""
    qid = parent.qualified(node.id)
    fan_out = FanOut(ledger, walk, parent, plan, qid, visit)
    if parent.tip is not None:
        base_sha = await ledger.call(_fan_out_base, ledger, parent, qid)
        fan_out.base = (base_sha, await ledger.call(_fresh_refs_name, ledger, qid, visit))
    limiter = trio.CapacityLimiter(max(1, plan.max_parallel))
    async with trio.open_nursery() as nursery:
        for index, target in enumerate(plan.targets):
            nursery.start_soon(fan_out.branch, limiter, index, target, nursery.cancel_scope)
    return fan_out.finished()


class FanOut:
    """One fan-out's branches as they run side by side, and their results."""

    def __init__(
        self, ledger: Ledger, walk: Walk, parent: Scope, plan: BranchPlan, qid: str, visit: int
    ) -> None:
        self.ledger, self.walk, self.parent, self.plan = ledger, walk, parent, plan
        self.qid, self.visit = qid, visit
        # The branches' first commit and their refs' directory; None when the scope has
        # no commits of its own (a run in place): the branches share its worktree.
        self.base: tuple[str, str] | None = None
        self.base_context = dict(parent.context)
        self.results: list[BranchResult | None] = [None] * len(plan.targets)
        self.done = trio.Event()

    async def branch(
        self,
        limiter: trio.CapacityLimiter,
        index: int,
        target: str,
        cancel_rest: trio.CancelScope,
    ) -> None:
        # A branch that cannot even start (its worktree or ref refused) is a failed
        # branch with that error, not an exception that takes its siblings down.
        try:
            async with limiter:
                await self._run_one(index, target, cancel_rest)
        except DiskFull:
            raise
        except FabroError as err:
            self.results[index] = BranchResult(index, target, FAILED, None, error=str(err))
            self.ledger.emit(
                ParallelBranchCompleted(index=index, duration_ms=0, status=event_status(FAILED)),
                node_id=self.parent.qualified(target),
            )

    async def _run_one(self, index: int, target: str, cancel_rest: trio.CancelScope) -> None:
        parent, emit = self.parent, self.ledger.emit
        target_node = parent.graph.nodes.get(target)
        label = target_node.label if target_node else target
        emit(ParallelBranchStarted(index=index), node_id=parent.qualified(target), node_label=label)
        started = time.monotonic()
        scope = await self._open(index)
        join = error = None
        try:
            end = await self.walk(scope, target)
            status, join = end.status, end.stopped_at
        except RunFailed as exc:
            status, error = FAILED, str(exc)
        finally:
            if scope.ref is not None:
                with trio.CancelScope(shield=True), contextlib.suppress(FabroError):
                    await self.ledger.call(
                        worktrees.remove_worktree, self.ledger.repo, scope.worktree
                    )
        self.results[index] = BranchResult(
            index=index,
            id=target,
            status=status,
            head_sha=scope.tip,
            context_updates=context_delta(self.base_context, scope.context),
            join=join,
            error=error,
        )
        duration_ms = int((time.monotonic() - started) * 1000)
        emit(
            ParallelBranchCompleted(
                index=index, duration_ms=duration_ms, status=event_status(status)
            ),
            node_id=parent.qualified(target),
            node_label=label,
        )
        if (
            self.plan.join_policy == "first_success"
            and status in (SUCCEEDED, PARTIAL)
            and not self.done.is_set()
        ):
            self.done.set()
            cancel_rest.cancel()

    async def _open(self, index: int) -> Scope:
        """The branch's scope: its own worktree and ref, or its parent's worktree."""
        ledger, parent, plan = self.ledger, self.parent, self.plan
        worktree, ref, tip, tag = parent.worktree, None, None, None
        if self.base is not None:
            tip, refs_name = self.base
            worktree = ledger.scratch / "parallel" / f"{self.qid}-{self.visit}" / str(index)
            ref = runrefs.parallel_ref(ledger.run_id, refs_name, index)
            message = f"fabro: branch {index} of {self.qid}"
            await ledger.call(_open_branch, ledger, worktree, ref, tip, message)
            # Branches may set the same key at once: each keeps its own file.
            tag = ref.removeprefix(f"{runrefs.PARALLEL_PREFIX}{ledger.run_id}/")
        return Scope(
            recording=BranchRecording(ledger),
            graph=parent.graph,
            context=Context(self.base_context).fork(),
            worktree=worktree,
            visits=dict(parent.visits),
            outcomes={},
            completed=[],
            loop_signatures=parent.loop_signatures,
            restart_signatures=parent.restart_signatures,
            ref=ref,
            tip=tip,
            prefix=parent.prefix,
            branch_tag=tag,
            stop_at=BRANCH_STOPS,
            stop_nodes=parent.stop_nodes | {plan.join} if plan.join else parent.stop_nodes,
        )

    def finished(self) -> list[BranchResult]:
        """One result per target, in order: a branch cut off by another's success as skipped."""
        finished = []
        for index, target in enumerate(self.plan.targets):
            result = self.results[index]
            if result is None:
                result = BranchResult(
                    index,
                    target,
                    SKIPPED,
                    None,
                    error="cancelled: another branch succeeded first",
                )
            finished.append(result)
        return finished


async def adopt_branch(ledger: Ledger, scope: Scope, node: Node, head: str) -> None:
    """The fan-in's choice: the branch's files become the scope's worktree, and the scope's
    next commit has both its tip and the branch head as parents, so `git log` shows the
    branch's own commits and nothing already committed is rewritten."""
    from fabro_git.store.adopt import adopt_tree

    if scope.tip is None or head == scope.tip:
        return
    await ledger.call(adopt_tree, scope.worktree, head)
    scope.merge_parents.append(head)
    ledger.emit(GitReset(sha=head), node_id=scope.qualified(node.id), node_label=node.label)


def _fan_out_base(ledger: Ledger, parent: Scope, qid: str) -> str:
    """The branches' starting commit: the scope's worktree as it is now, on its tip."""
    recorder, repo = ledger.recorder, ledger.repo
    assert parent.tip is not None
    tree = recorder.worktree_tree(parent.worktree, qid)
    if tree is None or tree == repo.commit_info(parent.tip).tree:
        return parent.tip
    return repo.write_commit(
        tree=tree,
        parents=[parent.tip],
        message=recorder.redactor.mask_text(runrefs.fan_out_base_message(ledger.run_id, qid)),
    )


def _fresh_refs_name(ledger: Ledger, qid: str, visit: int) -> str:
    """The ref directory for this run of a fan-out: `<node>-<visit>`, or, when a retry or
    a resume runs the same visit again, `<node>-<visit>.<n>`. Branch refs are only ever
    created, never moved back, so a run's refs that were pushed stay fast-forwards."""
    name, n = f"{qid}-{visit}", 1
    while ledger.repo.list_refs(f"{runrefs.PARALLEL_PREFIX}{ledger.run_id}/{name}"):
        n += 1
        name = f"{qid}-{visit}.{n}"
    return name


def _open_branch(ledger: Ledger, worktree: Path, ref: str, base_sha: str, message: str) -> None:
    repo = ledger.repo
    repo.update_ref(ref, base_sha, old=None, message=message)
    if worktree.exists():
        with contextlib.suppress(FabroError):
            worktrees.remove_worktree(repo, worktree)
        shutil.rmtree(worktree, ignore_errors=True)
    worktrees.add_worktree(repo, worktree, branch=None, commit=base_sha)
