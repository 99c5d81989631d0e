"""Lint rules: catch a broken workflow before a run spends time and tokens on it.

Each rule is a small function over the parsed graph that yields `Diagnostic`s with the
file position of the node, edge or attribute at fault. Errors stop `git fabro run`, and
so do typos (below); other warnings are printed and the run goes ahead.

Choices worth knowing:

- Edges create the nodes they name (as in Graphviz), so `edge_target_exists` can only
  fire for graphs built in code, not for parsed files.
- `all_conditional_edges` does not reject every node whose edges all carry conditions,
  only those where some run could find no edge to follow. It tries every outcome the
  node's handler can report, crossed with a handful of values per context key taken
  from the conditions themselves (and the values around numeric thresholds), and
  reports the first combination that matches no edge. `outcome=succeeded` beside
  `outcome!=succeeded` is therefore fine; `outcome=succeeded` beside `outcome=failed`
  on an agent is not, since an agent may also finish `partially_succeeded`.
- `orphan_custom_outcome` warns for a node that routes on an `outcome=` value no stage
  reports and has no unconditional edge. Fabro warns whatever the values, but for the
  standard success/failure pair that warning is noise on every run, teaching users to
  skip warnings: whether the values it names cover every outcome the node can report
  is `all_conditional_edges`' question, which it answers exactly (an error when not). `prompt_on_llm_nodes` accepts a label (it becomes the instruction), and
  `stylesheet_model_known` knows catalogue ids and aliases, nothing else.
- `endless_loop`, beyond the usual set, is an error for reachable stages from which no
  path reaches the exit or ends anywhere (nothing bounds a run by default, so one that
  gets there would go round for ever); a walk may end at a stage with no edge out, so an
  exit no path reaches is `reachability`'s warning, as any node is.
- A few rules beyond the usual set: `attribute_value` (a typed attribute that does not
  parse, a negative duration included, which would otherwise fail mid-run),
  `command_requires_script`, `script_template` (a template in a python script, where no substitution is safe, or
  in a here-document that expands nothing), `selection_valid` and `permissions_valid`.
- Warnings for typos, each with a "did you mean" from `fabro_git.suggest`:
  `implicit_node` (a node only an edge names, `test -> exti`), `unknown_attribute`
  (against the registry in workflow/attributes.py), `condition_typo` (`outcom=...`,
  `outcome=succeded`) and `dead_end` (a reachable stage with no way out). Those with a
  close known spelling (an attribute, shape, type or condition word) carry it as
  `Diagnostic.typo`, and `git fabro run` refuses them: a run that goes ahead ignores the
  attribute or makes the edge unconditional, and costs tokens without doing what was meant.
"""

from __future__ import annotations

from collections.abc import Iterator

from fabro_git.errors import WorkflowError
from fabro_git.workflow.lint_attributes import (
    attribute_value,
    command_requires_script,
    fidelity_valid,
    goal_gate_has_retry,
    permissions_valid,
    prompt_on_llm_nodes,
    retry_target_exists,
    script_template,
    selection_valid,
    stylesheet_model_known,
    stylesheet_syntax,
    template_variable,
    thread_id_requires_fidelity_full,
    type_known,
    unknown_attribute,
)
from fabro_git.workflow.lint_check import (
    EDGE_BOOLS,
    EDGE_INTS,
    ERROR,
    GRAPH_DURATIONS,
    GRAPH_INTS,
    NODE_BOOLS,
    NODE_DURATIONS,
    NODE_INTS,
    WARNING,
    Check,
    Diagnostic,
    Rule,
    has_errors,
    typos,
)
from fabro_git.workflow.lint_routing import (
    all_conditional_edges,
    condition_syntax,
    condition_typo,
    freeform_edge_count,
    orphan_custom_outcome,
    random_selection_no_conditions,
)
from fabro_git.workflow.lint_structure import (
    dead_end,
    edge_target_exists,
    endless_loop,
    exit_no_outgoing,
    implicit_node,
    node_id_valid,
    parallel_join,
    path_inside_repository,
    reachability,
    start_no_incoming,
    start_node,
    terminal_node,
    unresolved_file_ref,
)
from fabro_git.workflow.model import (
    MANAGER_LOOP,
    Graph,
    collector_paused,
)
from fabro_git.workflow.paths import (
    CHILD_SOURCE,
    CHILD_WORKFLOW,
    PathRefused,
    child_graph,
    origin_for,
)

__all__ = [
    "EDGE_BOOLS",
    "EDGE_INTS",
    "GRAPH_DURATIONS",
    "GRAPH_INTS",
    "NODE_BOOLS",
    "NODE_DURATIONS",
    "NODE_INTS",
    "RULES",
    "RULE_IDS",
    "Diagnostic",
    "has_errors",
    "typos",
    "validate",
]


def child_workflow(check: Check) -> Iterator[Diagnostic]:
    """A sub-workflow's child must exist, parse and validate, and not include itself;
    its errors and warnings are reported at the parent's attribute, each naming its
    place in the child."""
    graph = check.graph
    origin = origin_for(graph)
    for node in graph.nodes.values():
        if node.handler_type != MANAGER_LOOP:
            continue
        key = CHILD_SOURCE if node.attrs.get(CHILD_SOURCE) else CHILD_WORKFLOW
        pos = check.node_pos(node, key)
        ref = (node.attrs.get(CHILD_WORKFLOW) or "").strip()
        if key == CHILD_WORKFLOW and ref:
            try:
                origin.resolve(ref)
            except PathRefused:
                continue  # path_inside_repository reports it
        try:
            child = child_graph(graph, node)
        except WorkflowError as err:
            yield check.on_node("child_workflow", ERROR, err.detail, node, pos)
            continue
        assert child.origin is not None
        memo = child.origin.memo
        memo_key = child.origin.relpath if key == CHILD_WORKFLOW else None
        if memo_key is not None and memo_key in memo:
            problems = memo[memo_key]
        else:
            problems = [
                d
                for d in validate(child, known_models=check.known_models)
                if d.severity in (ERROR, WARNING)
            ]
            if memo_key is not None:
                memo[memo_key] = problems
        what = f"child workflow {ref!r}" if key == CHILD_WORKFLOW else CHILD_SOURCE
        # An inline child's positions count from the start of the attribute's value.
        file = str(child.path) if key == CHILD_WORKFLOW else "inline"
        for problem in problems:
            where = ":".join(str(p) for p in (file, problem.line, problem.column) if p is not None)
            yield check.on_node(
                "child_workflow",
                problem.severity,
                f"node {node.id!r}: {what}: {where}: [{problem.rule}] {problem.message}",
                node,
                pos,
                problem.typo,
            )


RULES: tuple[Rule, ...] = (
    start_node,
    terminal_node,
    start_no_incoming,
    exit_no_outgoing,
    edge_target_exists,
    reachability,
    endless_loop,
    implicit_node,
    dead_end,
    parallel_join,
    node_id_valid,
    condition_syntax,
    stylesheet_syntax,
    template_variable,
    attribute_value,
    unknown_attribute,
    condition_typo,
    all_conditional_edges,
    orphan_custom_outcome,
    freeform_edge_count,
    random_selection_no_conditions,
    selection_valid,
    permissions_valid,
    type_known,
    fidelity_valid,
    retry_target_exists,
    goal_gate_has_retry,
    prompt_on_llm_nodes,
    command_requires_script,
    script_template,
    unresolved_file_ref,
    thread_id_requires_fidelity_full,
    stylesheet_model_known,
    path_inside_repository,
    child_workflow,
)


RULE_IDS: tuple[str, ...] = tuple(rule.__name__.lstrip("_") for rule in RULES)


def validate(
    graph: Graph, *, known_models: set[str] | frozenset[str] | None = None
) -> list[Diagnostic]:
    """Run every rule over `graph`; diagnostics come back in file order.

    `known_models` replaces the built-in catalogue for `stylesheet_model_known`.
    """
    out: list[Diagnostic] = []
    with collector_paused():
        check = Check(graph, known_models)
        for rule in RULES:
            out.extend(rule(check))
    out.sort(key=lambda d: (d.line or 0, d.column or 0))
    return out
