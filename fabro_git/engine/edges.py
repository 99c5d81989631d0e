"""Edge selection: which outgoing edge a finished stage takes.

The order is fixed: a matching condition, then the preferred label (accelerator prefixes
such as `[A] ` stripped), then suggested next ids, then unconditional edges. Within a tier
the highest weight wins and the lexically first target breaks ties, unless the node asks
for `selection="random"`, which draws by weight instead.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

import msgspec

from fabro_git.jsondata import JsonValue
from fabro_git.workflow import Edge, Graph, Node
from fabro_git.workflow.conditions import evaluate_condition

_ACCELERATOR = re.compile(r"^\s*(?:\[[^\]]{1,3}\]\s*|[A-Za-z0-9]\)\s+|[A-Za-z0-9]\s+-\s+)")


def normalize_label(label: str | None) -> str:
    if not label:
        return ""
    return _ACCELERATOR.sub("", label).strip().lower()


def accelerator_key(label: str) -> str | None:
    """The key a person types for an edge label: `[A] Approve` → `A`, else the first letter."""
    match = re.match(r"^\s*\[([^\]]{1,3})\]", label) or re.match(r"^\s*([A-Za-z0-9])\)\s+", label)
    if match:
        return match.group(1)
    match = re.match(r"^\s*([A-Za-z0-9])\s+-\s+", label)
    if match:
        return match.group(1)
    stripped = label.strip()
    return stripped[0].upper() if stripped else None


class Selection(msgspec.Struct, frozen=True):
    edge: Edge
    reason: str


def _pick(edges: Sequence[Edge], node: Node, rng: random.Random | None) -> Edge:
    if node.get("selection", "deterministic") == "random" and len(edges) > 1:
        weights = [e.weight if e.weight > 0 else 1 for e in edges]
        return (rng or random).choices(list(edges), weights=weights, k=1)[0]
    return sorted(edges, key=lambda e: (-e.weight, e.target))[0]


def select_edge(
    graph: Graph,
    node: Node,
    *,
    status: str,
    preferred_label: str | None,
    suggested_next_ids: Sequence[str],
    context: Mapping[str, JsonValue],
    rng: random.Random | None = None,
) -> Selection | None:
    edges = graph.outgoing(node.id)
    if not edges:
        return None
    matched = [
        e
        for e in edges
        if e.condition
        and evaluate_condition(
            e.condition, outcome=status, preferred_label=preferred_label, context=context
        )
    ]
    if matched:
        return Selection(_pick(matched, node, rng), "condition")
    unconditional = [e for e in edges if not e.condition]
    if preferred_label:
        wanted = normalize_label(preferred_label)
        for e in unconditional:
            if normalize_label(e.label) == wanted:
                return Selection(e, "preferred_label")
    for target in suggested_next_ids:
        for e in unconditional:
            if e.target == target:
                return Selection(e, "suggested_next")
    if unconditional:
        return Selection(_pick(unconditional, node, rng), "unconditional")
    return None
