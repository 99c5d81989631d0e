"""Handler resolution and typed attribute access on the graph model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fabro_git.errors import WorkflowError
from fabro_git.workflow import Node, parse


@pytest.mark.parametrize(
    ("shape", "handler"),
    [
        ("Mdiamond", "start"),
        ("Msquare", "exit"),
        ("box", "agent"),
        ("tab", "prompt"),
        ("parallelogram", "command"),
        ("hexagon", "human"),
        ("diamond", "conditional"),
        ("component", "parallel"),
        ("tripleoctagon", "parallel.fan_in"),
        ("insulator", "wait"),
        ("house", "stack.manager_loop"),
        ("ellipse", "agent"),
    ],
)
def test_shape_decides_handler(shape: str, handler: str) -> None:
    node = parse(f"digraph G {{ n [shape={shape}] }}").nodes["n"]
    assert node.shape == shape
    assert node.handler_type == handler


def test_default_shape_is_box_and_agent() -> None:
    node = parse("digraph G { n }").nodes["n"]
    assert (node.shape, node.handler_type) == ("box", "agent")


@pytest.mark.parametrize(
    ("node_id", "handler"),
    [("start", "start"), ("Start", "start"), ("exit", "exit"), ("Exit", "exit"),
     ("end", "exit"), ("End", "exit"), ("START", "agent"), ("finish", "agent")],
)  # fmt: skip
def test_start_and_exit_by_id(node_id: str, handler: str) -> None:
    assert parse(f"digraph G {{ {node_id} }}").nodes[node_id].handler_type == handler


def test_id_rule_survives_a_box_default_but_not_another_shape() -> None:
    graph = parse("digraph G { node [shape=box] start end [shape=tab] }")
    assert graph.nodes["start"].handler_type == "start"
    assert graph.nodes["end"].handler_type == "prompt"


def test_explicit_type_wins_over_shape_and_id() -> None:
    graph = parse(
        'digraph G { start [type="agent"] a [shape=box, type="human"] '
        'b [type="wait.human"] c [type="codergen"] d [type="tool"] e [type="mystery"] }'
    )
    types = {n.id: n.handler_type for n in graph.nodes.values()}
    assert types == {
        "start": "agent", "a": "human", "b": "human", "c": "agent", "d": "command", "e": "mystery",
    }  # fmt: skip


def test_label_and_prompt_defaults() -> None:
    graph = parse('digraph G { a b [label="Bee", prompt="do it"] c [prompt=""] }')
    assert graph.nodes["a"].label == "a"
    assert graph.nodes["a"].prompt is None
    assert graph.nodes["b"].label == "Bee"
    assert graph.nodes["b"].prompt == "do it"
    assert graph.nodes["c"].prompt is None


def test_typed_accessors_and_defaults() -> None:
    graph = parse(
        'digraph G { n [count="7", neg=-2, ratio=0.25, flag=TRUE, off=no, t="90s", raw=500] }'
    )
    node = graph.nodes["n"]
    assert node.get("missing") is None
    assert node.get("missing", "x") == "x"
    assert node.get_int("count", 0) == 7
    assert node.get_int("neg", 0) == -2
    assert node.get_int("missing", 5) == 5
    assert node.get_float("ratio", 1.0) == 0.25
    assert node.get_bool("flag", False) is True
    assert node.get_bool("off", True) is False
    assert node.get_bool("missing", True) is True
    assert node.get_duration("t", None) == 90
    assert node.get_duration("raw", None) == 500
    assert node.get_duration("missing", None) is None
    assert node.get_duration("missing", 3.0) == 3.0


@pytest.mark.parametrize(
    ("attr", "call", "expected"),
    [
        ("x=abc", lambda n: n.get_int("x", 0), "is not an integer"),
        ("x=1.5", lambda n: n.get_int("x", 0), "is not an integer"),
        ("x=fast", lambda n: n.get_float("x", 0.0), "is not a number"),
        ("x=maybe", lambda n: n.get_bool("x", False), "is not a boolean"),
        ('x="5 parsecs"', lambda n: n.get_duration("x", None), "is not a duration"),
        ("x=10w", lambda n: n.get_duration("x", None), "is not a duration"),
    ],
)
def test_malformed_typed_values_raise_with_attribute_position(
    attr: str, call: Callable[[Node], object], expected: str
) -> None:
    graph = parse(f"digraph G {{\n  node1 [other=1,\n    {attr}]\n}}", Path("w.fabro"))
    with pytest.raises(WorkflowError) as info:
        call(graph.nodes["node1"])
    assert expected in info.value.detail
    assert "node 'node1'" in info.value.detail
    assert (info.value.path, info.value.line, info.value.column) == ("w.fabro", 3, 7)


def test_edge_properties() -> None:
    graph = parse(
        'digraph G { a -> b [label="Go", condition=" outcome=succeeded ", weight=4, '
        'loop_restart=true, freeform=false] a -> c [condition=""] }'
    )
    first, second = graph.edges
    assert first.label == "Go"
    assert first.condition == "outcome=succeeded"
    assert first.weight == 4
    assert first.loop_restart is True
    assert first.freeform is False
    assert second.label is None
    assert second.condition is None
    assert second.weight == 0


def test_edge_bad_weight_reports_edge_position() -> None:
    graph = parse("digraph G {\n a -> b [weight=heavy]\n}", Path("w.fabro"))
    with pytest.raises(WorkflowError) as info:
        _ = graph.edges[0].weight
    assert (info.value.line, info.value.column) == (2, 17)
    assert "edge a -> b" in info.value.detail


def test_graph_queries() -> None:
    graph = parse(
        'digraph G { graph [goal="g", stall_timeout="300", max_node_visits="20"] '
        "s [shape=Mdiamond] s -> a -> e1 a -> e2 e1 [shape=Msquare] e2 [shape=Msquare] }"
    )
    start = graph.start_node()
    assert start is not None and start.id == "s"
    assert [n.id for n in graph.exit_nodes()] == ["e1", "e2"]
    assert [(e.source, e.target) for e in graph.outgoing("a")] == [("a", "e1"), ("a", "e2")]
    assert [(e.source, e.target) for e in graph.incoming("a")] == [("s", "a")]
    assert graph.goal == "g"
    assert graph.get_duration("stall_timeout", None) == 300
    assert graph.get_int("max_node_visits", 0) == 20


def test_graph_without_start_or_goal() -> None:
    graph = parse("digraph G { a }")
    assert graph.start_node() is None
    assert graph.goal == ""
