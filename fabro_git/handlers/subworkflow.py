"""Sub-workflow (`house`) nodes: run a child workflow inside this stage.

The engine walks the child's graph in the parent's worktree with a copy of the parent's
context (`StageRequest.run_child`); its stages emit the usual stage events under
`<node>/<child node>` ids, and the changes they make are committed with the parent stage. The child's final status is the
stage's status, and the context keys it set flow back as the stage's updates.
"""

from __future__ import annotations

import time

from fabro_git.engine.outcome import FAILED, Outcome, event_status
from fabro_git.engine.runner import Supervision
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import WorkflowError
from fabro_git.events.catalogue import SubgraphCompleted, SubgraphStarted
from fabro_git.workflow import Graph


def load_child(req: StageRequest) -> Graph:
    """The child workflow, from the files the run recorded, validated and rendered with
    the run's goal and inputs, as the parent was."""
    from fabro_git.engine.templating import render_graph
    from fabro_git.workflow.paths import child_graph
    from fabro_git.workflow.validation import validate

    node = req.node
    child = child_graph(req.graph, node)
    problems = [d for d in validate(child) if d.severity == "error"]
    if problems:
        first = problems[0]
        raise WorkflowError(
            f"child workflow of {node.id!r} is invalid: [{first.rule}] {first.message}",
            path=child.path,
            line=first.line,
            column=first.column,
        )
    render_graph(child, goal=req.goal, inputs=req.inputs)
    return child


def supervision_of(req: StageRequest) -> Supervision:
    """The manager loop's controls, with Fabro's defaults (45s, 1,000 cycles)."""
    node = req.node
    rules = Supervision()
    poll = node.get_duration("manager.poll_interval", rules.poll_interval)
    cycles = node.get_int("manager.max_cycles", rules.max_cycles)
    if poll is None or poll <= 0 or cycles < 1:
        raise WorkflowError(
            f"node {node.id!r}: manager.poll_interval must be above zero and "
            "manager.max_cycles at least 1",
            path=req.graph.path,
            line=node.line,
            column=node.column,
        )
    stop = (node.get("manager.stop_condition") or "").strip() or None
    if stop is not None:
        from fabro_git.workflow.conditions import ConditionError, parse_condition

        try:
            parse_condition(stop)
        except ConditionError as err:
            raise WorkflowError(
                f"node {node.id!r}: manager.stop_condition {stop!r} is not a condition: {err}",
                path=req.graph.path,
                line=node.line,
                column=node.column,
            ) from err
    return Supervision(poll_interval=poll, max_cycles=cycles, stop_condition=stop)


async def execute(req: StageRequest) -> Outcome:
    child = load_child(req)
    start = child.start_node()
    assert start is not None
    req.emit(SubgraphStarted(start_node=start.id))
    started = time.monotonic()
    result = await req.run_child(child, supervision_of(req))
    req.emit(
        SubgraphCompleted(
            steps_executed=result.steps,
            status=event_status(result.status),
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    )
    if result.status == FAILED:
        return Outcome.failure(
            f"child workflow failed: {result.error}", context_updates=result.context_updates
        )
    notes = f"child workflow ran {result.steps} stages"
    return Outcome(
        status=result.status,
        context_updates=result.context_updates,
        notes=f"{notes}; {result.notes}" if result.notes else notes,
    )
