"""Fabro's engine rules in this process, through the real walk on trio's MockClock: a
dry run bounds each node to 10 visits unless a limit says otherwise, a walk ends at a
stage that did not fail and has no edge to take (in the run, a child workflow or a
parallel branch), and the reference docs' workflows dry-run to an end. The end-to-end
tests in tests/engine/test_fabro_semantics.py keep one run of each through
`git fabro run`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.inprocess.harness import Walked, walk
from fabro_git.engine.interviewer import make_interviewer
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import Handler, StageRequest
from fabro_git.handlers import handler_for
from fabro_git.workflow import parse, validate

ROOT = Path(__file__).resolve().parents[3]
REFERENCE_WORKFLOWS = ROOT / "tests" / "fixtures" / "reference_workflows"


def nodes(walked: Walked) -> list[str]:
    return [e.node_id or "" for e in walked.named("stage.completed")]


def ended_at(walked: Walked) -> dict[str, str]:
    """node -> message of each notice that a walk ended at a stage with no edge."""
    return {
        e.node_id or "": e.properties.message
        for e in walked.named("run.notice")
        if e.properties.code == "no_outgoing_edge"
    }


def auto_approve() -> Any:
    return make_interviewer(auto_approve=True, answers=[], interactive=False)


def leaving_after(visits: int) -> Callable[[str], Handler | None]:
    """The real handlers, except that `implement`'s run past `visits` sets the context
    key the loops below leave on: a limit that fails to end a loop fails its test
    instead of hanging it."""
    ran = 0

    def handlers(handler_type: str) -> Handler | None:
        handler = handler_for(handler_type)
        if handler is None:
            return None
        real = handler

        async def bounded(request: StageRequest) -> Outcome:
            nonlocal ran
            if request.node_id == "implement":
                ran += 1
                if ran > visits:
                    return Outcome.success(context_updates={"all_acs_pass": "true"})
            return await real(request)

        return bounded

    return handlers


# The shape of a real fix-and-verify loop: it leaves only when an agent sets a context
# key, which a simulated agent never does.
AGENT_LOOP = """
digraph Loop {
    graph [goal="make every acceptance check pass"%(graph_attrs)s]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    implement [prompt="Implement the next change"%(implement_attrs)s]
    verify [prompt="Check the acceptance criteria", goal_gate=true]
    gate [shape=diamond]
    start -> implement -> verify -> gate
    gate -> exit [condition="context.all_acs_pass=true"]
    gate -> implement
}
"""


def dry_run_agent_loop(
    tmp_path: Path, *, graph_attrs: str = "", implement_attrs: str = ""
) -> Walked:
    source = AGENT_LOOP % {"graph_attrs": graph_attrs, "implement_attrs": implement_attrs}
    walked = walk(
        source, tmp_path, dry_run=True, interviewer=auto_approve(), handlers=leaving_after(30)
    )
    assert walked.status == "failed", walked.error
    return walked


def test_a_dry_run_stops_a_loop_after_ten_visits(tmp_path: Path) -> None:
    walked = dry_run_agent_loop(tmp_path)
    assert nodes(walked).count("implement") == 10
    assert "node implement has run 10 times, its limit (10 in a dry run" in (walked.error or "")


def test_the_graph_max_node_visits_overrides_the_dry_run_default(tmp_path: Path) -> None:
    walked = dry_run_agent_loop(tmp_path, graph_attrs=', max_node_visits="3"')
    assert nodes(walked).count("implement") == 3
    assert "node implement has run 3 times, its limit (max_node_visits=3 on the graph)" in (
        walked.error or ""
    )


def test_a_node_max_visits_overrides_the_graph_and_the_default(tmp_path: Path) -> None:
    walked = dry_run_agent_loop(
        tmp_path, graph_attrs=', max_node_visits="20"', implement_attrs=", max_visits=2"
    )
    assert nodes(walked).count("implement") == 2
    assert "node implement has run 2 times, its limit (max_visits=2 on the node)" in (
        walked.error or ""
    )


def test_the_dry_run_default_holds_across_loop_restarts(tmp_path: Path) -> None:
    # A loop restart resets visit counts; the dry-run bound must still end the run.
    walked = walk(
        """
        digraph Restart {
            graph [goal="loop by restarting"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            implement [prompt="Implement the next change"]
            gate [shape=diamond]
            start -> implement -> gate
            gate -> exit [condition="context.all_acs_pass=true"]
            gate -> implement [loop_restart=true]
        }
        """,
        tmp_path,
        dry_run=True,
        interviewer=auto_approve(),
        handlers=leaving_after(30),
    )
    assert walked.status == "failed"
    assert "node implement has run 10 times" in (walked.error or "")
    assert nodes(walked).count("implement") == 10
    assert len(walked.named("loop.restart")) == 10


# A command loop that leaves after 15 laps, counted in a file. Fifteen identical
# failures in a row would trip the circuit breaker first, so it is turned off.
COUNTER_LOOP = """
digraph Count {
    graph [goal="count to fifteen", loop_restart_signature_limit=0%(graph_attrs)s]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    lap [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; test $((n+1)) -ge 15"]
    start -> lap
    lap -> exit [condition="outcome=succeeded"]
    lap -> lap [condition="outcome=failed"]
}
"""


@pytest.mark.parametrize(
    ("graph_attrs", "dry_run"),
    [
        ("", False),  # a real run has no default limit
        (', max_node_visits="20"', True),  # an explicit limit lifts the dry-run default
        (', max_node_visits="0"', True),  # and 0 turns it off
    ],
    ids=["real-run", "dry-run-graph-limit-20", "dry-run-graph-limit-off"],
)
def test_a_loop_may_run_past_ten_when_nothing_limits_it(
    tmp_path: Path, graph_attrs: str, dry_run: bool
) -> None:
    walked = walk(COUNTER_LOOP % {"graph_attrs": graph_attrs}, tmp_path, dry_run=dry_run)
    assert walked.status == "succeeded", walked.error
    assert nodes(walked).count("lap") == 15


# `flaky` fails on its first visit and has no edge at all: a failure there follows the
# retry target if there is one.
FLAKY_DEAD_END = """
digraph Flaky {
    graph [goal="get past a flaky step"]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    prep [shape=parallelogram, script="echo prep >> log"]
    flaky [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; test $((n+1)) -ge 2"%(attrs)s]
    start -> prep -> flaky
}
"""


def test_a_failure_at_a_dead_end_follows_the_retry_target(tmp_path: Path) -> None:
    walked = walk(FLAKY_DEAD_END % {"attrs": ', retry_target="prep"'}, tmp_path)
    assert walked.status == "succeeded", walked.error
    assert nodes(walked) == ["start", "prep", "flaky", "prep", "flaky"]
    retried = [e for e in walked.props("edge.selected") if e.reason == "retry_target"]
    assert [(e.from_node, e.to_node) for e in retried] == [("flaky", "prep")]
    assert list(ended_at(walked)) == ["flaky"]
    assert (walked.worktree / "log").read_text() == "prep\nprep\n"


def test_a_failure_at_a_dead_end_without_a_retry_target_fails_the_run(tmp_path: Path) -> None:
    walked = walk(FLAKY_DEAD_END % {"attrs": ""}, tmp_path)
    assert walked.status == "failed"
    assert "stage flaky failed" in (walked.error or "")
    assert nodes(walked) == ["start", "prep", "flaky"]
    assert ended_at(walked) == {}
    assert walked.runtime.cp.next_node_id == "flaky"  # resume runs it again


def test_goal_gates_hold_at_a_dead_end(tmp_path: Path) -> None:
    # `check` fails and routes on its condition to `report`, which has no edge: the run
    # ends there, but not past an unsatisfied goal gate.
    walked = walk(
        """
        digraph Gate {
            graph [goal="ship only when the check passes"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            check [shape=parallelogram, script="false", goal_gate=true]
            report [shape=parallelogram, script="echo reported"]
            start -> check
            check -> exit [condition="outcome=succeeded"]
            check -> report [condition="outcome=failed"]
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert "goal gate unsatisfied for node check and no retry target" in (walked.error or "")
    assert nodes(walked) == ["start", "check", "report"]
    assert list(ended_at(walked)) == ["report"]


def test_a_child_workflow_ends_at_a_stage_with_no_edge(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph Parent {
            graph [goal="run a child"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            sub [shape=house, stack.child_dot_source="digraph C { start [shape=Mdiamond]; exit [shape=Msquare]; work [shape=parallelogram, script=\\"echo child > c\\"]; start -> work }"]
            start -> sub -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    assert nodes(walked) == ["start", "sub/start", "sub/work", "sub", "exit"]
    ended = ended_at(walked)
    assert list(ended) == ["sub/work"]
    assert "so its child workflow ends there" in ended["sub/work"]
    assert (walked.worktree / "c").read_text() == "child\n"


def test_a_parallel_branch_ends_at_a_stage_with_no_edge(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph Fan {
            graph [goal="fan out"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            joined [shape=parallelogram, script="echo a > a"]
            stray [shape=parallelogram, script="echo b > b"]
            merge [shape=tripleoctagon]
            start -> fan
            fan -> joined
            fan -> stray
            joined -> merge -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    branches = {e.node_id: e.properties.status for e in walked.named("parallel.branch.completed")}
    assert branches == {"joined": "succeeded", "stray": "succeeded"}
    assert list(ended_at(walked)) == ["stray"]
    assert nodes(walked)[-2:] == ["merge", "exit"]


def test_a_fan_out_whose_branches_reach_no_fan_in_ends_the_run(tmp_path: Path) -> None:
    # Its edges are its branches: taking one again after the fan-out would run that
    # branch's stage a second time, in the run's own worktree.
    walked = walk(
        """
        digraph Fan {
            graph [goal="fan out"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            a [shape=parallelogram, script="echo a >> a"]
            b [shape=parallelogram, script="echo b >> b"]
            start -> fan
            fan -> a
            fan -> b
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    assert sorted(nodes(walked)) == ["a", "b", "fan", "start"]
    ended = ended_at(walked)
    assert set(ended) == {"a", "b", "fan"}
    assert "none of its branches reached a fan-in, so the run ends there" in ended["fan"]
    # The branches of a run in place share its worktree: each stage wrote its line once.
    assert (walked.worktree / "a").read_text() == "a\n"
    assert (walked.worktree / "b").read_text() == "b\n"


# The shape of Fabro's `clone-substack`: two plans converge on a debate, two reviews on a
# consensus, and no fan-in anywhere. Fabro runs each converging stage once, after the join.
CLONE_SUBSTACK = """
digraph CloneSubstack {
    graph [goal="clone the substack"]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan_fan [shape=component]
    plan_a [prompt="Plan one way"]
    plan_b [prompt="Plan another way"]
    debate [prompt="Weigh the two plans"]
    implement [prompt="Implement the chosen plan"]
    review_fan [shape=component]
    review_a [prompt="Review for bugs"]
    review_b [prompt="Review for style"]
    review_consensus [prompt="Agree on the reviews"]
    start -> plan_fan
    plan_fan -> plan_a
    plan_fan -> plan_b
    plan_a -> debate
    plan_b -> debate
    debate -> implement -> review_fan
    review_fan -> review_a
    review_fan -> review_b
    review_a -> review_consensus
    review_b -> review_consensus
    review_consensus -> exit
}
"""


def test_branches_end_at_the_node_they_all_reach(tmp_path: Path) -> None:
    walked = walk(CLONE_SUBSTACK, tmp_path, dry_run=True, interviewer=auto_approve())
    assert walked.status == "succeeded", walked.error
    seen = nodes(walked)
    # Branches run concurrently (their order is free) and end before their fan-out does.
    assert seen[:1] == ["start"]
    assert sorted(seen[1:3]) == ["plan_a", "plan_b"]
    assert seen[3:6] == ["plan_fan", "debate", "implement"]
    assert sorted(seen[6:8]) == ["review_a", "review_b"]
    assert seen[8:] == ["review_fan", "review_consensus", "exit"]
    # The fan-outs jump to their join, which runs in the main walk.
    jumps = [(e.from_node, e.to_node) for e in walked.props("edge.selected") if e.is_jump]
    assert jumps == [("plan_fan", "debate"), ("review_fan", "review_consensus")]
    assert ended_at(walked) == {}
    # And validate has nothing to say about the joins.
    assert [d for d in validate(parse(CLONE_SUBSTACK)) if d.rule == "parallel_join"] == []


def reference_workflows_without_inputs() -> list[str]:
    """The complete reference workflows (no validation error) that need no input; the
    end-to-end test dry-runs the one that does, with `-V`, through `git fabro run`."""
    names = []
    for path in sorted(REFERENCE_WORKFLOWS.glob("*.fabro")):
        graph = parse(path.read_text(encoding="utf-8"), path)
        if any(d.severity == "error" for d in validate(graph)):
            continue
        if path.stem != "fabro-workflows-variables-1":
            names.append(path.stem)
    return names


@pytest.mark.parametrize("name", reference_workflows_without_inputs())
def test_a_reference_workflow_dry_runs_to_an_end(tmp_path: Path, name: str) -> None:
    source = (REFERENCE_WORKFLOWS / f"{name}.fabro").read_text(encoding="utf-8")
    walked = walk(source, tmp_path, dry_run=True, interviewer=auto_approve(), render=True)
    assert walked.status in ("succeeded", "partially_succeeded"), walked.error
