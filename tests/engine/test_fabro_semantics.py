"""Fabro's workflows run as Fabro runs them, through real runs of the CLI.

Two engine rules taken from Fabro: a dry run bounds each node to 10 visits (nothing
simulated can end a loop), and a walk ends at a stage that did not fail and has no edge
to take. Then every complete workflow from the reference docs dry-runs to an end.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, git, meta_file, run_events, run_json, write_workflow

from fabro_git.workflow import parse, validate


def stage_nodes(events: list[dict]) -> list[str]:
    return [e["node_id"] for e in events if e["event"] == "stage.completed"]


def notices(events: list[dict], code: str) -> list[dict]:
    return [e for e in events if e["event"] == "run.notice" and e["properties"]["code"] == code]


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


def run_agent_loop(
    repo: Path, *, graph_attrs: str = "", implement_attrs: str = ""
) -> tuple[int, str, list[dict]]:
    write_workflow(
        repo, AGENT_LOOP % {"graph_attrs": graph_attrs, "implement_attrs": implement_attrs}
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--auto-approve", cwd=repo, timeout=60)
    assert result["status"] == "failed", proc.stderr
    return proc.returncode, proc.stderr, run_events(result["run_id"], repo)


def test_a_dry_run_stops_a_loop_after_ten_visits(repo: Path) -> None:
    code, stderr, events = run_agent_loop(repo)
    assert code == 1
    assert stage_nodes(events).count("implement") == 10
    assert "node implement has run 10 times" in stderr
    assert "its limit (10 in a dry run; max_node_visits or max_visits changes it)" in stderr
    assert "stuck in a cycle" in stderr
    failed = [e for e in events if e["event"] == "run.failed"]
    assert "implement has run 10 times" in failed[0]["properties"]["error"]


def test_the_graph_max_node_visits_overrides_the_dry_run_default(repo: Path) -> None:
    code, stderr, events = run_agent_loop(repo, graph_attrs=', max_node_visits="3"')
    assert code == 1
    assert stage_nodes(events).count("implement") == 3
    assert "node implement has run 3 times, its limit (max_node_visits=3 on the graph)" in stderr


def test_a_node_max_visits_overrides_the_graph_and_the_default(repo: Path) -> None:
    code, stderr, events = run_agent_loop(
        repo, graph_attrs=', max_node_visits="20"', implement_attrs=", max_visits=2"
    )
    assert code == 1
    assert stage_nodes(events).count("implement") == 2
    assert "node implement has run 2 times, its limit (max_visits=2 on the node)" in stderr


def test_the_dry_run_default_holds_across_loop_restarts(repo: Path) -> None:
    # A loop restart resets visit counts; the dry-run bound must still end the run.
    write_workflow(
        repo,
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
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--auto-approve", cwd=repo, timeout=60)
    assert proc.returncode == 1
    assert result["status"] == "failed"
    assert "node implement has run 10 times" in proc.stderr
    events = run_events(result["run_id"], repo)
    assert stage_nodes(events).count("implement") == 10
    assert sum(e["event"] == "loop.restart" for e in events) == 10


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
    ("graph_attrs", "flags"),
    [
        ("", []),  # a real run has no default limit
        (', max_node_visits="20"', ["--dry-run"]),  # an explicit limit lifts the dry-run default
        (', max_node_visits="0"', ["--dry-run"]),  # and 0 turns it off
    ],
    ids=["real-run", "dry-run-graph-limit-20", "dry-run-graph-limit-off"],
)
def test_a_loop_may_run_past_ten_when_nothing_limits_it(
    repo: Path, graph_attrs: str, flags: list[str]
) -> None:
    write_workflow(repo, COUNTER_LOOP % {"graph_attrs": graph_attrs})
    proc, result = run_json("run", "wf.fabro", *flags, cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    assert stage_nodes(run_events(result["run_id"], repo)).count("lap") == 15


DEFAULT_TO_DEPLOY = """
digraph Release {
    graph [goal="ship the release"]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    approve [shape=hexagon, label="Deploy now?", human.default_choice="deploy"]
    deploy [label="Deploy", prompt="Deploy the release"]
    start -> approve
    approve -> deploy [label="[D] Deploy"]
    approve -> exit [label="[C] Cancel"]
}
"""


def test_a_stage_with_no_edge_to_take_ends_the_run(repo: Path) -> None:
    write_workflow(repo, DEFAULT_TO_DEPLOY)
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--auto-approve", cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    events = run_events(result["run_id"], repo)
    assert stage_nodes(events) == ["start", "approve", "deploy"]
    [notice] = notices(events, "no_outgoing_edge")
    assert notice["node_id"] == "deploy"
    assert notice["properties"]["level"] == "warn"
    assert (
        "deploy finished succeeded and has no outgoing edge to take, so the run ends there"
        in notice["properties"]["message"]
    )
    assert [e["properties"]["status"] for e in events if e["event"] == "run.completed"] == [
        "succeeded"
    ]
    checkpoint = json.loads(meta_file(repo, result["run_id"], "checkpoint.json"))
    assert (checkpoint["status"], checkpoint["current_node"], checkpoint["next_node_id"]) == (
        "succeeded",
        "deploy",
        None,
    )


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


def test_a_failure_at_a_dead_end_follows_the_retry_target(repo: Path) -> None:
    write_workflow(repo, FLAKY_DEAD_END % {"attrs": ', retry_target="prep"'})
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    events = run_events(result["run_id"], repo)
    assert stage_nodes(events) == ["start", "prep", "flaky", "prep", "flaky"]
    retried = [
        e
        for e in events
        if e["event"] == "edge.selected" and e["properties"]["reason"] == "retry_target"
    ]
    assert [(e["properties"]["from_node"], e["properties"]["to_node"]) for e in retried] == [
        ("flaky", "prep")
    ]
    assert [n["node_id"] for n in notices(events, "no_outgoing_edge")] == ["flaky"]


def test_a_failure_at_a_dead_end_without_a_retry_target_fails_the_run(repo: Path) -> None:
    write_workflow(repo, FLAKY_DEAD_END % {"attrs": ""})
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 1
    assert result["status"] == "failed"
    assert "stage flaky failed" in proc.stderr
    events = run_events(result["run_id"], repo)
    assert stage_nodes(events) == ["start", "prep", "flaky"]
    assert notices(events, "no_outgoing_edge") == []
    checkpoint = json.loads(meta_file(repo, result["run_id"], "checkpoint.json"))
    assert checkpoint["next_node_id"] == "flaky"  # resume runs it again


def test_goal_gates_hold_at_a_dead_end(repo: Path) -> None:
    # `check` fails and routes on its condition to `report`, which has no edge: the run
    # ends there, but not past an unsatisfied goal gate.
    write_workflow(
        repo,
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
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 1
    assert result["status"] == "failed"
    assert "goal gate unsatisfied for node check and no retry target" in proc.stderr
    events = run_events(result["run_id"], repo)
    assert stage_nodes(events) == ["start", "check", "report"]
    assert [n["node_id"] for n in notices(events, "no_outgoing_edge")] == ["report"]


def test_a_child_workflow_ends_at_a_stage_with_no_edge(repo: Path) -> None:
    child = 'digraph C { start [shape=Mdiamond]; exit [shape=Msquare]; work [shape=parallelogram, script="echo child > c"]; start -> work }'
    write_workflow(
        repo,
        f"""
        digraph Parent {{
            graph [goal="run a child"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            sub [shape=house, stack.child_dot_source={json.dumps(child)}]
            start -> sub -> exit
        }}
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    events = run_events(result["run_id"], repo)
    assert stage_nodes(events) == ["start", "sub/start", "sub/work", "sub", "exit"]
    [notice] = notices(events, "no_outgoing_edge")
    assert notice["node_id"] == "sub/work"
    assert "so its child workflow ends there" in notice["properties"]["message"]


def test_a_parallel_branch_ends_at_a_stage_with_no_edge(repo: Path) -> None:
    write_workflow(
        repo,
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
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    events = run_events(result["run_id"], repo)
    branches = {
        e["node_id"]: e["properties"]["status"]
        for e in events
        if e["event"] == "parallel.branch.completed"
    }
    assert branches == {"joined": "succeeded", "stray": "succeeded"}
    assert [n["node_id"] for n in notices(events, "no_outgoing_edge")] == ["stray"]
    assert stage_nodes(events)[-2:] == ["merge", "exit"]


def test_a_fan_out_whose_branches_reach_no_fan_in_ends_the_run(repo: Path) -> None:
    # Its edges are its branches: taking one again after the fan-out would run that
    # branch's stage a second time, in the run's own worktree.
    write_workflow(
        repo,
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
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    events = run_events(result["run_id"], repo)
    assert sorted(stage_nodes(events)) == ["a", "b", "fan", "start"]
    ended = {n["node_id"]: n["properties"]["message"] for n in notices(events, "no_outgoing_edge")}
    assert set(ended) == {"a", "b", "fan"}
    assert "none of its branches reached a fan-in, so the run ends there" in ended["fan"]


# Every complete workflow from the reference docs (copied as fixtures) runs to an end
# as a user would try it: a dry run, approvals automatic, within a minute.
REFERENCE_WORKFLOWS = ROOT / "tests" / "fixtures" / "reference_workflows"

# fixture -> the inputs it needs (`-V NAME=VALUE`).
RUN_INPUTS: dict[str, list[str]] = {
    "fabro-workflows-variables-1": [
        "-V",
        "repo_name=demo",
        "-V",
        "repo_url=./no-such-repo",
        "-V",
        "language=python",
    ],
}

# fixture -> (text of the only failure allowed, why): a command that needs a tool or a
# file the test repository does not have.
MAY_FAIL: dict[str, tuple[str, str]] = {
    "fabro-workflows-variables-1": (
        "fatal: repository './no-such-repo' does not exist",
        "its first stage clones the repository named by an input, and there is none to clone",
    ),
}


def runnable_reference_workflows() -> list[str]:
    names = []
    for path in sorted(REFERENCE_WORKFLOWS.glob("*.fabro")):
        diagnostics = validate(parse(path.read_text(encoding="utf-8"), path))
        if not any(d.severity == "error" for d in diagnostics):
            names.append(path.stem)
    return names


RUNNABLE = runnable_reference_workflows()


def test_the_reference_workflows_include_the_complete_ones() -> None:
    assert len(RUNNABLE) == 9, RUNNABLE
    assert set(RUN_INPUTS) | set(MAY_FAIL) <= set(RUNNABLE)


@pytest.mark.parametrize("name", RUNNABLE)
def test_a_reference_workflow_dry_runs_to_an_end(repo: Path, name: str) -> None:
    shutil.copy(REFERENCE_WORKFLOWS / f"{name}.fabro", repo / f"{name}.fabro")
    git(repo, "add", f"{name}.fabro")
    git(repo, "commit", "-q", "-m", f"add {name}")
    proc, result = run_json(
        "run",
        f"{name}.fabro",
        "--dry-run",
        "--auto-approve",
        *RUN_INPUTS.get(name, []),
        cwd=repo,
        timeout=60,
    )
    if name in MAY_FAIL:
        reason, _why = MAY_FAIL[name]
        assert result["status"] == "failed", proc.stderr
        assert reason in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert result["status"] in ("succeeded", "partially_succeeded")


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


def test_branches_end_at_the_node_they_all_reach(repo: Path) -> None:
    write_workflow(repo, CLONE_SUBSTACK)
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--auto-approve", cwd=repo, timeout=90)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    nodes = stage_nodes(events)
    # Branches run concurrently (their order is free) and end before their fan-out does.
    assert nodes[:1] == ["start"]
    assert sorted(nodes[1:3]) == ["plan_a", "plan_b"]
    assert nodes[3:6] == ["plan_fan", "debate", "implement"]
    assert sorted(nodes[6:8]) == ["review_a", "review_b"]
    assert nodes[8:] == ["review_fan", "review_consensus", "exit"]
    # The fan-outs jump to their join, which runs in the main walk.
    jumps = [
        (e["properties"]["from_node"], e["properties"]["to_node"])
        for e in events
        if e["event"] == "edge.selected" and e["properties"]["is_jump"]
    ]
    assert jumps == [("plan_fan", "debate"), ("review_fan", "review_consensus")]
    assert notices(events, "no_outgoing_edge") == []
    # And validate has nothing to say about the joins.
    diagnostics = validate(parse(CLONE_SUBSTACK))
    assert [d for d in diagnostics if d.rule == "parallel_join"] == []


def test_validate_warns_of_branches_that_meet_nowhere() -> None:
    graph = parse(
        """
        digraph Apart {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            a [shape=parallelogram, script="true"]
            b [shape=parallelogram, script="true"]
            start -> fan
            fan -> a -> exit
            fan -> b -> exit
        }
        """
    )
    [warning] = [d for d in validate(graph) if d.rule == "parallel_join"]
    assert warning.severity == "warning"
    assert "fan" in warning.message and "fan-in" in warning.message
