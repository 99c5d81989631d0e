"""Routing: where a walk goes after a stage.

The order is fixed: a failure seen too often stops the walk (the circuit breaker), a
stage's `jump_to_node` wins, then the node's edges (`edges.select_edge`: conditions,
labels, weights); a failure no condition routed goes to a retry target or ends the walk
failed; a loop restart starts the walk afresh from its target. Every edge taken is
announced as `edge.selected`, and a reply that chose nothing where the node offers a
choice is told of (`no_directive`).
"""

from __future__ import annotations

import random

from fabro_git import redact
from fabro_git.engine.edges import Selection, select_edge
from fabro_git.engine.emit import Emit
from fabro_git.engine.failures import is_tracked, may_cross_loop_restart
from fabro_git.engine.outcome import FAILED, Outcome, event_status
from fabro_git.engine.scope import Decision, Scope
from fabro_git.events.catalogue import EdgeSelected, LoopRestart, RunNotice
from fabro_git.outputs.artifacts import ResolvedContext
from fabro_git.workflow import Edge, Node

# Where a stage's failure goes when no condition routed it, first found first.
RETRY_TARGETS = ("retry_target", "fallback_retry_target")


class Router:
    def __init__(self, emit: Emit, rng: random.Random) -> None:
        self.emit = emit
        self.rng = rng

    def route(self, scope: Scope, node: Node, result: Outcome) -> Decision:
        qid = scope.qualified(node.id)
        limit = scope.graph.get_int("loop_restart_signature_limit", 3)
        signature = scope.context.text("failure_signature") if result.status == FAILED else None
        if (
            signature
            and is_tracked(result.failure_class)
            and limit
            and scope.loop_signatures.get(signature, 0) >= limit
        ):
            count = scope.loop_signatures[signature]
            return Decision(None, _same_failure(qid, result, count, limit))
        if result.jump_to_node:
            return self._jump(scope, node, result, result.jump_to_node)
        # A fan-out's edges are its branches, already run: when none reached a fan-in,
        # there is no edge left to take.
        fanned_out = node.handler_type == "parallel"
        selection = None if fanned_out else self._select(scope, node, result)
        if (
            result.status == FAILED
            and node.handler_type != "conditional"
            and (selection is None or selection.reason != "condition")
        ):
            return self._failure_route(scope, node, result)
        if selection is None:
            if result.status == FAILED:  # a conditional node passing a failure on
                return Decision(
                    None,
                    f"no outgoing edge of {qid} matches (status {result.status}); "
                    "add an unconditional edge or a condition that covers this outcome",
                )
            return self._dead_end(scope, node, result, fanned_out=fanned_out)
        self._notice_no_directive(scope, node, result, selection.edge, selection.reason)
        if selection.edge.loop_restart:
            return self._loop_restart(scope, node, result, selection, signature, limit)
        return self._take(scope, node, result, selection.edge, selection.reason)

    def _select(self, scope: Scope, node: Node, result: Outcome) -> Selection | None:
        return select_edge(
            scope.graph,
            node,
            status=result.status,
            preferred_label=result.preferred_label,
            suggested_next_ids=result.suggested_next_ids,
            # A condition on an offloaded key sees its value, not the pointer.
            context=ResolvedContext(scope.context),
            rng=self.rng,
        )

    def _jump(self, scope: Scope, node: Node, result: Outcome, target: str) -> Decision:
        if target not in scope.graph.nodes:
            qid = scope.qualified(node.id)
            return Decision(None, f"{qid} asked to jump to unknown node {target!r}")
        edge = self._edge_event(scope, node, result, target, None, None, "jump", True)
        return Decision(target, edge=edge)

    def _failure_route(self, scope: Scope, node: Node, result: Outcome) -> Decision:
        """A failure no condition routed: the node's retry target, else the graph's,
        else the walk ends failed."""
        graph = scope.graph
        for attrs in (node.attrs, graph.attrs):
            for key in RETRY_TARGETS:
                target = attrs.get(key)
                if target and target in graph.nodes:
                    edge = self._edge_event(scope, node, result, target, None, None, key, True)
                    return Decision(target, edge=edge)
        qid = scope.qualified(node.id)
        return Decision(None, f"stage {qid} failed: {result.error or 'no reason given'}")

    def _loop_restart(
        self,
        scope: Scope,
        node: Node,
        result: Outcome,
        selection: Selection,
        signature: str | None,
        limit: int,
    ) -> Decision:
        """A loop_restart edge: the walk starts afresh from its target, unless the
        failure may not cross it or has come round too often."""
        qid = scope.qualified(node.id)
        if result.status == FAILED and not may_cross_loop_restart(result.failure_class):
            return Decision(
                None,
                f"loop_restart blocked: failure_class={result.failure_class} (requires transient_infra)",
            )
        if signature:
            count = scope.restart_signatures[signature] = (
                scope.restart_signatures.get(signature, 0) + 1
            )
            if limit and count >= limit:
                return Decision(None, _same_failure(qid, result, count, limit))
        decision = self._take(scope, node, result, selection.edge, selection.reason)
        self.emit(LoopRestart(from_node=qid, to_node=scope.qualified(selection.edge.target)))
        self._restart(scope)
        return decision

    def _take(self, scope: Scope, node: Node, result: Outcome, edge: Edge, reason: str) -> Decision:
        announced = self._edge_event(
            scope, node, result, edge.target, edge.label, edge.condition, reason, False
        )
        return Decision(edge.target, edge=announced)

    def _notice_no_directive(
        self, scope: Scope, node: Node, result: Outcome, edge: Edge, reason: str
    ) -> None:
        """A reply with no directive where the node offers a choice of labelled or
        conditional edges: say which edge it took and why, and how a reply chooses. A
        reviewer that answers `ok` otherwise goes down an edge nobody chose, silently."""
        if result.directive_given is not False:
            return
        edges = scope.graph.outgoing(node.id)
        if len(edges) < 2 or not any(e.label or e.condition for e in edges):
            return
        qid = scope.qualified(node.id)
        taken = f"{qid} -> {scope.qualified(edge.target)}"
        if edge.label:
            taken += f" ({edge.label!r})"
        if reason == "condition":
            why = f"it counts as {result.status}, and the condition {edge.condition!r} matched"
        else:
            unmatched = "no condition matched, and " if any(e.condition for e in edges) else ""
            why = (
                f"it counts as {result.status}; {unmatched}this is the unconditional edge "
                "of highest weight (then first by target name)"
            )
        labels = [e.label for e in edges if e.label and not e.condition]
        ask = (
            f'{{"preferred_next_label": "{labels[0]}"}}'
            if labels
            else '{"outcome": "succeeded"|"failed"}'
        )
        message = (
            f"{qid}'s reply gave no routing directive, so the run took {taken}: {why}; "
            f"to choose, the reply ends with a JSON object such as {ask} "
            "(see Replies in git-fabro(1))"
        )
        self.emit(
            RunNotice(
                level="info" if reason == "condition" else "warn",
                code="no_directive",
                message=message,
            ),
            node_id=qid,
            node_label=node.label,
        )

    def _dead_end(self, scope: Scope, node: Node, result: Outcome, *, fanned_out: bool) -> Decision:
        """A stage that did not fail and has no edge to take ends its walk, as the exit would."""
        qid, walk = scope.qualified(node.id), scope.recording.walk_name
        if fanned_out:
            message = (
                f"{qid} finished {result.status}, but none of its branches reached a fan-in, so "
                f"{walk} ends there and no branch's changes are merged; lead the branches to a "
                "fan-in (shape=tripleoctagon) for the workflow to go on"
            )
        else:
            message = (
                f"{qid} finished {result.status} and has no outgoing edge to take, so {walk} "
                "ends there; add an edge from it if the workflow should go on"
            )
        self.emit(
            RunNotice(level="warn", code="no_outgoing_edge", message=message),
            node_id=qid,
            node_label=node.label,
        )
        return Decision(None)

    def _restart(self, scope: Scope) -> None:
        """A loop restart starts the walk afresh from the target: visits and context reset."""
        keep = {
            k: v
            for k, v in scope.context.items()
            if k.startswith(("graph.", "internal.run_id", "internal.work_dir"))
        }
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
    ) -> tuple[str, str, str | None]:
        """Announce the edge taken; it, as the `edge_selected` hooks hear of it."""
        edge = (scope.qualified(node.id), scope.qualified(target), label)
        self.emit(
            EdgeSelected(
                from_node=edge[0],
                to_node=edge[1],
                label=label,
                condition=condition,
                reason=reason,
                preferred_label=result.preferred_label,
                suggested_next_ids=list(result.suggested_next_ids),
                stage_status=event_status(result.status),
                is_jump=is_jump,
            )
        )
        return edge


def _same_failure(qid: str, result: Outcome, count: int, limit: int) -> str:
    """Why a loop stopped, in the words of the failure itself: the signature that
    counted the repeats is the engine's bookkeeping, not something to show."""
    # The headline of the error: `command exited with status 1`, not the output after it.
    why = (result.error or "no reason given").strip().splitlines()[0].split(": ", 1)[0]
    if len(why) > 200:
        why = redact.clip(why, 199) + "…"
    return (
        f"stage {qid} failed the same way {count} times ({why}); stopping, as another "
        f"try would fail again (the graph's loop_restart_signature_limit is {limit})"
    )
