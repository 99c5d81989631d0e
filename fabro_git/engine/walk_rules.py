"""The walk's rules that need no runtime: how often a node may run, the goal gates
where a walk would end, a stage's timeout, and whether a checkpoint ends the walk."""

from __future__ import annotations

from typing import NamedTuple

from fabro_git.engine.checkpoint import Checkpoint
from fabro_git.engine.emit import Emit
from fabro_git.engine.outcome import PARTIAL, SUCCEEDED
from fabro_git.engine.scope import Decision, Scope
from fabro_git.events.catalogue import RunNotice
from fabro_git.workflow import Graph, Node
from fabro_git.workflow.model import LLM_TYPES


def check_goal_gates(scope: Scope, emit: Emit) -> Decision:
    """Where a walk would end: go on (no next node), retry from a gate's retry
    target, or fail when an unsatisfied gate has none."""
    gate = _unsatisfied_goal_gate(scope)
    if gate is None:
        return Decision(None)
    target = _goal_gate_target(scope.graph, gate)
    if target is None:
        return Decision(
            None,
            f"goal gate unsatisfied for node {scope.qualified(gate.id)} and no retry target",
        )
    emit(
        RunNotice(
            level="warn",
            code="goal_gate_retry",
            message=f"goal gate {gate.id} is not satisfied; retrying from {target}",
        )
    )
    return Decision(target)


def _unsatisfied_goal_gate(scope: Scope) -> Node | None:
    for node_id, record in scope.outcomes.items():
        node = scope.graph.nodes.get(node_id)
        if (
            node is not None
            and node.get_bool("goal_gate", False)
            and record["status"] not in (SUCCEEDED, PARTIAL)
        ):
            return node
    return None


def _goal_gate_target(graph: Graph, gate: Node) -> str | None:
    for value in (
        gate.get("retry_target"),
        gate.get("fallback_retry_target"),
        graph.attrs.get("retry_target"),
        graph.attrs.get("fallback_retry_target"),
    ):
        if value and value in graph.nodes:
            return value
    return None


# Seconds a model stage (prompt or agent) may run when its node sets no `timeout`: a
# provider that keeps a stream alive without finishing cannot hold the run for ever.
DEFAULT_LLM_STAGE_TIMEOUT = 30 * 60.0


def stage_timeout(node: Node) -> float | None:
    """The node's `timeout` in seconds; for a model stage without one, the default."""
    timeout = node.get_duration("timeout", None)
    if timeout is None and node.handler_type in LLM_TYPES:
        return DEFAULT_LLM_STAGE_TIMEOUT
    return timeout


def walk_finished(cp: Checkpoint, graph: Graph) -> bool:
    """True when the checkpoint was taken after the walk's last stage: the walk is over.

    That checkpoint (after the exit, or after a stage with no edge to take) has no next
    node, which otherwise means "not started yet"; a run killed between it and the
    `finalize` snapshot must not start over from start. A failed walk's checkpoint names
    its last stage as next, so it never looks finished.
    """
    last = cp.current_node
    return cp.next_node_id is None and last is not None and last in graph.nodes


# A dry run simulates every agent, so no agent ever sets the context key a loop waits
# for: without a bound, a dry run of a fix-and-verify loop would go round forever.
DRY_RUN_VISIT_LIMIT = 10


class VisitLimit(NamedTuple):
    most: int  # 0: no limit
    source: str
    # The dry-run bound holds across loop restarts, which reset visit counts: it exists
    # so that a dry run always ends.
    across_restarts: bool = False


def visit_limit(node: Node, graph: Graph, *, dry_run: bool) -> VisitLimit:
    """How many times `node` may run in one walk, and where that number comes from.

    The node's `max_visits` wins, then the graph's `max_node_visits` (0 turns the limit
    off); with neither, a dry run stops at DRY_RUN_VISIT_LIMIT and a real run never does.
    """
    own = node.get_int("max_visits", 0)
    if own > 0:
        return VisitLimit(own, f"max_visits={own} on the node")
    graph_limit = graph.get_int("max_node_visits", -1)
    if graph_limit >= 0:
        return VisitLimit(graph_limit, f"max_node_visits={graph_limit} on the graph")
    if dry_run:
        source = f"{DRY_RUN_VISIT_LIMIT} in a dry run; max_node_visits or max_visits changes it"
        return VisitLimit(DRY_RUN_VISIT_LIMIT, source, across_restarts=True)
    return VisitLimit(0, "none")
