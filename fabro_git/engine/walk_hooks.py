"""Lifecycle hooks at the walk's decision points: a stage starting, a retry, a stage's
end and the edge chosen after it. Each may let the walk go on, block it, or (where the
event allows) skip a stage or override the edge; what they say becomes an `Outcome` or
a `Decision` the walk acts on as on its own. (`checkpoint_saved` is the run's
recording's: `recording.MainRecording`.)
"""

from __future__ import annotations

from fabro_git.engine.emit import Emit
from fabro_git.engine.lifecycle import LifecycleHooks
from fabro_git.engine.outcome import DETERMINISTIC, FAILED, SKIPPED, Outcome
from fabro_git.engine.scope import Decision, Scope
from fabro_git.events.catalogue import RunNotice
from fabro_git.workflow import Node


async def stage_start(
    hooks: LifecycleHooks, node: Node, qid: str, attempt: int, max_attempts: int
) -> Outcome | None:
    """`stage_start`: a block fails the stage (routed as any failure), a skip ends it
    skipped without running it, an override skips it and jumps to `edge_to`."""
    said = await hooks.fire(
        "stage_start",
        node_id=qid,
        node_label=node.label,
        handler_type=node.handler_type,
        attempt=attempt,
        max_attempts=max_attempts,
    )
    if said.action == "block":
        return Outcome.failure(said.describe("stage_start"), DETERMINISTIC)
    if said.action in ("skip", "override"):
        return Outcome(
            status=SKIPPED,
            notes=said.describe("stage_start"),
            jump_to_node=said.edge_to if said.action == "override" else None,
        )
    return None


async def retry_allowed(
    hooks: LifecycleHooks, node: Node, qid: str, result: Outcome, attempt: int, max_attempts: int
) -> bool:
    """`stage_retrying`: a block ends the stage with its failure instead of a retry."""
    if not hooks.wants("stage_retrying"):
        return True
    said = await hooks.fire(
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


async def stage_end(
    hooks: LifecycleHooks, scope: Scope, node: Node, result: Outcome
) -> Decision | None:
    """`stage_complete` or `stage_failed`; a block ends the walk failed there (the
    stage itself stays recorded as it ended)."""
    event = "stage_failed" if result.status == FAILED else "stage_complete"
    if not hooks.wants(event):
        return None
    decision = await hooks.fire(
        event,
        node_id=scope.qualified(node.id),
        node_label=node.label,
        handler_type=node.handler_type,
        status=result.status,
        failure_reason=result.error if result.status == FAILED else None,
    )
    return Decision(None, decision.describe(event)) if decision.action == "block" else None


async def edge_selected(
    hooks: LifecycleHooks, emit: Emit, scope: Scope, decision: Decision
) -> Decision:
    """`edge_selected`: a block ends the walk failed, an override goes to `edge_to`."""
    if not hooks.wants("edge_selected") or decision.edge is None:
        return decision
    edge_from, edge_to, label = decision.edge
    said = await hooks.fire("edge_selected", edge_from=edge_from, edge_to=edge_to, edge_label=label)
    if said.action == "block":
        return Decision(None, said.describe("edge_selected"))
    if said.action == "override" and said.edge_to is not None:
        if said.edge_to not in scope.graph.nodes:
            return Decision(
                None,
                f"{said.describe('edge_selected')}, to {said.edge_to!r}, which is no node of the workflow",
            )
        emit(
            RunNotice(
                level="info",
                code="hook_override",
                message=f"{said.describe('edge_selected')}: going to {said.edge_to} instead of {edge_to}",
            )
        )
        return Decision(said.edge_to)
    return decision
