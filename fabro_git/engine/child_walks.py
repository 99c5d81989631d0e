"""Child workflows: a walk inside a stage (a sub-workflow, a manager loop's child).

The child walks its own graph in its parent's worktree, from the parent's tip, with a
copy of the parent's context and stage ids under `<parent node>/`; the parent's stage
gets its status and the context keys it set. A manager loop supervises it: it polls the
child's context and may stop it (`Supervision`). After each child stage the child's
progress is kept on a ref of the parent stage's own (`child_progress`), so a rerun of
that stage after a crash goes on where the child stood.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from fabro_git.engine import child_progress
from fabro_git.engine.context import Context, context_delta
from fabro_git.engine.ledger import Ledger
from fabro_git.engine.outcome import FAILED, SUCCEEDED
from fabro_git.engine.recording import ChildRecording
from fabro_git.engine.scope import ChildResult, RunFailed, Scope, Supervision, WalkEnd
from fabro_git.events.catalogue import RunNotice
from fabro_git.outputs.artifacts import ResolvedContext
from fabro_git.store.adopt import adopt_tree
from fabro_git.store.runs import child_progress_ref
from fabro_git.workflow import Graph, Node
from fabro_git.workflow.conditions import evaluate_condition

# The walk a child takes: its scope, from its first node.
Walk = Callable[[Scope, str], Awaitable[WalkEnd]]


async def run_child(
    ledger: Ledger,
    walk: Walk,
    parent: Scope,
    node: Node,
    graph: Graph,
    stage_id: str | None = None,
    supervision: Supervision | None = None,
) -> ChildResult:
    """Walk a child workflow inside `node`'s stage (`stage_id`): the parent's worktree
    and tip, a copy of its context, and stage ids under `<node>/`. A rerun of the
    stage after a crash goes on from the child's last completed stage."""
    start = graph.start_node()
    assert start is not None  # validation refused graphs without one
    scope = Scope(
        recording=ChildRecording(ledger),
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
    if stage_id is not None and parent.tip is not None:
        scope.progress_ref = child_progress_ref(ledger.run_id, stage_id)
        begin = await _resume(ledger, scope, begin)
    try:
        if supervision is None:
            end = await walk(scope, begin)
        else:
            end = await _supervised_walk(walk, scope, begin, supervision)
    except RunFailed as exc:
        result = ChildResult(FAILED, scope.steps, context_delta(before, scope.context), str(exc))
    else:
        result = ChildResult(end.status, scope.steps, context_delta(before, scope.context))
    if scope.halted is not None:
        # The manager's word decides: a stop condition that held is a success, cycles
        # run out a failure, whatever the stage it cut off made of it.
        stopped = scope.halted.startswith("stop condition")
        result.status = SUCCEEDED if stopped else FAILED
        result.error = None if stopped else scope.halted
        result.notes = scope.halted
    if scope.progress_ref is not None:
        await ledger.call(child_progress.drop, ledger, scope.progress_ref)
    return result


async def _supervised_walk(walk: Walk, scope: Scope, begin: str, rules: Supervision) -> WalkEnd:
    """Walk the child while its manager polls it (see `Supervision`)."""

    async def poll() -> None:
        for cycle in range(1, rules.max_cycles + 1):
            await trio.sleep(rules.poll_interval)
            context = scope.context
            if rules.stop_condition and evaluate_condition(
                rules.stop_condition,
                outcome=str(context.get("outcome") or ""),
                preferred_label=context.text("preferred_label"),
                context=ResolvedContext(context),
            ):
                scope.halt(f"stop condition {rules.stop_condition!r} held at cycle {cycle}")
                return
        scope.halt(
            f"the child workflow was still running after {rules.max_cycles} cycles "
            f"of {rules.poll_interval:g}s (manager.max_cycles)"
        )

    end: WalkEnd | RunFailed = WalkEnd(FAILED)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        try:
            end = await walk(scope, begin)
        except RunFailed as exc:
            end = exc  # raised outside the nursery, not inside an exception group
        nursery.cancel_scope.cancel()
    if isinstance(end, RunFailed):
        raise end
    return end


async def _resume(ledger: Ledger, scope: Scope, start: str) -> str:
    """Put a child scope back where its progress ref says it stood (its files into
    the worktree, its walk's state); the node to walk from."""
    assert scope.progress_ref is not None
    found = await ledger.call(child_progress.load, ledger, scope.progress_ref)
    if found is None:
        return start
    sha, state = found
    await ledger.call(adopt_tree, scope.worktree, sha)
    scope.visits.update(state.visits)
    scope.outcomes.update(state.outcomes)
    scope.completed.extend(state.completed)
    scope.loop_signatures.update(state.loop_signatures)
    scope.restart_signatures.update(state.restart_signatures)
    scope.context = Context(state.context)
    scope.steps = state.steps
    scope.base_tree = await ledger.call(ledger.recorder.tip_tree, sha)
    ledger.emit(
        RunNotice(
            level="info",
            code="child_resumed",
            message=f"child workflow {scope.prefix.rstrip('/')} goes on at {state.next_node}, "
            f"after the {len(state.completed)} stages it had completed",
        )
    )
    return state.next_node
