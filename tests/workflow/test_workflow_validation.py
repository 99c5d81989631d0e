"""Every lint rule: one workflow that triggers it (with position), one that must not."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabro_git.workflow import Diagnostic, Edge, has_errors, parse, validate
from fabro_git.workflow.validation import RULE_IDS

GOOD = """digraph Good {
    graph [goal="Do the thing"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    work  [label="Work", prompt="Do {{ goal }} for {{ inputs.who }}"]
    start -> work -> exit
}"""


def check(text: str, path: Path | None = None, **kwargs: object) -> list[Diagnostic]:
    return validate(parse(text, path), **kwargs)  # type: ignore[arg-type]


def only(diags: list[Diagnostic], rule: str) -> list[Diagnostic]:
    return [d for d in diags if d.rule == rule]


def wrap(body: str, graph_attrs: str = "") -> str:
    """A valid skeleton around `body`; `body` wires `start` and `exit` itself."""
    return (
        "digraph T {\n"
        f'graph [goal="g"{", " + graph_attrs if graph_attrs else ""}]\n'
        "start [shape=Mdiamond]\nexit [shape=Msquare]\n"
        f"{body}\n}}"
    )


def test_good_workflow_is_clean() -> None:
    assert check(GOOD) == []
    assert not has_errors(check(GOOD))


def test_rule_ids_are_unique_and_include_the_documented_set() -> None:
    assert len(set(RULE_IDS)) == len(RULE_IDS)
    documented = {
        "start_node", "terminal_node", "start_no_incoming", "exit_no_outgoing",
        "edge_target_exists", "condition_syntax", "stylesheet_syntax", "all_conditional_edges",
        "freeform_edge_count", "random_selection_no_conditions", "unresolved_file_ref",
        "template_variable", "reachability", "type_known", "fidelity_valid",
        "retry_target_exists", "goal_gate_has_retry", "prompt_on_llm_nodes",
        "orphan_custom_outcome", "thread_id_requires_fidelity_full", "stylesheet_model_known",
    }  # fmt: skip
    assert documented <= set(RULE_IDS)


# Structure ---------------------------------------------------------------------------------


def test_start_node_missing() -> None:
    diags = check("digraph T {\n  a -> exit\n  exit [shape=Msquare]\n}")
    (diag,) = only(diags, "start_node")
    assert diag.severity == "error"
    assert (diag.line, diag.column) == (1, 1)
    assert "no start node" in diag.message


def test_start_node_more_than_one() -> None:
    diags = check(wrap("begin [shape=Mdiamond]\nstart -> exit\nbegin -> exit"))
    (diag,) = only(diags, "start_node")
    assert diag.node_id == "begin"
    assert (diag.line, diag.column) == (5, 1)


def test_terminal_node_missing_and_more_than_one() -> None:
    (missing,) = only(check("digraph T { start -> a }"), "terminal_node")
    assert missing.severity == "error"
    diags = check(wrap("done [shape=Msquare]\nstart -> exit\nstart -> done"))
    (extra,) = only(diags, "terminal_node")
    assert extra.node_id == "done"
    assert "more than one exit node" in extra.message


def test_start_and_exit_by_id_count() -> None:
    assert only(check("digraph T { start -> end }"), "start_node") == []
    assert only(check("digraph T { start -> end }"), "terminal_node") == []


def test_start_no_incoming() -> None:
    diags = check(wrap("a [prompt=p]\nstart -> a -> exit\na -> start"))
    (diag,) = only(diags, "start_no_incoming")
    assert diag.edge == ("a", "start")
    assert (diag.line, diag.column) == (7, 1)
    assert diag.severity == "error"
    assert only(check(GOOD), "start_no_incoming") == []


def test_exit_no_outgoing() -> None:
    diags = check(wrap("a [prompt=p]\nstart -> a -> exit\nexit -> a"))
    (diag,) = only(diags, "exit_no_outgoing")
    assert diag.edge == ("exit", "a")
    assert diag.severity == "error"


def test_edge_target_exists_only_for_graphs_built_in_code() -> None:
    graph = parse(GOOD)
    assert only(validate(graph), "edge_target_exists") == []
    graph.edges.append(Edge("work", "ghost", line=9, column=3))
    (diag,) = only(validate(graph), "edge_target_exists")
    assert diag.edge == ("work", "ghost")
    assert (diag.severity, diag.line, diag.column) == ("error", 9, 3)


def test_reachability() -> None:
    diags = check(wrap("a [prompt=p]\nisland [prompt=p]\nstart -> a -> exit\nisland -> exit"))
    (diag,) = only(diags, "reachability")
    assert (diag.severity, diag.node_id, diag.line) == ("warning", "island", 6)
    assert only(check(GOOD), "reachability") == []


# Expressions ---------------------------------------------------------------------------------


def test_condition_syntax_points_into_the_condition() -> None:
    text = wrap('a [prompt=p]\nstart -> a\na -> exit [condition="outcome=succeeded &&"]\na -> exit')
    (diag,) = only(check(text), "condition_syntax")
    assert diag.severity == "error"
    assert diag.edge == ("a", "exit")
    # The quote is at column 22, so offset 20 (end of text) is column 43.
    assert (diag.line, diag.column) == (7, 43)
    assert "expected a key" in diag.message


def test_condition_syntax_position_across_escapes_and_continuations() -> None:
    text = wrap('a [prompt=p]\nstart -> a -> exit\na -> exit [condition="x=\\"q\\" \\\n  && ]"]')
    (diag,) = only(check(text), "condition_syntax")
    assert (diag.line, diag.column) == (8, 6)


def test_good_conditions_pass() -> None:
    text = wrap(
        'a [prompt=p]\nstart -> a\na -> exit [condition="outcome=succeeded && context.x > 3"]\na -> exit'
    )
    assert only(check(text), "condition_syntax") == []


def test_stylesheet_syntax_points_into_the_stylesheet() -> None:
    text = (
        'digraph T {\n  graph [model_stylesheet="\n    * { model: claude-haiku-4-5; }\n'
        '    .x { model gpt-5 }\n  "]\n  start -> exit\n}'
    )
    (diag,) = only(check(text), "stylesheet_syntax")
    assert diag.severity == "error"
    assert (diag.line, diag.column) == (4, 16)
    assert "expected ':'" in diag.message


def test_stylesheet_syntax_clean() -> None:
    text = wrap("start -> exit", 'model_stylesheet="* { model: gpt-5; }"')
    assert only(check(text), "stylesheet_syntax") == []


def test_template_variable_unknown_name_in_prompt_and_script() -> None:
    text = wrap(
        'a [prompt="Do {{ goal }} with {{ foo }}"]\n'
        'b [shape=parallelogram, script="echo {{ inputs.ok }} {{ bar.baz }}"]\n'
        "start -> a -> b -> exit"
    )
    diags = only(check(text), "template_variable")
    assert [(d.node_id, d.line, d.column) for d in diags] == [("a", 5, 31), ("b", 6, 54)]
    assert "{{ foo }}" in diags[0].message
    assert "{{ bar.baz }}" in diags[1].message
    assert all(d.severity == "error" for d in diags)


def test_template_variable_malformed_and_unsupported_tags() -> None:
    text = wrap(
        'a [prompt="{{ goal"]\nb [prompt="{% if goal %}x{% endif %}"]\nstart -> a -> b -> exit'
    )
    diags = only(check(text), "template_variable")
    assert {d.node_id for d in diags} == {"a", "b"}


def test_template_variable_goal_inputs_raw_and_legacy_are_fine() -> None:
    text = wrap(
        'a [prompt="{{ goal }} $goal {{ inputs.anything }} {% raw %}{{ x }}{% endraw %}"]\n'
        "start -> a -> exit"
    )
    assert only(check(text), "template_variable") == []


def test_template_variable_in_prompt_file(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text("Use {{ goal }} and {{ oops }}")
    text = wrap('a [prompt="@p.md"]\nstart -> a -> exit')
    (diag,) = only(check(text, tmp_path / "w.fabro"), "template_variable")
    assert "prompt file p.md" in diag.message and "{{ oops }}" in diag.message


def test_attribute_value() -> None:
    text = wrap(
        'a [prompt=p, max_visits=lots, timeout="5 parsecs", goal_gate=maybe]\n'
        "start -> a -> exit [weight=heavy]",
        'max_node_visits="twenty"',
    )
    diags = only(check(text), "attribute_value")
    assert sorted((d.line, d.message.split(":")[0]) for d in diags) == [
        (2, "graph attribute max_node_visits='twenty' is not an integer"),
        (5, "node 'a'"),
        (5, "node 'a'"),
        (5, "node 'a'"),
        (6, "edge a -> exit"),
        (6, "edge start -> a"),
    ]
    assert all(d.severity == "error" for d in diags)
    assert (
        only(
            check(wrap('a [prompt=p, max_visits=3, timeout="15m"]\nstart -> a -> exit')),
            "attribute_value",
        )
        == []
    )


# Routing ---------------------------------------------------------------------------------


def test_all_conditional_edges_reports_a_case_that_matches_nothing() -> None:
    text = wrap(
        "a [prompt=p]\nb [prompt=p]\nstart -> a\n"
        'a -> b [condition="outcome=succeeded"]\na -> exit [condition="outcome=failed"]\nb -> exit'
    )
    (diag,) = only(check(text), "all_conditional_edges")
    assert diag.severity == "error"
    assert (diag.node_id, diag.line) == ("a", 5)
    assert "outcome=partially_succeeded" in diag.message


def test_all_conditional_edges_accepts_complementary_conditions() -> None:
    text = wrap(
        "a [prompt=p]\nb [prompt=p]\nstart -> a\n"
        'a -> b [condition="outcome=success"]\na -> exit [condition="outcome!=success"]\nb -> exit'
    )
    assert only(check(text), "all_conditional_edges") == []


def test_all_conditional_edges_knows_command_outcomes() -> None:
    text = wrap(
        'a [shape=parallelogram, script="true"]\nstart -> a\n'
        'a -> exit [condition="outcome=succeeded"]\na -> start2 [condition="outcome=failed"]\n'
        "start2 [prompt=p]\nstart2 -> exit"
    )
    assert only(check(text), "all_conditional_edges") == []


def test_all_conditional_edges_context_thresholds() -> None:
    covered = wrap(
        "a [prompt=p]\nstart -> a\n"
        'a -> exit [condition="context.mode=fast"]\na -> exit [condition="mode!=fast"]'
    )
    assert only(check(covered), "all_conditional_edges") == []
    # A missing or non-numeric score satisfies neither comparison.
    numeric = wrap(
        "a [prompt=p]\nstart -> a\n"
        'a -> exit [condition="score >= 80"]\na -> exit [condition="score < 80"]'
    )
    (diag,) = only(check(numeric), "all_conditional_edges")
    assert "score=''" in diag.message
    gap = wrap(
        "a [prompt=p]\nstart -> a\n"
        'a -> exit [condition="context.score > 80"]\na -> exit [condition="context.score < 70"]'
    )
    (diag,) = only(check(gap), "all_conditional_edges")
    assert "score=" in diag.message


def test_all_conditional_edges_not_for_unconditional_fallback_or_human_labels() -> None:
    text = wrap(
        'a [prompt=p]\ngate [shape=hexagon]\nstart -> a -> gate\na -> exit [condition="outcome=failed"]\n'
        'gate -> exit [label="[A] Approve"]\ngate -> a [label="[R] Revise"]'
    )
    assert only(check(text), "all_conditional_edges") == []


def test_orphan_custom_outcome() -> None:
    text = wrap(
        "a [prompt=p]\nb [prompt=p]\nstart -> a\n"
        'a -> b [condition="outcome=passed"]\na -> exit [condition="outcome!=passed"]\nb -> exit'
    )
    diags = check(text)
    orphans = only(diags, "orphan_custom_outcome")
    # One per node, at its first outcome= clause, naming the value no stage reports.
    assert [(d.node_id, d.severity) for d in orphans] == [("a", "warning")]
    assert (orphans[0].line, orphans[0].column) == (8, 20)
    assert "'passed'" in orphans[0].message
    assert only(diags, "all_conditional_edges") == []


def test_no_orphan_custom_outcome_for_the_standard_pair() -> None:
    # Unlike Fabro, the success/failure pair does not warn: on a command it covers every
    # outcome, and where it does not (an agent may finish partially_succeeded),
    # all_conditional_edges says so, exactly, as an error.
    text = wrap(
        'c [shape=parallelogram, script="true"]\nstart -> c\n'
        'c -> exit [condition="outcome=success"]\nc -> exit [condition="outcome=fail"]'
    )
    diags = check(text)
    assert only(diags, "orphan_custom_outcome") == []
    assert only(diags, "all_conditional_edges") == []
    agent = wrap(
        "a [prompt=p]\nstart -> a\n"
        'a -> exit [condition="outcome=succeeded"]\na -> exit [condition="outcome=failed"]'
    )
    diags = check(agent)
    assert only(diags, "orphan_custom_outcome") == []
    assert [d.node_id for d in only(diags, "all_conditional_edges")] == ["a"]


def test_orphan_custom_outcome_not_with_a_fallback() -> None:
    with_fallback = wrap(
        'a [prompt=p]\nstart -> a\na -> exit [condition="outcome=passed"]\na -> exit'
    )
    assert only(check(with_fallback), "orphan_custom_outcome") == []


def test_freeform_edge_count() -> None:
    text = wrap(
        "gate [shape=hexagon]\nstart -> gate\ngate -> exit [freeform=true]\n"
        "gate -> start2 [freeform=true]\nstart2 [prompt=p]\nstart2 -> exit"
    )
    (diag,) = only(check(text), "freeform_edge_count")
    assert (diag.severity, diag.edge) == ("error", ("gate", "start2"))
    one = wrap(
        'gate [shape=hexagon]\nstart -> gate\ngate -> exit [freeform=true]\ngate -> exit [label="[A] OK"]'
    )
    assert only(check(one), "freeform_edge_count") == []


def test_random_selection_no_conditions() -> None:
    text = wrap(
        'pick [prompt=p, selection="random"]\nstart -> pick\n'
        'pick -> exit [weight=3]\npick -> exit [condition="outcome=failed"]'
    )
    (diag,) = only(check(text), "random_selection_no_conditions")
    assert diag.severity == "error"
    assert (diag.line, diag.column) == (8, 25)
    fine = wrap(
        'pick [prompt=p, selection="random"]\nstart -> pick\npick -> exit [weight=3]\npick -> exit'
    )
    assert only(check(fine), "random_selection_no_conditions") == []


def test_selection_valid() -> None:
    (diag,) = only(
        check(wrap('a [prompt=p, selection="sometimes"]\nstart -> a -> exit')), "selection_valid"
    )
    assert diag.severity == "warning"


def test_permissions_valid() -> None:
    (diag,) = only(
        check(wrap('a [prompt=p, permissions="read-mostly"]\nstart -> a -> exit')),
        "permissions_valid",
    )
    assert diag.severity == "error"
    assert "read-only, read-write, full" in diag.message
    for level in ("read-only", "read-write", "full"):
        fine = wrap(f'a [prompt=p, permissions="{level}"]\nstart -> a -> exit')
        assert only(check(fine), "permissions_valid") == []
        assert only(check(fine), "unknown_attribute") == []


# Nodes ---------------------------------------------------------------------------------


def test_type_known_for_type_and_shape() -> None:
    text = wrap('a [prompt=p, type="wizard"]\nb [prompt=p, shape=ellipse]\nstart -> a -> b -> exit')
    diags = only(check(text), "type_known")
    assert [(d.node_id, d.severity, d.line, d.column) for d in diags] == [
        ("a", "warning", 5, 19),
        ("b", "warning", 6, 20),
    ]
    aliases = wrap('a [prompt=p, type="codergen"]\nb [type="wait.human"]\nstart -> a -> b -> exit')
    assert only(check(aliases), "type_known") == []


def test_fidelity_valid() -> None:
    text = wrap(
        'a [prompt=p, fidelity="everything"]\nstart -> a -> exit [fidelity="summary:huge"]',
        'default_fidelity="loud"',
    )
    diags = only(check(text), "fidelity_valid")
    assert len(diags) == 4 and all(d.severity == "warning" for d in diags)
    ok = wrap(
        'a [prompt=p, fidelity="summary:high"]\nstart -> a -> exit', 'default_fidelity="compact"'
    )
    assert only(check(ok), "fidelity_valid") == []


def test_retry_target_exists() -> None:
    text = wrap(
        'a [prompt=p, retry_target="nowhere", fallback_retry_target="a"]\nstart -> a -> exit',
        'fallback_retry_target="gone"',
    )
    diags = only(check(text), "retry_target_exists")
    assert [(d.node_id, d.severity) for d in diags] == [(None, "warning"), ("a", "warning")]
    assert "nowhere" in diags[1].message


def test_goal_gate_has_retry() -> None:
    text = wrap("a [prompt=p, goal_gate=true]\nstart -> a -> exit")
    (diag,) = only(check(text), "goal_gate_has_retry")
    assert (diag.severity, diag.node_id, diag.line, diag.column) == ("warning", "a", 5, 24)
    node_level = wrap('a [prompt=p, goal_gate=true, retry_target="a"]\nstart -> a -> exit')
    graph_level = wrap("a [prompt=p, goal_gate=true]\nstart -> a -> exit", 'retry_target="a"')
    assert only(check(node_level), "goal_gate_has_retry") == []
    assert only(check(graph_level), "goal_gate_has_retry") == []


def test_prompt_on_llm_nodes() -> None:
    text = wrap(
        'a [label="Do work"]\nb [shape=tab]\nc [shape=parallelogram, script="x"]\nstart -> a -> b -> c -> exit'
    )
    diags = only(check(text), "prompt_on_llm_nodes")
    # A label is the instruction when there is no prompt, as in Fabro: only b warns.
    assert [(d.node_id, d.severity) for d in diags] == [("b", "warning")]
    assert "neither a prompt nor a label" in diags[0].message


def test_command_requires_script() -> None:
    (diag,) = only(
        check(wrap("c [shape=parallelogram]\nstart -> c -> exit")), "command_requires_script"
    )
    assert diag.severity == "error"


def test_unresolved_file_ref(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("hello")
    text = wrap('a [prompt="@there.md"]\nb [prompt="@missing/plan.md"]\nstart -> a -> b -> exit')
    diags = only(check(text, tmp_path / "w.fabro"), "unresolved_file_ref")
    assert [(d.node_id, d.severity, d.line, d.column) for d in diags] == [("b", "error", 6, 11)]
    assert "@missing/plan.md" in diags[0].message


def test_thread_id_requires_fidelity_full() -> None:
    text = wrap(
        'a [prompt=p, thread_id="t"]\nb [prompt=p, thread_id="t", fidelity="full"]\n'
        'start -> a -> b -> exit\na -> exit [thread_id="t", fidelity="compact"]\na -> exit'
    )
    diags = only(check(text), "thread_id_requires_fidelity_full")
    assert [(d.node_id, d.edge) for d in diags] == [("a", None), (None, ("a", "exit"))]
    assert all(d.severity == "warning" for d in diags)
    graph_default = wrap(
        'a [prompt=p, thread_id="t"]\nstart -> a -> exit', 'default_fidelity="full"'
    )
    assert only(check(graph_default), "thread_id_requires_fidelity_full") == []


def test_stylesheet_model_known() -> None:
    text = wrap(
        'a [prompt=p]\nb [prompt=p, model="gpt-9000"]\nc [prompt=p, llm_model=opus]\nstart -> a -> b -> c -> exit',
        'model_stylesheet="* { model: claude-sonnet-4-5; } #a { model: claude-sonet-4-5; }"',
    )
    diags = only(check(text), "stylesheet_model_known")
    assert [(d.node_id, d.line, d.column, d.severity) for d in diags] == [
        (None, 2, 80, "warning"),
        ("b", 6, 20, "warning"),
    ]
    assert "claude-sonet-4-5" in diags[0].message


def test_stylesheet_model_known_with_custom_catalogue() -> None:
    text = wrap('a [prompt=p, model="house-model"]\nstart -> a -> exit')
    assert only(check(text, known_models={"house-model"}), "stylesheet_model_known") == []
    assert only(check(text), "stylesheet_model_known") != []
    # Only catalogue ids and aliases are known; the provider goes in provider=.
    provider_qualified = wrap('a [prompt=p, model="openai/gpt-5"]\nstart -> a -> exit')
    assert len(only(check(provider_qualified), "stylesheet_model_known")) == 1
    alias = wrap('a [prompt=p, model="sonnet"]\nstart -> a -> exit')
    assert only(check(alias), "stylesheet_model_known") == []


def test_diagnostics_come_back_in_file_order() -> None:
    text = wrap('a [shape=tab]\nb [type="odd", prompt=p]\nstart -> a -> b -> exit')
    lines = [d.line or 0 for d in check(text)]
    assert lines == sorted(lines)


@pytest.mark.parametrize("severity", ["error", "warning"])
def test_has_errors(severity: str) -> None:
    diag = Diagnostic("x", severity, "m", None, None, None, None)
    assert has_errors([diag]) is (severity == "error")
