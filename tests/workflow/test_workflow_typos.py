"""Warnings that catch typos (implicit_node, unknown_attribute, condition_typo, dead_end),
the rules that follow Fabro's validator, and the warnings every shipped or documented
workflow gets."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import ROOT

from fabro_git.workflow import Diagnostic, load, parse, validate
from fabro_git.workflow import attributes as registry
from fabro_git.workflow.validation import RULE_IDS

FIXTURES = ROOT / "tests" / "fixtures" / "reference_workflows"
EXAMPLES = ROOT / "fabro_git" / "examples"
PACKAGE = ROOT / "fabro_git"


def check(text: str, path: Path | None = None) -> list[Diagnostic]:
    return validate(parse(text, path))


def only(diags: list[Diagnostic], rule: str) -> list[Diagnostic]:
    return [d for d in diags if d.rule == rule]


def wrap(body: str, graph_attrs: str = "") -> str:
    return (
        "digraph T {\n"
        f'graph [goal="g"{", " + graph_attrs if graph_attrs else ""}]\n'
        "start [shape=Mdiamond]\nexit [shape=Msquare]\n"
        f"{body}\n}}"
    )


def test_new_rule_ids_are_registered() -> None:
    assert {"implicit_node", "unknown_attribute", "condition_typo", "dead_end"} <= set(RULE_IDS)


# implicit_node ------------------------------------------------------------------------


def test_misspelt_edge_target_is_an_implicit_node_with_a_suggestion(tmp_path: Path) -> None:
    text = wrap('test [shape=parallelogram, script="true"]\nstart -> test\ntest -> exti')
    diags = check(text, tmp_path / "w.fabro")
    (diag,) = only(diags, "implicit_node")
    assert (diag.node_id, diag.severity, diag.line, diag.column) == ("exti", "warning", 7, 9)
    assert f"edge test -> exti at {tmp_path / 'w.fabro'}:7:1" in diag.message
    assert "did you mean 'exit'?" in diag.message
    # The typo is the one problem: no dead_end on top of it.
    assert only(diags, "dead_end") == []


def test_implicit_node_without_a_close_name_says_how_to_declare_it() -> None:
    diags = check(wrap("start -> review -> exit"))
    (diag,) = only(diags, "implicit_node")
    assert diag.node_id == "review"
    assert "did you mean" not in diag.message
    assert 'review [prompt="..."]' in diag.message


def test_implicit_start_exit_and_declared_nodes_are_not_reported() -> None:
    # start and exit made by the edge, `a` declared after the edge names it.
    text = "digraph T {\n  start -> a -> exit\n  a [prompt=p]\n}"
    assert only(check(text), "implicit_node") == []


def test_a_drawing_default_does_not_hide_an_implicit_node_but_a_prompt_does() -> None:
    drawn = wrap('node [fontname="Helvetica", shape=box]\nstart -> exti')
    assert [d.node_id for d in only(check(drawn), "implicit_node")] == ["exti"]
    prompted = wrap('node [prompt="Do the step"]\nstart -> step -> exit')
    assert only(check(prompted), "implicit_node") == []


# unknown_attribute ------------------------------------------------------------------------


def test_unknown_attributes_on_nodes_edges_and_the_graph() -> None:
    text = wrap(
        'build [shape=parallelogram, scrpt="make"]\n'
        'review [prompt=p, condition="x"]\n'
        "start -> build -> review\n"
        'review -> exit [wieght=2, color="red"]',
        "rankdr=LR",
    )
    diags = only(check(text), "unknown_attribute")
    # Each at the attribute's name.
    found = [(d.line, d.column, d.node_id, d.edge) for d in diags]
    assert found == [
        (2, 18, None, None),
        (5, 29, "build", None),
        (6, 19, "review", None),
        (8, 17, None, ("review", "exit")),
    ]
    assert all(d.severity == "warning" for d in diags)
    assert "did you mean 'rankdir'" in diags[0].message
    assert "'scrpt'" in diags[1].message and "did you mean 'script'?" in diags[1].message
    assert "read on edges, not on nodes" in diags[2].message
    assert "did you mean 'weight'?" in diags[3].message


def test_a_misspelt_attribute_of_another_kind_is_named_as_such() -> None:
    text = wrap("start -> exit [human.defualt_choice=x]\nexit [promt=p]", "prompt=x")
    messages = [d.message for d in only(check(text), "unknown_attribute")]
    assert messages == [
        "unknown graph attribute 'prompt': it is read on nodes, not on the graph",
        "edge start -> exit: unknown attribute 'human.defualt_choice': nothing reads it; "
        "did you mean 'human.default_choice', a node attribute?",
        "node 'exit': unknown attribute 'promt': nothing reads it; did you mean 'prompt'?",
    ]


def test_subgraph_attributes_are_graphvizs() -> None:
    text = wrap(
        'subgraph cluster_a {\n  label="Loop A"; style=dashed; lable="x"; goal="g"\n  a [prompt=p]\n}\n'
        "start -> a -> exit"
    )
    diags = only(check(text), "unknown_attribute")
    assert [(d.line, d.column) for d in diags] == [(6, 33), (6, 44)]
    assert "did you mean 'label'?" in diags[0].message
    assert "only Graphviz reads a subgraph's attributes" in diags[1].message


def test_a_node_default_is_reported_once_at_its_own_position() -> None:
    text = wrap("node [promt=p]\na\nb\nstart -> a -> b -> exit")
    diags = only(check(text), "unknown_attribute")
    assert [(d.line, d.column) for d in diags] == [(5, 7)]


def test_stylesheet_values_and_graph_attributes_read_by_conditions_are_known() -> None:
    text = wrap(
        'a [prompt=p, class="fast"]\nstart -> a\n'
        'a -> exit [condition="context.graph.mode=quick"]\na -> exit',
        'mode="quick", model_stylesheet=".fast { model: haiku; reasoning_effort: low; }"',
    )
    assert only(check(text), "unknown_attribute") == []
    unread = wrap("start -> exit", 'mode="quick"')
    assert len(only(check(unread), "unknown_attribute")) == 1


def _literal_reads(sources: list[str]) -> set[tuple[str, str]]:
    """(kind, attribute) for every attribute the package reads or writes by a literal name:
    `node.get("x")`, `edge.attrs.get("x")`, `graph.get_int("x", 0)`, `node.attrs["x"]`,
    and `self.attrs.get("x")` inside Node, Edge and Graph."""
    receivers = {
        "node": "node", "gate": "node", "n": "node", "target": "node", "child": "node",
        "edge": "edge", "e": "edge", "graph": "graph",
    }  # fmt: skip
    getters = {"get", "get_int", "get_float", "get_bool", "get_duration"}
    found: set[tuple[str, str]] = set()

    def owner_kind(owner: ast.expr, cls: str | None) -> str | None:
        if isinstance(owner, ast.Name) and owner.id == "self":
            return cls.lower() if cls in ("Node", "Edge", "Graph") else None
        name = ast.unparse(owner).rsplit(".", 1)[-1]
        return receivers.get(name)

    def visit(tree: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(tree):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
                continue
            key: str | None = None
            kind: str | None = None
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr in getters
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                key = child.args[0].value
                receiver = child.func.value
                if isinstance(receiver, ast.Attribute) and receiver.attr == "attrs":
                    receiver = receiver.value
                # Only receivers named like a node, edge or graph: not any dict's get.
                kind = owner_kind(receiver, cls)
            elif (
                isinstance(child, ast.Subscript)
                and isinstance(child.value, ast.Attribute)
                and child.value.attr == "attrs"
                and isinstance(child.slice, ast.Constant)
                and isinstance(child.slice.value, str)
            ):
                key = child.slice.value
                kind = owner_kind(child.value.value, cls)
            if key is not None and kind is not None:
                found.add((kind, key))
            visit(child, cls)

    for source in sources:
        visit(ast.parse(source), None)
    return found


def _package_sources() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_attribute_the_code_reads_is_registered() -> None:
    from fabro_git.engine.templating import RENDERED_NODE_ATTRS
    from fabro_git.workflow import stylesheet, validation
    from fabro_git.workflow.paths import CHILD_SOURCE, CHILD_WORKFLOW

    reads = _literal_reads(_package_sources())
    # The scan must see the reads it exists to check, or it proves nothing.
    assert len(reads) >= 40, sorted(reads)
    assert {("node", "script"), ("edge", "condition"), ("graph", "stall_timeout")} <= reads
    named: set[tuple[str, str]] = set(reads)
    named |= {("node", key) for key in RENDERED_NODE_ATTRS}
    named |= {("node", key) for key in (CHILD_SOURCE, CHILD_WORKFLOW)}
    named |= {("node", key) for key in stylesheet.PROPERTIES}
    named |= {("node", key) for key in stylesheet.ALIASES}
    for kind, keys in (
        ("node", validation.NODE_INTS + validation.NODE_BOOLS + validation.NODE_DURATIONS),
        ("edge", validation.EDGE_INTS + validation.EDGE_BOOLS),
        ("graph", validation.GRAPH_INTS + validation.GRAPH_DURATIONS),
    ):
        named |= {(kind, key) for key in keys}
    missing = sorted((kind, key) for kind, key in named if key not in registry.KNOWN[kind])
    assert missing == [], f"register these in fabro_git/workflow/attributes.py: {missing}"


def test_the_scan_finds_a_new_read_and_ignores_other_dicts() -> None:
    # The scanner is what makes the registry test fail; show that it would.
    source = (
        "def f(req, record):\n"
        '    a = req.node.get_duration("brand_new_timeout", None)\n'
        '    b = req.graph.attrs.get("brand_new_graph_key")\n'
        '    c = record.get("status")\n'
        "class Edge:\n"
        "    def g(self):\n"
        '        return self.attrs["brand_new_edge_key"]\n'
    )
    assert _literal_reads([source]) == {
        ("node", "brand_new_timeout"),
        ("graph", "brand_new_graph_key"),
        ("edge", "brand_new_edge_key"),
    }
    assert "brand_new_timeout" not in registry.NODE_ATTRIBUTES


# condition_typo ----------------------------------------------------------------------------


def test_misspelt_condition_keys_and_outcome_values() -> None:
    text = wrap(
        "a [prompt=p]\nstart -> a\n"
        'a -> exit [condition="outcom=succeeded"]\n'
        'a -> exit [condition="preferred_lable=Yes"]\n'
        'a -> exit [condition="outcome=succeded"]\n'
        "a -> exit"
    )
    diags = only(check(text), "condition_typo")
    assert [(d.edge, d.line, d.column) for d in diags] == [
        (("a", "exit"), 7, 23),
        (("a", "exit"), 8, 23),
        (("a", "exit"), 9, 23),
    ]
    assert "did you mean 'outcome'?" in diags[0].message
    assert "did you mean 'preferred_label'?" in diags[1].message
    assert "did you mean 'succeeded'?" in diags[2].message


def test_condition_keys_that_are_meant_are_not_typos() -> None:
    text = wrap(
        'a [prompt="Set outcomes in context_updates"]\nstart -> a\n'
        'a -> exit [condition="outcomes=3"]\n'  # the prompt names it
        'a -> exit [condition="context.outcom=1"]\n'  # explicitly a context key
        'a -> exit [condition="tests_passed=true && outcome=success"]\n'
        'a -> exit [condition="outcome=passed"]\n'  # far from any outcome: not a typo
        "a -> exit"
    )
    assert only(check(text), "condition_typo") == []


# dead_end ---------------------------------------------------------------------------------


def test_dead_end_on_a_reachable_node_with_no_way_out() -> None:
    text = wrap("a [prompt=p]\nb [prompt=p]\nstart -> a -> exit\na -> b")
    (diag,) = only(check(text), "dead_end")
    assert (diag.node_id, diag.severity, diag.line) == ("b", "warning", 6)
    assert "b -> exit" in diag.message


def test_no_dead_end_for_the_exit_unreachable_nodes_or_fragments() -> None:
    unreachable = wrap("a [prompt=p]\nlost [prompt=p]\nstart -> a -> exit")
    diags = check(unreachable)
    assert only(diags, "dead_end") == []
    assert [d.node_id for d in only(diags, "reachability")] == ["lost"]
    fragment = 'digraph F {\n  fix [prompt="Fix it"]\n}'
    assert only(check(fragment), "dead_end") == []


def test_parallel_branches_that_meet_at_a_fan_in_are_not_dead_ends() -> None:
    text = wrap(
        "fan [shape=component]\nx [prompt=p]\ny [prompt=p]\nmerge [shape=tripleoctagon]\n"
        "start -> fan\nfan -> x -> merge\nfan -> y -> merge\nmerge -> exit"
    )
    assert only(check(text), "dead_end") == []
    no_fan_in = wrap("fan [shape=component]\nx [prompt=p]\nstart -> fan -> x\nfan -> exit")
    assert [d.node_id for d in only(check(no_fan_in), "dead_end")] == ["x"]


# Rules as Fabro has them --------------------------------------------------------------------


def test_prompt_on_llm_nodes_accepts_a_label() -> None:
    text = wrap('a [label="Plan the work"]\nb [shape=tab]\nstart -> a -> b -> exit')
    assert [d.node_id for d in only(check(text), "prompt_on_llm_nodes")] == ["b"]


def test_unknown_model_gets_a_suggestion_and_aliases_are_known() -> None:
    text = wrap(
        'a [prompt=p, model="claude-sonet-4-5"]\nb [prompt=p, model=opus]\nstart -> a -> b -> exit'
    )
    (diag,) = only(check(text), "stylesheet_model_known")
    assert diag.node_id == "a"
    assert "did you mean 'claude-sonnet-4-5'" in diag.message


def test_child_workflow_warnings_reach_the_parent(tmp_path: Path) -> None:
    (tmp_path / "child.fabro").write_text(
        "digraph C {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  start -> exti\n}\n"
    )
    parent = tmp_path / "parent.fabro"
    parent.write_text(
        wrap('sub [shape=house, stack.child_workflow="child.fabro"]\nstart -> sub -> exit')
    )
    diags = only(validate(load(parent)), "child_workflow")
    assert diags, "the child's warnings are not reported"
    assert all(d.severity == "warning" and d.node_id == "sub" for d in diags)
    messages = " ".join(d.message for d in diags)
    assert f"{tmp_path / 'child.fabro'}:4:12: [implicit_node]" in messages
    assert "did you mean 'exit'?" in messages


# Shipped examples and the reference documents' workflows --------------------------------------

# (line, rule) of every warning each workflow gets; errors are in
# test_workflow_reference_docs.py. A change here is a change users see.
EXPECTED_WARNINGS: dict[str, list[tuple[int, str]]] = {
    "attractor-spec-1": [],
    # gate routes on outcome=success / outcome!=success with no unconditional edge:
    # covered, so no warning (Fabro warns).
    "attractor-spec-2": [],
    # ship_it and fixes are named only by edges: agents with no prompt or label.
    "attractor-spec-3": [
        (14, "implicit_node"),
        (14, "prompt_on_llm_nodes"),
        (15, "implicit_node"),
        (15, "prompt_on_llm_nodes"),
    ],
    "attractor-spec-4": [],
    "attractor-spec-5": [(6, "goal_gate_has_retry")],
    "fabro-agents-prompts-1": [],
    "fabro-core-concepts-models-1": [],
    "fabro-core-concepts-workflows-1": [],
    "fabro-execution-context-1": [],
    "fabro-execution-failures-1": [],
    "fabro-execution-failures-2": [(3, "prompt_on_llm_nodes")],
    "fabro-execution-failures-3": [
        (2, "retry_target_exists"),
        (3, "prompt_on_llm_nodes"),
        (3, "retry_target_exists"),
    ],
    "fabro-execution-failures-4": [],
    "fabro-execution-run-configuration-1": [],
    "fabro-reference-dot-language-1": [],
    "fabro-reference-dot-language-2": [],
    "fabro-workflows-stylesheets-1": [],
    "fabro-workflows-variables-1": [],
    "fabro-workflows-variables-2": [],
    "branch-loop": [],
    "hello": [],
    "human-gate": [],
    "parallel-review": [],
    "plan-implement-review": [],
}

WORKFLOWS = sorted(FIXTURES.glob("*.fabro")) + sorted(EXAMPLES.glob("*.fabro"))


def test_every_workflow_has_an_expectation() -> None:
    assert sorted(p.stem for p in WORKFLOWS) == sorted(EXPECTED_WARNINGS)
    # No documented or shipped workflow may use an attribute we do not know: such a
    # warning is never an expectation to record here.
    assert not [
        name
        for name, found in EXPECTED_WARNINGS.items()
        if "unknown_attribute" in {rule for _line, rule in found}
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_reference_and_example_warnings(path: Path) -> None:
    warnings = [(d.line, d.rule) for d in validate(load(path)) if d.severity == "warning"]
    assert warnings == EXPECTED_WARNINGS[path.stem]


def test_misspelt_types_shapes_and_retry_targets_get_suggestions() -> None:
    text = wrap(
        "implement [prompt=p, type=comand, retry_target=implemnt]\n"
        "b [shape=paralelogram, script=x]\nc [shape=circle, prompt=p]\n"
        "start -> implement -> b -> c -> exit"
    )
    diags = check(text)
    types = [d.message for d in only(diags, "type_known")]
    assert "unknown type 'comand'; did you mean 'command'? known types are" in types[0]
    assert "did you mean 'parallelogram'?" in types[1]
    assert "did you mean" not in types[2] and "'circle' has no handler" in types[2]
    (target,) = only(diags, "retry_target_exists")
    assert target.message.endswith("names no node; did you mean 'implement'?")
