"""`git fabro events`: the NDJSON of one run, several or all, each line byte for byte
what `logs` prints; filters by event and node, --since, and --follow ending with the run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import copy_repo, read_until, run_fabro, start_fabro, write_workflow


def _run_hello(repo: Path) -> str:
    proc = run_fabro("run", "hello", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def _lines(*args: str, cwd: Path) -> list[str]:
    proc = run_fabro(*args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def two_runs(module_repo: Path) -> tuple[str, str]:
    """Two runs of `hello`, one after the other, made once for the module."""
    return _run_hello(module_repo), _run_hello(module_repo)


@pytest.fixture
def finished(
    tmp_path: Path, module_repo: Path, module_env: Path, two_runs: tuple[str, str]
) -> tuple[Path, tuple[str, str]]:
    """The two runs in a copy of the module's repository: no other run is there."""
    return copy_repo(module_repo, tmp_path / "repo", module_env), two_runs


def test_one_run_is_its_logs_and_filters_pick_events_and_nodes(
    finished: tuple[Path, tuple[str, str]],
) -> None:
    repo, (run_id, _) = finished
    logs = _lines("logs", run_id, cwd=repo)
    assert _lines("events", run_id, cwd=repo) == logs
    events = [json.loads(line) for line in logs]

    def expected(keep: object) -> list[str]:
        return [line for line, event in zip(logs, events, strict=True) if keep(event)]  # type: ignore[operator]

    completed = _lines("events", run_id, "--filter", "event=stage.completed", cwd=repo)
    assert completed == expected(lambda e: e["event"] == "stage.completed")
    assert len(completed) == 4  # start, greet, show, exit
    staged = _lines("events", run_id, "--filter", "event=stage.*", cwd=repo)
    assert staged == expected(lambda e: e["event"].startswith("stage."))
    greet = _lines("events", run_id, "--filter", "node=greet", cwd=repo)
    assert greet == expected(lambda e: e.get("node_id") == "greet") and greet
    both = _lines(
        "events",
        run_id,
        "--filter",
        "node=greet",
        "--filter",
        "node=show",
        "--filter",
        "event=stage.started",
        cwd=repo,
    )
    assert both == expected(
        lambda e: e.get("node_id") in ("greet", "show") and e["event"] == "stage.started"
    )
    assert len(both) == 2
    bad = run_fabro("events", run_id, "--filter", "status=failed", cwd=repo)
    assert bad.returncode == 1 and "expected KEY=VALUE with KEY one of event, node" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_several_runs_and_every_run_merge_in_time_order(
    finished: tuple[Path, tuple[str, str]],
) -> None:
    repo, (first, second) = finished
    logs = _lines("logs", first, cwd=repo) + _lines("logs", second, cwd=repo)
    merged = sorted(logs, key=lambda line: (json.loads(line)["ts"], json.loads(line)["id"]))
    assert _lines("events", cwd=repo) == merged
    assert _lines("events", second[:14], first, cwd=repo) == merged
    assert _lines("events", "--since", "1h", cwd=repo) == merged
    assert _lines("events", "--since", "0s", cwd=repo) == []
    runs = {json.loads(line)["run_id"] for line in _lines("events", "hello", cwd=repo)}
    assert runs == {second}  # a workflow's name means its latest run, as in `logs`


WAITS = """\
digraph D {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    wait [shape=parallelogram, script="while [ ! -e {go} ]; do sleep 0.05; done"]
    start -> wait -> exit
}
"""


def test_follow_prints_a_live_run_as_it_goes_and_ends_with_it(repo: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    write_workflow(repo, WAITS.replace("{go}", str(go)))
    started = run_fabro("run", "wf.fabro", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    follower = subprocess.Popen(
        ["git", "fabro", "events", run_id, "--follow", "--filter", "event=stage.*"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert follower.stdout is not None
        # The stage is running, so the run is live: the follower has printed its start
        # and waits for more.
        seen = read_until(follower.stdout.fileno(), b'"event":"stage.started","node_id":"wait"')
        assert follower.poll() is None
        go.touch()
        rest, errors = follower.communicate(timeout=120)
    finally:
        go.touch()  # the run ends whatever happened here
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        run_fabro("wait", run_id, cwd=repo)
    assert follower.returncode == 0, errors
    printed = (seen + rest).decode().splitlines()
    logs = _lines("logs", run_id, cwd=repo)
    assert printed == [line for line in logs if json.loads(line)["event"].startswith("stage.")]
    assert json.loads(printed[-1])["node_id"] == "exit"


def test_following_every_run_picks_up_a_run_started_meanwhile(
    finished: tuple[Path, tuple[str, str]],
) -> None:
    repo, earlier = finished
    # Started without git's front end, so the kill below reaches the command itself.
    follower = start_fabro(
        ["events", "--follow", "--filter", "event=run.completed"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert follower.stdout is not None
        fd = follower.stdout.fileno()
        seen = read_until(fd, b'"event":"run.completed"', count=2)  # the earlier runs', at once
        later = _run_hello(repo)
        seen = read_until(fd, b'"event":"run.completed"', seen, count=3)
        assert follower.poll() is None  # every run, so it goes on
    finally:
        follower.kill()
        follower.communicate()
    runs = [json.loads(line)["run_id"] for line in seen.decode().splitlines()]
    assert runs == [*earlier, later]


BAD_REF = "refs/fabro/meta/01BLOB00000000000000000000"


def _add_bad_meta_ref(repo: Path) -> str:
    """A meta ref that points at a blob: no run's snapshot. The warning `ps` gives for it."""
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=repo,
        input="junk\n",
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    subprocess.run(["git", "update-ref", BAD_REF, blob], cwd=repo, check=True)
    ps = run_fabro("ps", cwd=repo)
    assert ps.returncode == 0, ps.stderr
    (warning,) = [line for line in ps.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: skipped {BAD_REF}: ")
    return warning


def test_a_meta_ref_that_is_no_snapshot_is_skipped_as_ps_skips_it(
    finished: tuple[Path, tuple[str, str]],
) -> None:
    repo, (first, second) = finished
    warning = _add_bad_meta_ref(repo)
    logs = _lines("logs", first, cwd=repo) + _lines("logs", second, cwd=repo)
    merged = sorted(logs, key=lambda line: (json.loads(line)["ts"], json.loads(line)["id"]))
    proc = run_fabro("events", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == merged
    assert warning in proc.stderr.splitlines(), proc.stderr
    assert "hint: look at it with `git show " in proc.stderr


def test_following_every_run_skips_a_meta_ref_that_appears_and_is_no_snapshot(
    finished: tuple[Path, tuple[str, str]],
) -> None:
    repo, earlier = finished
    follower = start_fabro(
        ["events", "--follow", "--filter", "event=run.completed"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert follower.stdout is not None
        fd = follower.stdout.fileno()
        seen = read_until(fd, b'"event":"run.completed"', count=2)
        warning = _add_bad_meta_ref(repo)
        later = _run_hello(repo)  # found after the bad ref, or with it
        seen = read_until(fd, b'"event":"run.completed"', seen, count=3)
        assert follower.poll() is None
    finally:
        follower.kill()
        _, stderr = follower.communicate()
    runs = [json.loads(line)["run_id"] for line in seen.decode().splitlines()]
    assert runs == [*earlier, later]
    assert warning in stderr.decode().splitlines(), stderr
