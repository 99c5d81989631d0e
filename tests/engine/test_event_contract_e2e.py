"""Every event real runs emit, read back with `git fabro logs`, checked against the events contract.

Each scenario runs the real CLI (shipped examples in dry-run, and workflows that reach
retries, human gates, waits, sub-workflows, parallel branches, setup commands, failures,
the stall watchdog, Ctrl-C and resume), then passes every event through the contract
checker built from the catalogue the project carries (the seed's facts), and checks the envelope (UUID v7 ids that
agree with `ts`, RFC 3339 millisecond UTC timestamps, one run id) and that the event
families the scenario exercises were really emitted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from event_contract.check import check_event, check_jsonl
from event_contract.seed import Catalogue, load_contract
from helpers import git, run_fabro, start_fabro, wait_until

UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

# Every run that gets as far as its first stage and finishes.
LIFECYCLE = {
    "run.created",
    "run.started",
    "sandbox.initializing",
    "sandbox.ready",
    "sandbox.initialized",
    "stage.started",
    "stage.completed",
    "edge.selected",
    "checkpoint.completed",
    "git.commit",
    "metadata.snapshot.started",
    "metadata.snapshot.completed",
}
SUCCESS = LIFECYCLE | {"run.completed", "sandbox.cleanup.started", "sandbox.cleanup.completed"}

CHILD = """\
digraph Child {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    inner [shape=parallelogram, script="printf 'child\\\\n' > child.txt"]
    start -> inner -> exit
}
"""

# A command that times out (transient_infra) on its first attempt and is retried; a
# human gate answered with --answer; a wait; a sub-workflow; a conditional; a parallel
# fan-out of two command branches and its fan-in; and two setup commands.
EVERYTHING = """\
digraph Everything {
    graph [goal="touch every event family", setup="echo a\\necho b"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    flaky [shape=parallelogram, timeout="300ms", max_retries=1, retry_policy="linear",
           script="if [ -f .attempted ]; then echo second; else touch .attempted; sleep 5; fi"]
    gate  [shape=hexagon, label="Ship it?"]
    pause [shape=insulator, duration="50ms"]
    sub   [shape=house, stack.child_workflow="child.fabro"]
    check [shape=diamond]
    fan   [shape=component, max_parallel=2]
    b1    [shape=parallelogram, script="printf 'b1\\\\n' > b1.txt"]
    b2    [shape=parallelogram, script="printf 'b2\\\\n' > b2.txt"]
    join  [shape=tripleoctagon]
    start -> flaky -> gate
    gate -> pause [label="[Y] Yes"]
    gate -> exit  [label="[N] No"]
    pause -> sub -> check
    check -> fan [condition="outcome=succeeded"]
    check -> exit
    fan -> b1
    fan -> b2
    b1 -> join
    b2 -> join
    join -> exit
}
"""

FAILS_UNTIL_FIXED = """\
digraph Fails {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    work  [shape=parallelogram, script="test -f \\"$HOME/fixed\\" || { echo 'not fixed' >&2; exit 3; }"]
    start -> work -> exit
}
"""

SETUP_FAILS = """\
digraph SetupFails {
    graph [setup="echo fine\\nexit 7"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    start -> exit
}
"""

STALLS = """\
digraph Stalls {
    graph [stall_timeout="1s"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hang  [shape=parallelogram, script="sleep 20"]
    start -> hang -> exit
}
"""

NAPS = """\
digraph Naps {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    nap   [shape=parallelogram, script="if [ -f \\"$HOME/quick\\" ]; then true; else sleep 30; fi"]
    start -> nap -> exit
}
"""

# A stage that breaks its own worktree: its checkpoint cannot record the files, and the
# run's end cannot remove the worktree.
BREAKS_WORKTREE = """\
digraph Breaks {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    wreck [shape=parallelogram, script="rm .git"]
    start -> wreck -> exit
}
"""

# A stage that leaves its run's meta ref locked, as a crashed git command would (once:
# its rerun on resume does not).
LOCKS_META = """\
digraph Locks {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    lock  [shape=parallelogram,
           script="test -f \\"$HOME/locked\\" || { touch \\"$HOME/locked\\"; touch \\"$(git rev-parse --git-common-dir)/refs/fabro/meta/$FABRO_RUN_ID.lock\\"; }"]
    start -> lock -> exit
}
"""

# A loop restart (visit counts start again) and a fan-out whose two branches lead to
# one node: every stage execution still has a stage_id of its own.
RESTARTS = """\
digraph Restarts {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    r0    [shape=parallelogram,
           script="if [ -f .lap ]; then printf done; else touch .lap; printf again; fi"]
    check [shape=diamond]
    fan   [shape=component]
    b1    [shape=parallelogram, script="printf 'b1\\\\n' > b1.txt"]
    b2    [shape=parallelogram, script="printf 'b2\\\\n' > b2.txt"]
    both  [shape=parallelogram, script="true"]
    start -> r0 -> check
    check -> fan [condition="context.command.output=done"]
    check -> r0 [loop_restart=true]
    fan -> b1 -> both
    fan -> b2 -> both
    both -> exit
}
"""

# A human gate nobody answers within its own timeout: it takes its default.
GATE_TIMES_OUT = """\
digraph Unanswered {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    gate  [shape=hexagon, label="Ship it?", human.timeout="300ms", human.default_choice="exit"]
    start -> gate
    gate -> exit [label="[Y] Yes"]
}
"""


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_contract()


def _run_json(*args: str, cwd: Path, expect: int = 0) -> str:
    proc = run_fabro(*args, "--json", cwd=cwd)
    assert proc.returncode == expect, proc.stderr
    assert "Traceback" not in proc.stderr
    return str(json.loads(proc.stdout.splitlines()[-1])["run_id"])


@dataclass
class Scenario:
    name: str
    drive: Callable[[Path, Path, Path], list[str]]  # (repo, tmp_path, home) -> run ids
    expected: set[str]
    notices: set[str] = field(default_factory=set)


def _example(name: str) -> Callable[[Path, Path, Path], list[str]]:
    def drive(repo: Path, tmp_path: Path, home: Path) -> list[str]:
        return [_run_json("run", name, "--dry-run", "--auto-approve", cwd=repo)]

    return drive


def _everything(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "child.fabro").write_text(CHILD)
    (tmp_path / "all.fabro").write_text(EVERYTHING)
    return [_run_json("run", str(tmp_path / "all.fabro"), "--answer", "Y", cwd=repo)]


def _failure_then_resume(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "fails.fabro").write_text(FAILS_UNTIL_FIXED)
    run_id = _run_json("run", str(tmp_path / "fails.fabro"), cwd=repo, expect=1)
    (home / "fixed").write_text("")
    proc = run_fabro("resume", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return [run_id]


def _setup_fails(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "setup.fabro").write_text(SETUP_FAILS)
    return [_run_json("run", str(tmp_path / "setup.fabro"), cwd=repo, expect=1)]


def _stalls(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "stalls.fabro").write_text(STALLS)
    return [_run_json("run", str(tmp_path / "stalls.fabro"), cwd=repo, expect=1)]


def _interrupted_then_resumed(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    return _stopped_then_resumed(repo, tmp_path, home, signal.SIGINT)


def _killed_then_resumed(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    """A killed run keeps its worktree, so its resume resets it (`git.reset`)."""
    return _stopped_then_resumed(repo, tmp_path, home, signal.SIGKILL)


def _stopped_then_resumed(repo: Path, tmp_path: Path, home: Path, sig: signal.Signals) -> list[str]:
    (tmp_path / "naps.fabro").write_text(NAPS)
    proc = start_fabro(
        ["run", str(tmp_path / "naps.fabro")],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def at_nap() -> list[Path]:
        tails = list((Path(os.environ["FABRO_HOME"]) / "runs").glob("*/events.jsonl"))
        return tails if tails and b'"node_id":"nap"' in tails[0].read_bytes() else []

    tails = wait_until(at_nap, process=proc, limit=30, what="the nap stage")
    proc.send_signal(sig)
    assert proc.wait(timeout=15) == (130 if sig == signal.SIGINT else -sig)
    run_id = tails[0].parent.name.rsplit("-", 1)[0]  # runs/<run id>-<repository key>/
    (home / "quick").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    return [run_id]


def _breaks_worktree(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "breaks.fabro").write_text(BREAKS_WORKTREE)
    return [_run_json("run", str(tmp_path / "breaks.fabro"), cwd=repo, expect=1)]


def _locks_meta(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "locks.fabro").write_text(LOCKS_META)
    # Waited out as long as git would be told to, not the 4 s default.
    git(repo, "config", "core.filesRefLockTimeout", "100")
    failed = run_fabro("run", str(tmp_path / "locks.fabro"), cwd=repo)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "delete that file and retry" in failed.stderr
    match = re.search(r"run (\w+) started", failed.stderr)
    assert match, failed.stderr
    run_id = match.group(1)
    # What `logs` reads must reach git: the lock goes, and resume records the rest.
    (repo / ".git" / "refs" / "fabro" / "meta" / f"{run_id}.lock").unlink()
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    return [run_id]


def _gate_times_out(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    """Stdin is a pipe that stays open and says nothing: the gate waits for a line
    until its own timeout, then takes its default."""
    (tmp_path / "unanswered.fabro").write_text(GATE_TIMES_OUT)
    out, err = tmp_path / "gate.out", tmp_path / "gate.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = start_fabro(
            ["run", str(tmp_path / "unanswered.fabro"), "--json"],
            cwd=repo,
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            proc.wait(timeout=60)  # stdin stays open, and silent, until the run ends
        finally:
            if proc.poll() is None:
                proc.kill()
            assert proc.stdin is not None
            proc.stdin.close()
    assert proc.returncode == 0, err.read_text()
    assert "timed out" in err.read_text()
    return [str(json.loads(out.read_text().splitlines()[-1])["run_id"])]


def _restarts(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    (tmp_path / "restarts.fabro").write_text(RESTARTS)
    return [_run_json("run", str(tmp_path / "restarts.fabro"), cwd=repo)]


def _resume_finds_the_branch_taken(repo: Path, tmp_path: Path, home: Path) -> list[str]:
    """The user checked the run branch out in a worktree of their own: resume cannot
    make the run's worktree, says why and what to do, and works once it is freed."""
    (tmp_path / "fails.fabro").write_text(FAILS_UNTIL_FIXED)
    run_id = _run_json("run", str(tmp_path / "fails.fabro"), cwd=repo, expect=1)
    mine = tmp_path / "mine"
    git(repo, "worktree", "add", "-q", str(mine), f"fabro/run/{run_id}")
    (home / "fixed").write_text("")
    refused = run_fabro("resume", run_id, cwd=repo)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"checked out at {mine}" in refused.stderr
    assert "switch --detach" in refused.stderr
    git(repo, "worktree", "remove", str(mine))
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    return [run_id]


SCENARIOS = [
    Scenario("hello", _example("hello"), SUCCESS),
    Scenario("branch-loop", _example("branch-loop"), SUCCESS | {"stage.failed"}),
    Scenario(
        "human-gate", _example("human-gate"), SUCCESS | {"interview.started", "interview.completed"}
    ),
    Scenario(
        "parallel-review",
        _example("parallel-review"),
        SUCCESS
        | {
            "parallel.started",
            "parallel.branch.started",
            "parallel.branch.completed",
            "parallel.completed",
            "stage.prompt",
        },
    ),
    Scenario(
        "plan-implement-review", _example("plan-implement-review"), SUCCESS | {"stage.prompt"}
    ),
    Scenario(
        "everything",
        _everything,
        SUCCESS
        | {
            "setup.started",
            "setup.command.started",
            "setup.command.completed",
            "setup.completed",
            "stage.failed",
            "stage.retrying",
            "interview.started",
            "interview.completed",
            "subgraph.started",
            "subgraph.completed",
            "parallel.started",
            "parallel.branch.started",
            "parallel.branch.completed",
            "parallel.completed",
        },
    ),
    Scenario(
        "failure-then-resume",
        _failure_then_resume,
        SUCCESS | {"stage.failed", "run.failed", "run.notice"},
        notices={"resumed"},
    ),
    Scenario(
        "killed-then-resumed",
        _killed_then_resumed,
        SUCCESS | {"run.notice", "git.reset"},
        notices={"resumed"},
    ),
    Scenario(
        "setup-fails",
        _setup_fails,
        {
            "run.created",
            "run.started",
            "setup.started",
            "setup.command.started",
            "setup.command.completed",
            "setup.failed",
            "run.failed",
        },
    ),
    Scenario(
        "stall-watchdog",
        _stalls,
        LIFECYCLE | {"watchdog.timeout", "run.failed"},
    ),
    Scenario(
        "breaks-its-worktree",
        _breaks_worktree,
        LIFECYCLE
        | {"checkpoint.failed", "run.failed", "sandbox.cleanup.started", "sandbox.cleanup.failed"},
        notices={"checkpoint_git_failed"},
    ),
    Scenario(
        "meta-ref-locked",
        _locks_meta,
        SUCCESS | {"metadata.snapshot.failed", "run.failed"},
        notices={"checkpoint_metadata_write_failed", "resumed"},
    ),
    Scenario(
        "gate-times-out",
        _gate_times_out,
        SUCCESS | {"interview.started", "interview.timeout"},
    ),
    Scenario(
        "resume-finds-the-branch-taken",
        _resume_finds_the_branch_taken,
        SUCCESS | {"sandbox.failed", "run.failed"},
        notices={"resumed"},
    ),
    Scenario(
        "loop-restart-and-shared-branch-node",
        _restarts,
        SUCCESS | {"loop.restart", "parallel.started", "parallel.completed"},
    ),
    Scenario(
        "interrupted-then-resumed",
        _interrupted_then_resumed,
        SUCCESS | {"run.notice"},
        notices={"interrupted", "resumed"},
    ),
]


def _ms_of_uuid7(value: str) -> int:
    return int(value.replace("-", "")[:12], 16)


def _ms_of_ts(value: str) -> int:
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_event_matches_the_seed(
    scenario: Scenario, repo: Path, tmp_path: Path, hermetic_env: Path, catalogue: Catalogue
) -> None:
    for run_id in scenario.drive(repo, tmp_path, hermetic_env):
        proc = run_fabro("logs", run_id, cwd=repo)
        assert proc.returncode == 0, proc.stderr
        raw = proc.stdout.encode()
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        assert events, "no events"

        problems = [p for e in events for p in check_event(e, catalogue)]
        assert problems == [], "\n".join(problems[:40])
        assert check_jsonl(raw, catalogue) == []

        names = [e["event"] for e in events]
        missing = scenario.expected - set(names)
        assert not missing, f"never emitted: {sorted(missing)}; emitted: {sorted(set(names))}"
        assert names[0] == "run.created"
        assert names.count("run.created") == 1
        assert names.count("run.completed") <= 1
        notices = {e["properties"].get("code") for e in events if e["event"] == "run.notice"}
        assert scenario.notices <= notices, notices

        # The envelope: one run, UUID v7 ids in emission order and agreeing with ts.
        assert {e["run_id"] for e in events} == {run_id}
        ids = [e["id"] for e in events]
        assert len(set(ids)) == len(ids)
        assert all(UUID7.match(i) for i in ids)
        assert ids == sorted(ids), "event ids are not time-ordered"
        stamps = [e["ts"] for e in events]
        assert all(TS.match(t) for t in stamps)
        assert stamps == sorted(stamps)
        for e in events:
            assert abs(_ms_of_uuid7(e["id"]) - _ms_of_ts(e["ts"])) <= 1000, e

        # Every stage execution has a stage_id of its own, across loop restarts,
        # branches, children and resumes: one stage.completed per stage_id, and one
        # start per attempt (a rerun after a crash counts its attempts on under its id).
        completed = [e["stage_id"] for e in events if e["event"] == "stage.completed"]
        assert [s for s in set(completed) if completed.count(s) > 1] == []
        attempts = [
            (e["stage_id"], e["properties"]["attempt"])
            for e in events
            if e["event"] == "stage.started"
        ]
        assert len(set(attempts)) == len(attempts), sorted(attempts)

        # The durable log on the meta ref is the same bytes as what logs printed.
        meta = f"refs/fabro/meta/{run_id}"
        segments = git(repo, "ls-tree", "-r", "--name-only", f"{meta}:events").split()
        assert segments == [f"000/{i:06d}.jsonl" for i in range(1, len(segments) + 1)]
        durable = "".join(git(repo, "show", f"{meta}:events/{s}") for s in segments)
        assert proc.stdout.startswith(durable)
