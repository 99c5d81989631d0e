"""The DOT subset: every statement and value form, and errors that point at the mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabro_git.errors import WorkflowError
from fabro_git.workflow import Graph, load, parse
from fabro_git.workflow.parser import class_from_label


def parse_error(text: str) -> WorkflowError:
    with pytest.raises(WorkflowError) as info:
        parse(text, Path("wf.fabro"))
    return info.value


def edges(graph: Graph) -> list[tuple[str, str]]:
    return [(e.source, e.target) for e in graph.edges]


def test_minimal_graph_keeps_name_nodes_and_declaration_order() -> None:
    graph = parse("digraph Simple { start -> plan -> exit }")
    assert graph.name == "Simple"
    assert list(graph.nodes) == ["start", "plan", "exit"]
    assert edges(graph) == [("start", "plan"), ("plan", "exit")]


def test_graph_attributes_from_block_and_declarations() -> None:
    graph = parse(
        """digraph G {
            graph [goal="Ship it", default_max_retries=2]
            rankdir=LR
            label = "Title";
            a
        }"""
    )
    assert graph.attrs == {
        "goal": "Ship it",
        "default_max_retries": "2",
        "rankdir": "LR",
        "label": "Title",
    }
    assert graph.goal == "Ship it"
    assert graph.get_int("default_max_retries", 0) == 2
    assert graph.positions["rankdir"] == (3, 21)


def test_chained_edges_share_attributes() -> None:
    graph = parse('digraph G { a -> b -> c [label="next", weight=3] }')
    assert edges(graph) == [("a", "b"), ("b", "c")]
    assert all(e.attrs == {"label": "next", "weight": "3"} for e in graph.edges)
    assert graph.edges[1].column == 18  # the `b` that starts the second pair


def test_node_defaults_apply_to_later_nodes_and_explicit_attributes_win() -> None:
    graph = parse(
        """digraph G {
            early
            node [shape=box, timeout="900s"]
            a
            b [timeout="30s"]
        }"""
    )
    assert "timeout" not in graph.nodes["early"].attrs
    assert graph.nodes["a"].attrs == {"shape": "box", "timeout": "900s"}
    assert graph.nodes["b"].attrs["timeout"] == "30s"


def test_nodes_created_by_edges_get_current_defaults() -> None:
    graph = parse("digraph G { node [timeout=5m] a -> b }")
    assert graph.nodes["b"].attrs == {"timeout": "5m"}
    assert graph.nodes["b"].declared is False


def test_edge_defaults_apply_to_later_edges() -> None:
    graph = parse("digraph G { a -> b edge [weight=5] b -> c c -> d [weight=1] }")
    assert [e.attrs.get("weight") for e in graph.edges] == [None, "5", "1"]


def test_defaults_inside_subgraph_do_not_leak_out() -> None:
    graph = parse(
        """digraph G {
            node [timeout="1m"]
            subgraph cluster_a {
                node [thread_id="loop", timeout="2m"]
                edge [weight=9]
                inner1 -> inner2
            }
            outer1 -> outer2
        }"""
    )
    assert graph.nodes["inner1"].attrs == {"timeout": "2m", "thread_id": "loop"}
    assert graph.nodes["outer1"].attrs == {"timeout": "1m"}
    assert graph.edges[0].attrs == {"weight": "9"}
    assert graph.edges[1].attrs == {}


def test_subgraph_label_becomes_class_on_its_nodes_including_nested() -> None:
    graph = parse(
        """digraph G {
            before
            subgraph cluster_loop {
                label = "Loop A"
                plan [class="planning"]
                subgraph inner { graph [label="Deep Work!"] implement }
            }
            before -> plan
            after
        }"""
    )
    assert graph.nodes["plan"].classes == ["planning", "loop-a"]
    assert graph.nodes["implement"].classes == ["deep-work", "loop-a"]
    assert graph.nodes["before"].classes == []
    assert graph.nodes["after"].classes == []
    assert graph.subgraphs[0].label == "Loop A"
    assert graph.subgraphs[0].node_ids == ["plan", "implement"]
    assert graph.subgraphs[0].children[0].node_ids == ["implement"]
    # A subgraph's label is not the workflow's.
    assert "label" not in graph.attrs


def test_class_attribute_accepts_commas_and_spaces() -> None:
    graph = parse('digraph G { a [class="code,critical"] b [class="x y, z"] }')
    assert graph.nodes["a"].classes == ["code", "critical"]
    assert graph.nodes["b"].classes == ["x", "y", "z"]


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("Loop A", "loop-a"),
        ("Implementation", "implementation"),
        ("  Code & Review ", "code--review"),
    ],
)
def test_class_from_label(label: str, expected: str) -> None:
    assert class_from_label(label) == expected


def test_anonymous_blocks_and_subgraph_edge_endpoints() -> None:
    graph = parse("digraph G { { rank=same; a; b } start -> { x y } -> done }")
    assert list(graph.nodes) == ["a", "b", "start", "x", "y", "done"]
    assert edges(graph) == [("start", "x"), ("start", "y"), ("x", "done"), ("y", "done")]


def test_string_escapes_and_line_continuations() -> None:
    graph = parse(
        'digraph G { a [prompt="say \\"hi\\"\\\\ then\\nnext\\tcol \\d+", label="one \\\n   two"] }'
    )
    assert graph.nodes["a"].attrs["prompt"] == 'say "hi"\\ then\nnext\tcol \\d+'
    assert graph.nodes["a"].attrs["label"] == "one    two"


def test_string_concatenation_with_plus() -> None:
    graph = parse('digraph G { a [prompt="first " + "second"] }')
    assert graph.nodes["a"].prompt == "first second"


def test_multiline_attribute_lists_with_commas_semicolons_or_nothing() -> None:
    graph = parse(
        """digraph G {
            a [
                shape=box,
                label="A";
                prompt="p"
                max_visits=3
            ]
            b [x=1][y=2]
        }"""
    )
    assert graph.nodes["a"].attrs == {
        "shape": "box",
        "label": "A",
        "prompt": "p",
        "max_visits": "3",
    }
    assert graph.nodes["b"].attrs == {"x": "1", "y": "2"}


def test_comments_of_every_kind_and_inside_strings() -> None:
    graph = parse(
        """// leading
# preprocessor-style line
digraph G { /* block
   comment */ a [label="not // a comment /* here */"] // trailing
    # also a comment
    a -> b  /* between */ -> c
}"""
    )
    assert graph.nodes["a"].label == "not // a comment /* here */"
    assert edges(graph) == [("a", "b"), ("b", "c")]


def test_value_forms_numbers_durations_booleans_and_bare_words() -> None:
    graph = parse(
        """digraph G {
            n [a=42, b=-1, c=3.14, d=-0.5, e=.5, f=true, g=250ms, h=15m, i=1d,
               model=claude-sonnet-4-5, m2=gpt-5.2-codex, fid=summary:high, k.sub=LR]
        }"""
    )
    attrs = graph.nodes["n"].attrs
    assert attrs == {
        "a": "42", "b": "-1", "c": "3.14", "d": "-0.5", "e": ".5", "f": "true",
        "g": "250ms", "h": "15m", "i": "1d", "model": "claude-sonnet-4-5",
        "m2": "gpt-5.2-codex", "fid": "summary:high", "k.sub": "LR",
    }  # fmt: skip
    node = graph.nodes["n"]
    assert node.get_duration("g", None) == 0.25
    assert node.get_duration("h", None) == 900
    assert node.get_duration("i", None) == 86400
    assert node.get_bool("f", False) is True
    assert node.get_float("d", 0) == -0.5


def test_hyphenated_bare_word_stops_before_arrow() -> None:
    graph = parse("digraph G { a->b }")
    assert edges(graph) == [("a", "b")]


def test_semicolons_are_optional() -> None:
    with_semis = parse("digraph G { a; b; a -> b; x=1; }")
    without = parse("digraph G { a b a -> b x=1 }")
    assert edges(with_semis) == edges(without)
    assert with_semis.attrs == without.attrs


def test_redeclaring_a_node_merges_attributes_and_moves_position_from_edge() -> None:
    graph = parse('digraph G {\n a -> b\n b [label="B"]\n b [shape=tab]\n}')
    node = graph.nodes["b"]
    assert node.attrs == {"label": "B", "shape": "tab"}
    assert (node.line, node.column) == (3, 2)
    assert node.declared


def test_positions_of_nodes_edges_and_attribute_values() -> None:
    graph = parse(
        'digraph G {\n  plan [prompt="x"]\n  plan -> exit [condition="outcome=failed"]\n}'
    )
    assert (graph.nodes["plan"].line, graph.nodes["plan"].column) == (2, 3)
    assert graph.nodes["plan"].positions["prompt"] == (2, 16)
    assert (graph.edges[0].line, graph.edges[0].column) == (3, 3)
    assert graph.edges[0].positions["condition"] == (3, 27)


def test_quoted_graph_name_and_quoted_identifier_node_ids() -> None:
    graph = parse('digraph "My Flow" { "start" -> "plan" }')
    assert graph.name == "My Flow"
    assert edges(graph) == [("start", "plan")]


def test_byte_order_mark_is_ignored() -> None:
    assert parse("\ufeffdigraph G { a }").name == "G"


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("", 1, 1, "empty workflow"),
        ("graph G { a }", 1, 1, "undirected 'graph' is not supported"),
        ("strict digraph G { a }", 1, 1, "'strict' graphs are not supported"),
        ("digraph { a }", 1, 9, "the graph needs a name"),
        ('{"json": true}', 1, 1, "expected 'digraph'"),
        ("digraph G {\n  a -> b\n", 3, 1, "expected '}' to close the graph"),
        ("digraph G { a -- b }", 1, 15, "undirected edge '--'"),
        ('digraph G {\n  a [label="oops]\n}', 2, 12, "unterminated string"),
        ("digraph G {\n  a [label=]\n}", 2, 12, "expected a value for 'label'"),
        ('digraph G {\n  a [label "x"]\n}', 2, 12, "expected '=' after attribute name 'label'"),
        ("digraph G {\n  a [shape=box\n}", 3, 1, "expected an attribute name or ']'"),
        ("digraph G { a -> }", 1, 18, "expected a node id after '->'"),
        ("digraph G { a -> [x=1] }", 1, 18, "expected a node id after '->'"),
        ("digraph G { 1abc }", 1, 13, "invalid node id '1abc'"),
        ("digraph G { my-node }", 1, 13, "invalid node id 'my-node'"),
        ('digraph G { "two words" }', 1, 13, "invalid node id 'two words'"),
        ("digraph G { a:n -> b }", 1, 13, "invalid node id 'a:n'"),
        ("digraph G { a [label=<b>x</b>] }", 1, 22, "HTML-like"),
        ("digraph G { a [label='x'] }", 1, 22, "single quotes"),
        ("digraph G { a } digraph H { b }", 1, 17, "exactly one digraph"),
        ("digraph G { a [9x=1] }", 1, 16, "invalid attribute name '9x'"),
        ("digraph G { node a }", 1, 18, "expected '[' after 'node'"),
        ("digraph G { /* never closed }", 1, 13, "unterminated /* comment"),
        ("digraph G { a @ b }", 1, 15, "unexpected character '@'"),
        ("digraph G { ] }", 1, 13, "expected a statement"),
        ("digraph G { subgraph x a }", 1, 24, "expected '{' to open the subgraph"),
        ("digraph G { subgraph { a ", 1, 26, "close the subgraph opened at line 1"),
        ('digraph G { a [p="x" + y] }', 1, 24, "expected a string after '+'"),
    ],
)
def test_syntax_errors_name_file_line_column_and_expectation(
    text: str, line: int, column: int, fragment: str
) -> None:
    err = parse_error(text)
    assert (err.path, err.line, err.column) == ("wf.fabro", line, column)
    assert fragment in err.detail
    assert str(err).startswith(f"wf.fabro:{line}:{column}: ")


def test_deeply_nested_subgraphs_are_an_error_not_a_crash() -> None:
    err = parse_error("digraph G {" + "{" * 200 + "}" * 200 + "}")
    assert "nested more than" in err.detail


def test_load_reads_a_file_and_records_path_and_source(tmp_path: Path) -> None:
    path = tmp_path / "flow.fabro"
    path.write_text("digraph Flow { start -> exit }\n", encoding="utf-8")
    graph = load(path)
    assert graph.path == path
    assert graph.source == "digraph Flow { start -> exit }\n"
    assert graph.nodes["start"].path == path


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError) as info:
        load(tmp_path / "nope.fabro")
    assert str(info.value).startswith(f"{tmp_path / 'nope.fabro'}: no such file")


def test_load_directory(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError, match="is a directory"):
        load(tmp_path)


def test_load_invalid_utf8_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.fabro"
    path.write_bytes(b'digraph G {\n  a [label="caf\xe9"]\n}\n')
    with pytest.raises(WorkflowError) as info:
        load(path)
    assert (info.value.line, info.value.column) == (2, 16)
    assert "not valid UTF-8" in info.value.detail


def test_load_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "image.fabro"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(WorkflowError, match="binary file"):
        load(path)


def test_load_non_dot_text(tmp_path: Path) -> None:
    path = tmp_path / "notes.fabro"
    path.write_text("# Title\n\nSome markdown, not a graph.\n")
    with pytest.raises(WorkflowError) as info:
        load(path)
    assert info.value.line == 3
    assert "expected 'digraph'" in info.value.detail


def test_windows_line_endings() -> None:
    text = 'digraph G {\r\n  a [prompt="one\r\ntwo"]\r\n  a -> b\r\n}\r\n'
    graph = parse(text)
    assert graph.nodes["a"].prompt == "one\ntwo"
    assert (graph.nodes["b"].line, graph.nodes["b"].column) == (4, 8)
    assert graph.source == text


def test_keyword_digraph_is_case_insensitive_like_graphviz() -> None:
    assert parse("DiGraph G { a }").name == "G"
