"""Parsing and validating scale with the size of the workflow.

No test here is timed. The CLI tests check that big chains and fan-outs come back with
the right verdict and diagnostics (a recursive walk would overflow on a 20k chain); the
counting test checks that validation reads the edge list a fixed number of times
however many nodes there are, which a rule that rescans every edge per node breaks.
`benchmarks/validate_scale.py` measures the times.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import run_fabro

from fabro_git.workflow import parse, validate
from fabro_git.workflow.model import Edge

SIZE = 20_000
HEADER = """digraph Scale {
    graph [goal="scale", model_stylesheet="* { model: claude-sonnet-4-5; }"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
"""


def chain(size: int) -> str:
    lines = [HEADER]
    lines += [f'    n_{i} [shape=parallelogram, script="true"]\n' for i in range(size)]
    lines.append("    start -> n_0\n")
    lines += [f"    n_{i} -> n_{i + 1}\n" for i in range(size - 1)]
    lines.append(f"    n_{size - 1} -> exit\n")
    return "".join(lines)


def fan_out(size: int) -> str:
    lines = [HEADER]
    lines += [f'    n_{i} [shape=parallelogram, script="true"]\n' for i in range(size)]
    lines += [f"    start -> n_{i} -> exit\n" for i in range(size)]
    return "".join(lines)


# One node nothing reaches and one command without a script, at the very end, so the
# expected diagnostics name lines only a full pass gets to.
TAIL = """    island [shape=parallelogram, script="true"]
    mute [shape=parallelogram]
    exit -> mute
}
"""


@pytest.mark.parametrize("shape", [chain, fan_out], ids=["chain", "fan-out"])
def test_validate_a_20k_node_workflow(tmp_path: Path, shape: Callable[[int], str]) -> None:
    text = shape(SIZE) + TAIL
    path = tmp_path / "big.fabro"
    path.write_text(text)
    lines = text.splitlines()
    island_line = lines.index('    island [shape=parallelogram, script="true"]') + 1
    mute_line = lines.index("    mute [shape=parallelogram]") + 1
    # The timeout only keeps a regression from hanging the suite.
    proc = run_fabro("validate", "--json", str(path), timeout=600)
    assert proc.returncode == 1, proc.stderr
    (document,) = json.loads(proc.stdout)
    assert document["nodes"] == SIZE + 4
    found = sorted(
        (d["rule"], d["severity"], d["line"], d["node_id"]) for d in document["diagnostics"]
    )
    assert found == [
        ("command_requires_script", "error", mute_line, "mute"),
        ("dead_end", "warning", mute_line, "mute"),
        ("exit_no_outgoing", "error", mute_line + 1, None),
        ("reachability", "warning", island_line, "island"),
    ], found


class _CountingEdges(list[Edge]):
    """An edge list that counts how often it is walked from the start."""

    walks = 0

    def __iter__(self) -> Iterator[Edge]:
        type(self).walks += 1
        return super().__iter__()


@pytest.mark.parametrize("shape", [chain, fan_out], ids=["chain", "fan-out"])
def test_validation_walks_the_edges_a_fixed_number_of_times(shape: Callable[[int], str]) -> None:
    walks = []
    for size in (200, 2_000):
        graph = parse(shape(size) + "}\n")
        graph.edges = _CountingEdges(graph.edges)
        _CountingEdges.walks = 0
        assert validate(graph) == []
        walks.append(_CountingEdges.walks)
    assert walks[0] == walks[1], walks
    assert walks[0] < 40, walks


def test_thousands_of_start_nodes_each_get_a_short_diagnostic() -> None:
    count = 5_000
    graph = parse(
        "digraph G {\n"
        + "".join(f"    s{i} [shape=Mdiamond]\n" for i in range(count))
        + "    exit [shape=Msquare]\n}\n"
    )
    extra = [d for d in validate(graph) if d.rule == "start_node"]
    assert len(extra) == count - 1
    assert [d.line for d in extra] == list(range(3, count + 2))
    assert extra[0].message == (
        "more than one start node ('s0', 's1', 's2', 's3', 's4' and 4995 more): "
        "a workflow has exactly one"
    )


def test_graph_renders_a_20k_node_chain(tmp_path: Path) -> None:
    path = tmp_path / "big.fabro"
    path.write_text(chain(SIZE) + "}\n")
    proc = run_fabro("graph", "--format", "dot", str(path), timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(1 for line in lines if " -> " in line) == SIZE + 1
    assert f'  "n_{SIZE - 1}" -> "exit"' in lines
