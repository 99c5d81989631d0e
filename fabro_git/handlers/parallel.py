"""Fan-out and fan-in.

A fan-out (`component`) runs one branch per outgoing edge; the engine walks each branch
in its own worktree and on its own ref until its join node: the nearest node every
branch reaches (`Graph.join_node`), a fan-in (`tripleoctagon`) or any other stage. The
branches do not run it: the fan-out's outcome sums them up and jumps there, and the
fan-out's scope runs the join and what follows once. Branches that meet nowhere walk on
to a fan-in or the exit, as before (see `fabro_git.engine.branches`).

The merge picks the best branch (status first, then the branch's order) and takes its
files; the commit after it has both the scope's tip and the branch head as parents. A
fan-in join merges; when the join is another kind of stage, the fan-out merges before
it jumps there, so that stage works on the merged result.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from fabro_git.engine.branches import BranchPlan
from fabro_git.engine.outcome import (
    DETERMINISTIC,
    FAILED,
    PARTIAL,
    SKIPPED,
    SUCCEEDED,
    Outcome,
    event_status,
)
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import FabroError, WorkflowError
from fabro_git.events.catalogue import ParallelBranchResult, ParallelCompleted, ParallelStarted
from fabro_git.jsondata import JsonObject, JsonValue, text

OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

if TYPE_CHECKING:
    from fabro_git.workflow.model import Edge

RANK = {SUCCEEDED: 0, PARTIAL: 1, SKIPPED: 2, FAILED: 3}


def _edges_and_policy(req: StageRequest) -> tuple[list[Edge], str]:
    """The fan-out node's outgoing edges and its join policy; a `WorkflowError` naming
    the node's line when it has no edge or an unknown policy."""
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
    return edges, policy


async def fan_out(req: StageRequest) -> Outcome:
    node = req.node
    graph = req.graph
    edges, policy = _edges_and_policy(req)
    started = time.monotonic()
    req.emit(ParallelStarted(visit=req.visit, branch_count=len(edges)))
    said = await req.fire_hook("parallel_start", branch_count=len(edges))
    if said.action == "block":
        return Outcome.failure(said.describe("parallel_start"), DETERMINISTIC)
    plan = BranchPlan(
        [e.target for e in edges],
        join_policy=policy,
        max_parallel=node.get_int("max_parallel", 4),
        join=graph.join_node(node.id),
    )
    finished = await req.run_branches(plan)
    successes = sum(1 for r in finished if r.status in (SUCCEEDED, PARTIAL))
    failures = sum(1 for r in finished if r.status == FAILED)
    req.emit(
        ParallelCompleted(
            visit=req.visit,
            duration_ms=int((time.monotonic() - started) * 1000),
            success_count=successes,
            failure_count=failures,
            results=[
                ParallelBranchResult(
                    id=r.id, status=event_status(r.status), context_updates=r.context_updates
                )
                for r in finished
            ],
        )
    )
    said = await req.fire_hook("parallel_complete", success_count=successes, failure_count=failures)
    if said.action == "block":
        return Outcome.failure(said.describe("parallel_complete"), DETERMINISTIC)
    joins = [r.join for r in finished if r.join]
    join = plan.join if plan.join in joins else (joins[0] if joins else None)
    records: list[JsonValue] = [r.record() for r in finished]
    req.files["parallel_results.json"] = (
        msgspec.json.format(msgspec.json.encode(records), indent=2) + b"\n"
    )
    updates: JsonObject = {"parallel.results": records}
    if join is not None and graph.nodes[join].handler_type != "parallel.fan_in":
        merged = await _merge(req, records)
        if merged is None:
            join = None  # nothing to merge: the fan-out's failure routes as any failure
        else:
            updates.update(merged)
    if policy == "wait_all":
        status = SUCCEEDED if failures == 0 else PARTIAL
        if successes == 0:
            status = FAILED
    else:
        status = SUCCEEDED if successes else FAILED
    error = (
        None
        if status != FAILED
        else "every parallel branch failed: "
        + "; ".join(f"{r.id}: {r.error or r.status}" for r in finished)
    )
    return Outcome(
        status=status,
        error=error,
        failure_class=DETERMINISTIC if error else None,
        context_updates=updates,
        jump_to_node=join,
        notes=f"{successes} of {len(finished)} branches succeeded",
    )


async def _merge(req: StageRequest, records: Sequence[JsonValue]) -> JsonObject | None:
    """Take the best branch's files into the stage's worktree; the context keys that say
    which it was. None when no branch succeeded. `records` are the branches'
    `BranchResult.record()`s, as the fan-out made them or as the context kept them."""
    candidates = [
        r for r in records if isinstance(r, dict) and r.get("status") in (SUCCEEDED, PARTIAL)
    ]
    if not candidates:
        return None
    best = min(candidates, key=_rank)
    head = text(best.get("head_sha"))
    if head and not OBJECT_ID.fullmatch(head):
        # The results are context, which a resumed run's checkpoint brings: a fetched one
        # could name any revision, or an option, in place of the branch's commit.
        raise FabroError(
            f"fan-in {req.node.id!r}: branch {best.get('id')!r} records {head[:80]!r} as its"
            " head, which is no commit id"
        )
    if head:
        await req.adopt_branch(head)
    updates: JsonObject = {
        "parallel.fan_in.best_id": best["id"],
        "parallel.fan_in.best_outcome": best["status"],
    }
    if head:
        updates["parallel.fan_in.best_head_sha"] = head
    return updates


def _rank(record: Mapping[str, JsonValue]) -> tuple[int, int]:
    """A branch record's place in the merge's choice: its status first, then its order."""
    index = record.get("index")
    return RANK.get(text(record.get("status")) or "", 9), index if isinstance(index, int) else 0


async def fan_in(req: StageRequest) -> Outcome:
    records = req.context.get("parallel.results")
    if not isinstance(records, list) or not records:
        return Outcome.failure(f"fan-in {req.node.id!r} found no parallel results to merge")
    updates = await _merge(req, records)
    if updates is None:
        return Outcome.failure(f"fan-in {req.node.id!r}: every branch failed")
    req.files["parallel_results.json"] = (
        msgspec.json.format(msgspec.json.encode(records), indent=2) + b"\n"
    )
    return Outcome.success(
        context_updates=updates, notes=f"selected branch {updates['parallel.fan_in.best_id']}"
    )
