"""Lint rules on routing: edge conditions that do not parse or name no known outcome
or key, and nodes whose conditional edges leave some outcome with nowhere to go."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from fabro_git.suggest import close_names
from fabro_git.workflow.conditions import (
    OUTCOME_ALIASES,
    STANDARD_OUTCOMES,
    Condition,
    ConditionError,
    normalize_outcome,
    parse_condition,
)
from fabro_git.workflow.lint_check import (
    ERROR,
    WARNING,
    Check,
    Diagnostic,
    did_you_mean,
    is_flag_set,
)
from fabro_git.workflow.model import (
    COMMAND,
    EXIT,
    HUMAN,
    PARALLEL,
    START,
    WAIT,
    Edge,
    Node,
    parse_bool,
)

# Combinations tried by all_conditional_edges before it gives up proving coverage.
_MAX_CASES = 4096


# Bare condition keys the engine sets itself; any other bare key reads the context.
_ROUTING_KEYS: tuple[str, ...] = ("outcome", "preferred_label")


def condition_typo(check: Check) -> Iterator[Diagnostic]:
    """A condition that can never be true as written because of a slip of the keyboard:
    a bare key one or two edits from `outcome` or `preferred_label` (a bare key reads
    the context, where nothing sets `outcom`), or an outcome value close to one a stage
    reports (`outcome=succeded`)."""
    graph = check.graph
    outcome_names = (*STANDARD_OUTCOMES, *OUTCOME_ALIASES)
    for index, condition in sorted(check.conditions.items()):
        edge = graph.edges[index]
        for clause in condition.clauses():
            key = clause.key
            message = None
            typo: tuple[str, str] | None = None
            if key == "outcome":
                if clause.op not in ("=", "!=") or clause.value in outcome_names:
                    continue
                close = close_names(clause.value, STANDARD_OUTCOMES)
                if close:
                    message = (
                        f"no stage reports outcome {clause.value!r}, so this clause is "
                        f"{'never' if clause.op == '=' else 'always'} true"
                        f"{did_you_mean(clause.value, close)}"
                    )
                    typo = (clause.value, close[0])
            elif not key.startswith("context.") and key not in _ROUTING_KEYS:
                close = close_names(key, _ROUTING_KEYS)
                # An agent may set any key through context_updates; one its prompt names
                # is meant, not a slip.
                if close and key not in check.words():
                    message = (
                        f"{key!r} is a context key that no stage sets, so it reads as empty"
                        f"{did_you_mean(key, close)}"
                    )
                    typo = (key, close[0])
            if message is None:
                continue
            pos = check.value_position(edge.positions.get("condition"), clause.offset)
            yield check.on_edge(
                "condition_typo",
                WARNING,
                f"edge {edge.source} -> {edge.target}: condition {condition.text!r}: {message}",
                edge,
                pos,
                typo,
            )


def condition_syntax(check: Check) -> Iterator[Diagnostic]:
    for index in sorted(check.bad_conditions):
        edge = check.graph.edges[index]
        text = edge.condition or ""
        try:
            parse_condition(text)
        except ConditionError as err:
            pos = check.value_position(edge.positions.get("condition"), err.offset)
            yield check.on_edge(
                "condition_syntax",
                ERROR,
                f"edge {edge.source} -> {edge.target}: bad condition {text!r}: {err.detail}",
                edge,
                pos,
            )


def _possible_outcomes(node: Node) -> list[str]:
    handler = node.handler_type
    if handler in (COMMAND, HUMAN):
        outcomes = ["succeeded", "failed"]
    elif handler in (START, EXIT, WAIT):
        outcomes = ["succeeded"]
    elif handler == PARALLEL:
        outcomes = ["succeeded", "partially_succeeded", "failed"]
    else:
        # Agents, prompts and everything else; a conditional node routes on the
        # outcome it was handed, which may be any of them.
        outcomes = list(STANDARD_OUTCOMES)
    if is_flag_set(node, "allow_partial") and "partially_succeeded" not in outcomes:
        outcomes.append("partially_succeeded")
    if is_flag_set(node, "auto_status"):
        outcomes = ["succeeded"] + (["skipped"] if "skipped" in outcomes else [])
    return outcomes


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _format_number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _candidate_values(conditions: list[Condition]) -> dict[str, list[str]]:
    """For each key the conditions read, values that exercise each comparison."""
    texts: dict[str, set[str]] = {}
    numbers: dict[str, set[float]] = {}
    for condition in conditions:
        for clause in condition.clauses():
            if clause.key == "outcome":
                continue
            key = clause.key
            if key.startswith("context."):
                key = key[len("context.") :]
            values = texts.setdefault(key, {""})
            if clause.op is None:
                values.add("true")
                continue
            number = (
                _number(clause.value) if clause.op in ("=", "!=", ">", "<", ">=", "<=") else None
            )
            if number is not None:
                numbers.setdefault(key, set()).add(number)
            values.add(clause.value)
    out: dict[str, list[str]] = {}
    for key, values in texts.items():
        points = sorted(numbers.get(key, set()))
        extra: set[float] = set()
        for low, high in itertools.pairwise(points):
            extra.add((low + high) / 2)
        if points:
            extra.add(points[0] - 1)
            extra.add(points[-1] + 1)
        values |= {_format_number(v) for v in extra}
        out[key] = sorted(values)
    return out


def _uncovered_case(node: Node, conditions: list[Condition]) -> str | None:
    """A description of a situation in which no condition holds, or None."""
    candidates = _candidate_values(conditions)
    preferred: set[str] = {""}
    for condition in conditions:
        for clause in condition.clauses():
            if clause.key == "preferred_label" and clause.op is not None:
                preferred.add(clause.value)
    candidates.pop("preferred_label", None)
    keys = sorted(candidates)
    outcomes = _possible_outcomes(node)
    total = len(outcomes) * len(preferred)
    for key in keys:
        total *= len(candidates[key])
    if total > _MAX_CASES:
        return "(too many combinations to prove that some edge always matches)"
    for outcome in outcomes:
        for label in sorted(preferred):
            for combo in itertools.product(*(candidates[key] for key in keys)):
                context = dict(zip(keys, combo, strict=True))
                if any(
                    c.evaluate(outcome=outcome, preferred_label=label, context=context)
                    for c in conditions
                ):
                    continue
                parts = [f"outcome={outcome}"]
                if label:
                    parts.append(f"preferred_label={label!r}")
                parts += [f"{k}={v!r}" for k, v in context.items()]
                return "when " + ", ".join(parts)
    return None


def all_conditional_edges(check: Check) -> Iterator[Diagnostic]:
    graph = check.graph
    for node_id, node in graph.nodes.items():
        indexes = graph.outgoing_indexes(node_id)
        if not indexes or node.handler_type == EXIT:
            continue
        if any(index not in check.conditions for index in indexes):
            # An unconditional edge is a fallback; a bad condition is reported elsewhere.
            continue
        case = _uncovered_case(node, [check.conditions[index] for index in indexes])
        if case is None:
            continue
        yield check.on_node(
            "all_conditional_edges",
            ERROR,
            f"every edge out of {node_id!r} has a condition and none matches {case}; "
            "add an edge without a condition as the fallback",
            node,
            check.node_pos(node),
        )


def orphan_custom_outcome(check: Check) -> Iterator[Diagnostic]:
    """A node that routes on an `outcome=` value no stage reports, with no unconditional
    edge: the run will never take that edge, and may find no edge at all."""
    graph = check.graph
    known = set(STANDARD_OUTCOMES) | {"retry"}
    for node in graph.nodes.values():
        indexes = graph.outgoing_indexes(node.id)
        if not indexes or any(graph.edges[i].condition is None for i in indexes):
            continue
        tested: list[tuple[Edge, int, str]] = []
        for index in indexes:
            condition = check.conditions.get(index)
            if condition is None:
                continue
            for clause in condition.clauses():
                if clause.key == "outcome" and clause.op == "=":
                    tested.append((graph.edges[index], clause.offset, clause.value))
        if not tested:
            continue
        custom = [(e, o, v) for e, o, v in tested if normalize_outcome(v) not in known]
        if not custom:
            continue
        edge, offset, _value = custom[0]
        names = sorted({v for _e, _o, v in custom})
        yield check.on_node(
            "orphan_custom_outcome",
            WARNING,
            f"{node.id!r} routes on outcome= conditions but has no unconditional edge to "
            f"fall back on when none matches; no stage reports {', '.join(map(repr, names))}",
            node,
            check.value_position(edge.positions.get("condition"), offset),
        )


def freeform_edge_count(check: Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.handler_type != HUMAN:
            continue
        freeform = [
            e
            for e in check.graph.outgoing(node.id)
            if parse_bool(e.attrs.get("freeform", "")) is True
        ]
        for edge in freeform[1:]:
            yield check.on_edge(
                "freeform_edge_count",
                ERROR,
                f"human gate {node.id!r} has {len(freeform)} freeform edges; it may have at most one",
                edge,
                check.edge_pos(edge, "freeform"),
            )


def random_selection_no_conditions(check: Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.attrs.get("selection", "").strip() != "random":
            continue
        for edge in check.graph.outgoing(node.id):
            if edge.condition is not None:
                yield check.on_edge(
                    "random_selection_no_conditions",
                    ERROR,
                    f"node {node.id!r} picks its edge at random, so edge {edge.source} -> "
                    f"{edge.target} cannot have a condition; use weights instead",
                    edge,
                    check.edge_pos(edge, "condition"),
                )
