"""The shipped example workflows are clean, and shaped the way their docs promise."""

from __future__ import annotations

from pathlib import Path

import pytest

import fabro_git
from fabro_git.workflow import load, validate

EXAMPLES = Path(fabro_git.__file__).parent / "examples"
REQUIRED = {"hello", "branch-loop", "parallel-review", "human-gate", "plan-implement-review"}


def example_paths() -> list[Path]:
    return sorted(EXAMPLES.glob("*.fabro"))


def test_required_examples_are_shipped() -> None:
    assert {path.stem for path in example_paths()} >= REQUIRED


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.stem)
def test_example_validates_without_errors_or_warnings(path: Path) -> None:
    graph = load(path)
    assert validate(graph) == []
    assert graph.goal


def handlers(path: Path) -> set[str]:
    return {node.handler_type for node in load(path).nodes.values()}


def test_hello_runs_without_a_model() -> None:
    assert handlers(EXAMPLES / "hello.fabro") == {"start", "exit", "command"}


def test_branch_loop_is_a_bounded_conditional_loop_of_commands() -> None:
    graph = load(EXAMPLES / "branch-loop.fabro")
    assert handlers(EXAMPLES / "branch-loop.fabro") == {"start", "exit", "command"}
    assert any(edge.condition for edge in graph.edges)
    assert graph.nodes["test"].get_int("max_visits", 0) > 0
    assert {(e.source, e.target) for e in graph.edges} >= {("test", "fix"), ("fix", "test")}


def test_parallel_review_fans_out_to_three_and_merges() -> None:
    graph = load(EXAMPLES / "parallel-review.fabro")
    (fan_out,) = [n for n in graph.nodes.values() if n.handler_type == "parallel"]
    (merge,) = [n for n in graph.nodes.values() if n.handler_type == "parallel.fan_in"]
    branches = [e.target for e in graph.outgoing(fan_out.id)]
    assert len(branches) == 3
    assert sorted(e.source for e in graph.incoming(merge.id)) == sorted(branches)


def test_human_gate_offers_approve_and_revise() -> None:
    graph = load(EXAMPLES / "human-gate.fabro")
    (gate,) = [n for n in graph.nodes.values() if n.handler_type == "human"]
    labels = {e.label for e in graph.outgoing(gate.id)}
    assert labels == {"[A] Approve", "[R] Revise"}
    assert handlers(EXAMPLES / "human-gate.fabro") == {"start", "exit", "command", "human"}


def test_plan_implement_review_uses_stylesheet_and_prompt_files() -> None:
    graph = load(EXAMPLES / "plan-implement-review.fabro")
    assert {"prompt", "agent"} <= handlers(EXAMPLES / "plan-implement-review.fabro")
    assert graph.nodes["implement"].attrs["model"] == "claude-sonnet-4-5"
    assert graph.nodes["review"].attrs["model"] == "gpt-5.2"
    assert graph.nodes["plan"].attrs["model"] == "claude-haiku-4-5"
    assert graph.nodes["verify"].get_bool("goal_gate", False)
    assert graph.nodes["plan"].prompt == "@prompts/plan.md"
