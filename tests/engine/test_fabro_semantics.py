"""Fabro's workflows run as Fabro runs them, through real runs of the CLI.

Two engine rules taken from Fabro: a dry run bounds each node to 10 visits (nothing
simulated can end a loop), and a walk ends at a stage that did not fail and has no edge
to take. Then the complete workflows from the reference docs dry-run to an end. Each is
run here once through `git fabro run`; their many cases (the limits that override the
default, dead ends in a child workflow or a parallel branch, retry targets and goal
gates there, every reference workflow) walk in process, in
tests/engine/inprocess/test_semantics_inprocess.py.
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
    graph [goal="make every acceptance check pass"]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    implement [prompt="Implement the next change"]
    verify [prompt="Check the acceptance criteria", goal_gate=true]
    gate [shape=diamond]
    start -> implement -> verify -> gate
    gate -> exit [condition="context.all_acs_pass=true"]
    gate -> implement
}
"""


def test_a_dry_run_stops_a_loop_after_ten_visits(repo: Path) -> None:
    write_workflow(repo, AGENT_LOOP)
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--auto-approve", cwd=repo, timeout=60)
    assert result["status"] == "failed", proc.stderr
    assert proc.returncode == 1
    stderr, events = proc.stderr, run_events(result["run_id"], repo)
    assert stage_nodes(events).count("implement") == 10
    assert "node implement has run 10 times" in stderr
    assert "its limit (10 in a dry run; max_node_visits or max_visits changes it)" in stderr
    assert "stuck in a cycle" in stderr
    failed = [e for e in events if e["event"] == "run.failed"]
    assert "implement has run 10 times" in failed[0]["properties"]["error"]


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

# Through `git fabro run`: the one that needs inputs (`-V`) and one with a model
# stylesheet; the in-process tests walk every one of them.
THROUGH_THE_COMMAND = ["fabro-workflows-variables-1", "fabro-workflows-stylesheets-1"]


def test_the_reference_workflows_include_the_complete_ones() -> None:
    assert len(RUNNABLE) == 9, RUNNABLE
    assert set(RUN_INPUTS) | set(MAY_FAIL) | set(THROUGH_THE_COMMAND) <= set(RUNNABLE)


@pytest.mark.parametrize("name", THROUGH_THE_COMMAND)
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
