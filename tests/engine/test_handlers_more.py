"""Handler and routing details not covered elsewhere: default choices, python and legacy
command nodes, weighted-random edge selection."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from helpers import git, run_events, run_json, write_workflow

from fabro_git.engine.edges import accelerator_key, normalize_label, select_edge
from fabro_git.workflow import parse


def test_auto_approve_takes_the_default_choice(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph D {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            ask [shape=hexagon, label="Ship?", human.default_choice="hold"]
            ship [shape=parallelogram, script="echo ship > r"]
            hold [shape=parallelogram, script="echo hold > r"]
            start -> ask
            ask -> ship [label="[S] Ship"]
            ask -> hold [label="[H] Hold"]
            ship -> exit
            hold -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--auto-approve", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:r") == "hold\n"


def test_python_and_legacy_tool_command_nodes(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph P {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            py [shape=parallelogram, language="python", script="open('py.txt', 'w').write(str(6 * 7))"]
            legacy [shape=parallelogram, tool_command="echo legacy > legacy.txt"]
            start -> py -> legacy -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:py.txt") == "42"
    assert git(repo, "show", f"fabro/run/{run_id}:legacy.txt") == "legacy\n"
    assert [e["node_id"] for e in run_events(run_id, repo) if e["event"] == "stage.completed"] == [
        "start",
        "py",
        "legacy",
        "exit",
    ]


RANDOM = """
digraph R {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    pick [shape=parallelogram, script="true", selection="random"]
    start -> pick
    pick -> heavy [weight=3]
    pick -> light [weight=1]
    heavy -> exit
    light -> exit
}
"""


def test_random_selection_draws_by_weight() -> None:
    graph = parse(RANDOM)
    node = graph.nodes["pick"]
    rng = random.Random(7)
    picks = Counter(
        select_edge(
            graph,
            node,
            status="succeeded",
            preferred_label=None,
            suggested_next_ids=[],
            context={},
            rng=rng,
        ).edge.target  # type: ignore[union-attr]
        for _ in range(4000)
    )
    assert set(picks) == {"heavy", "light"}
    assert 0.70 < picks["heavy"] / 4000 < 0.80


def test_deterministic_selection_ignores_the_rng() -> None:
    graph = parse(RANDOM.replace(', selection="random"', ""))
    node = graph.nodes["pick"]
    targets = {
        select_edge(
            graph,
            node,
            status="succeeded",
            preferred_label=None,
            suggested_next_ids=[],
            context={},
            rng=random.Random(seed),
        ).edge.target  # type: ignore[union-attr]
        for seed in range(50)
    }
    assert targets == {"heavy"}


def test_labels_and_accelerators() -> None:
    assert normalize_label("[A] Approve") == "approve"
    assert normalize_label("Y) Yes") == "yes"
    assert normalize_label("N - No") == "no"
    assert accelerator_key("[R] Revise") == "R"
    assert accelerator_key("Fix it") == "F"
