"""Sub-workflow (`house`) nodes: run a child workflow inside this stage.

The child walks its own graph in the parent's worktree with a copy of the parent's
context; its stages emit the usual stage events under `<node>/<child node>` ids, and the
changes they make are committed with the parent stage. The child's final status is the
stage's status, and the context keys it set flow back as the stage's updates.
"""

from __future__ import annotations

import time

from fabro_git.engine import outcome as oc
from fabro_git.engine.context import context_delta
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.runner import RunFailed, Scope
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import WorkflowError
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
    manifest = req.runtime.manifest
    render_graph(child, goal=manifest.goal, inputs=manifest.inputs)
    return child


async def execute(req: StageRequest) -> Outcome:
    runtime = req.runtime
    node = req.node
    child = load_child(req)
    start = child.start_node()
    assert start is not None
    before = dict(req.context)
    scope = Scope(
        kind="child",
        graph=child,
        context=req.scope.context.fork(),
        worktree=req.worktree,
        visits={},
        outcomes={},
        completed=[],
        loop_signatures={},
        restart_signatures={},
        prefix=f"{req.scope.qualified(node.id)}/",
    )
    runtime.emit(
        "subgraph.started",
        start_node=start.id,
        node_id=node.id,
        node_label=node.label,
        stage_id=req.stage_id,
    )
    started = time.monotonic()
    status = oc.SUCCEEDED
    error = None
    node_id: str | None = start.id
    try:
        while node_id is not None:
            cnode = child.nodes.get(node_id)
            if cnode is None:
                raise RunFailed(f"child workflow has no node {node_id!r}")
            visit = runtime._enter(scope, cnode)
            result = await runtime.execute_stage(scope, cnode, visit)
            if cnode.handler_type != "exit":
                decision = runtime.route(scope, cnode, result)
                if decision.error is not None:
                    raise RunFailed(decision.error)
                node_id = decision.next_node
                if node_id is not None:
                    continue
            # The exit, or a stage with no edge to take: the child is done.
            gate = runtime._unsatisfied_goal_gate(scope)
            if gate is not None:
                raise RunFailed(f"goal gate {gate.id} of the child workflow is not satisfied")
            status = runtime._final_status(scope)
            break
    except RunFailed as exc:
        status, error = oc.FAILED, str(exc)
    runtime.emit(
        "subgraph.completed",
        steps_executed=scope.steps,
        status=status,
        duration_ms=int((time.monotonic() - started) * 1000),
        node_id=node.id,
        node_label=node.label,
        stage_id=req.stage_id,
    )
    updates = context_delta(before, scope.context)
    if status == oc.FAILED:
        return Outcome.failure(f"child workflow failed: {error}", context_updates=updates)
    return Outcome(
        status=status, context_updates=updates, notes=f"child workflow ran {scope.steps} stages"
    )
