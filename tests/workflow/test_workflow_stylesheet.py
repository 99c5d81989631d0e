"""Model stylesheets: selectors, specificity, aliases, and what happens when one is broken."""

from __future__ import annotations

import pytest

from fabro_git.workflow import Graph, parse
from fabro_git.workflow.stylesheet import StylesheetError, parse_stylesheet

SHEET = """
    *            { model: claude-haiku-4-5; reasoning_effort: low; }
    box          { reasoning_effort: high; }
    tab          { reasoning_effort: medium; }
    .coding      { model: claude-sonnet-4-5; }
    .review      { model: gemini-2.5-pro; speed: fast }
    #final_check { model: claude-opus-4-1; backend: cli; }
"""


def graph_with(sheet: str, body: str) -> Graph:
    escaped = sheet.replace('"', '\\"')
    return parse(f'digraph G {{ graph [model_stylesheet="{escaped}"] {body} }}')


def test_specificity_universal_shape_class_id() -> None:
    graph = graph_with(
        SHEET,
        "plain summary [shape=tab] impl [class=coding] "
        'final_check [class="coding review"] cmd [shape=parallelogram]',
    )
    attrs = {n.id: n.attrs for n in graph.nodes.values()}
    assert attrs["plain"]["model"] == "claude-haiku-4-5"
    assert attrs["plain"]["reasoning_effort"] == "high"
    assert attrs["summary"]["reasoning_effort"] == "medium"
    assert attrs["impl"]["model"] == "claude-sonnet-4-5"
    assert attrs["final_check"]["model"] == "claude-opus-4-1"
    assert attrs["final_check"]["speed"] == "fast"
    assert attrs["final_check"]["backend"] == "cli"
    assert attrs["cmd"]["reasoning_effort"] == "low"
    assert graph.nodes["impl"].styled == {"model", "reasoning_effort"}


def test_later_rule_wins_at_equal_specificity_regardless_of_order_of_kinds() -> None:
    graph = graph_with(
        "#n { model: a1; } .c { model: c1; } .c { model: c2; } #n { provider: p; }",
        "n [class=c] m [class=c]",
    )
    assert graph.nodes["n"].attrs["model"] == "a1"
    assert graph.nodes["n"].attrs["provider"] == "p"
    assert graph.nodes["m"].attrs["model"] == "c2"


def test_node_attributes_win_over_every_rule_including_defaults_blocks() -> None:
    graph = graph_with(
        "#a { model: from-sheet; reasoning_effort: low; }",
        'node [reasoning_effort=high] a [model="claude-opus-4-6"]',
    )
    assert graph.nodes["a"].attrs["model"] == "claude-opus-4-6"
    assert graph.nodes["a"].attrs["reasoning_effort"] == "high"
    assert graph.nodes["a"].styled == set()


def test_subgraph_label_class_is_targetable() -> None:
    graph = graph_with(
        ".loop-a { model: gpt-5.2; }",
        'subgraph cluster_l { label="Loop A" inside } outside',
    )
    assert graph.nodes["inside"].attrs["model"] == "gpt-5.2"
    assert "model" not in graph.nodes["outside"].attrs


def test_llm_aliases_in_sheet_and_on_nodes() -> None:
    graph = graph_with(
        "* { llm_model: claude-sonnet-4-5; llm_provider: anthropic; }",
        "a b [llm_model=gpt-5, llm_provider=openai]",
    )
    assert graph.nodes["a"].attrs["model"] == "claude-sonnet-4-5"
    assert graph.nodes["a"].attrs["provider"] == "anthropic"
    assert graph.nodes["b"].attrs["model"] == "gpt-5"
    assert graph.nodes["b"].attrs["provider"] == "openai"


def test_quoted_values_and_flexible_whitespace() -> None:
    sheet = parse_stylesheet("*{model:'x-1'}\n\n  #a\n{\n model : \"y 2\" ;\n}")
    assert [(r.kind, r.name) for r in sheet.rules] == [("*", ""), ("id", "a")]
    assert sheet.rules[1].declarations[0].value == "y 2"


def test_malformed_stylesheet_does_not_break_parsing() -> None:
    graph = graph_with("* { model claude }", "a")
    assert "model" not in graph.nodes["a"].attrs


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("* { model claude }", 1, 11, "expected ':' after 'model'"),
        ("* { colour: red; }", 1, 5, "unknown property 'colour'"),
        ("* model: x; }", 1, 3, "expected '{' after the selector"),
        ("\n  { model: x }", 2, 3, "expected a selector"),
        (". { model: x }", 1, 2, "expected a class name after '.'"),
        ("#a { model: x", 1, 1, "unterminated rule"),
        ("#a { model: ; }", 1, 13, "expected a value for 'model'"),
        ("* { model: x\n reasoning_effort: low }", 2, 2, "expected ';' or '}'"),
        ("* { model: 'x }", 1, 12, "unterminated quoted value"),
    ],
)
def test_stylesheet_errors_have_positions(text: str, line: int, column: int, fragment: str) -> None:
    with pytest.raises(StylesheetError) as info:
        parse_stylesheet(text)
    assert (info.value.line, info.value.column) == (line, column)
    assert fragment in info.value.detail


def test_empty_stylesheet_has_no_rules() -> None:
    assert parse_stylesheet("  \n ").rules == ()
