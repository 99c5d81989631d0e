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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from helpers import fabro_exe, git, run_fabro

from fabro_git.events.contract import check_event, check_jsonl
from fabro_git.events.seed import Catalogue, load_contract

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
    proc = subprocess.Popen(
        [*fabro_exe(), "run", str(tmp_path / "naps.fabro")],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        tails = list((Path(os.environ["FABRO_HOME"]) / "runs").glob("*/events.jsonl"))
        if tails and b'"node_id":"nap"' in tails[0].read_bytes():
            break
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(sig)
    assert proc.wait(timeout=15) == (130 if sig == signal.SIGINT else -sig)
    run_id = tails[0].parent.name.rsplit("-", 1)[0]  # runs/<run id>-<repository key>/
    (home / "quick").write_text("")
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

        # The durable log on the meta ref is the same bytes as what logs printed.
        meta = f"refs/fabro/meta/{run_id}"
        segments = git(repo, "ls-tree", "-r", "--name-only", f"{meta}:events").split()
        assert segments == [f"000/{i:06d}.jsonl" for i in range(1, len(segments) + 1)]
        durable = "".join(git(repo, "show", f"{meta}:events/{s}") for s in segments)
        assert proc.stdout.startswith(durable)
