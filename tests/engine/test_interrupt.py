"""Ctrl-C stops a run cleanly: the stage in flight and everything it started are
stopped, a checkpoint says "interrupted", the command exits 130, and resume finishes."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    TERMINAL_ESCAPES,
    Terminal,
    fabro_exe,
    git,
    pids_with_env,
    read_checkpoint,
    run_events,
    run_fabro,
    start_fabro,
    tail_has,
    wait_until,
)

# `nap` sleeps 30 s unless $HOME/quick exists; its child `sleep` is what must not
# outlive the interrupt.
WORKFLOW = """\
digraph Nap {
    graph [goal="be interrupted"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    one   [shape=parallelogram, script="printf 'one\\\\n' > one.txt"]
    nap   [shape=parallelogram, script="if [ -f \\"$HOME/quick\\" ]; then sleep 0.1; else sleep 30; fi; printf 'napped\\\\n' > nap.txt"]
    start -> one -> nap -> exit
}
"""


def _start_and_reach_nap(
    repo: Path, tmp_path: Path, argv: list[str]
) -> tuple[subprocess.Popen, str]:
    workflow = tmp_path / "nap.fabro"
    workflow.write_text(WORKFLOW)
    proc = subprocess.Popen(
        [*argv, "run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell job would have
    )

    def at_nap() -> str | None:
        ids = git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta").split()
        if not ids or not tail_has(ids[0], "stage.started", "nap"):
            return None
        # The shell and its sleep are both running.
        return ids[0] if len(pids_with_env(FABRO_RUN_ID=ids[0], FABRO_NODE_ID="nap")) >= 2 else None

    return proc, wait_until(at_nap, process=proc, limit=30, what="the run reaching nap")


@pytest.mark.parametrize(
    ("how", "sig"),
    [
        ("git-fabro-pid", signal.SIGINT),
        ("git-front-end-group", signal.SIGINT),  # what a terminal's Ctrl-C does
        ("git-fabro-pid", signal.SIGTERM),
    ],
    ids=["sigint-process", "ctrl-c-process-group", "sigterm-process"],
)
def test_interrupt_stops_the_stage_checkpoints_and_resumes(
    repo: Path, tmp_path: Path, hermetic_env: Path, how: str, sig: signal.Signals
) -> None:
    argv = ["git", "fabro"] if how == "git-front-end-group" else fabro_exe()
    proc, run_id = _start_and_reach_nap(repo, tmp_path, argv)
    stage = pids_with_env(FABRO_RUN_ID=run_id, FABRO_NODE_ID="nap")
    sent = time.monotonic()
    if how == "git-front-end-group":
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=15)
    took = time.monotonic() - sent
    if how == "git-front-end-group":
        # git's front end gets the Ctrl-C too and dies of it (a shell shows 130 for
        # both); git-fabro finishes its checkpoint after, as the rest of this checks.
        # git 2.39's own signal handler may reap git-fabro before git's main path waits
        # for it, and git then says so and exits 128: git's race, not the run's.
        raced = proc.returncode == 128 and "waitpid for git-fabro failed" in stderr
        assert proc.returncode in (130, -signal.SIGINT) or raced, stderr
    else:
        assert proc.returncode == 130, stderr
    assert took < 5, f"took {took:.1f}s to stop"
    assert "Traceback" not in stderr
    # Said once: the run's own notice, with no second line from the command repeating it.
    assert stderr.count(f"git fabro resume {run_id}") == 1, stderr
    # The stage's shell and its sleep are gone (they ran in their own session, so only
    # the engine could have stopped them).
    assert stage and not [
        p for p in stage if p in pids_with_env(FABRO_RUN_ID=run_id, FABRO_NODE_ID="nap")
    ]

    ps = {
        r["run_id"]: r
        for r in map(json.loads, run_fabro("ps", "--json", cwd=repo).stdout.splitlines())
    }
    assert ps[run_id]["status"] == "interrupted"
    assert ps[run_id]["current_node"] == "nap"
    info = json.loads(run_fabro("inspect", run_id, "--json", cwd=repo).stdout)
    assert info["status"] == "interrupted" and info["live"] is False
    cp = info["checkpoint"]
    assert cp["status"] == "interrupted"
    assert cp["next_node_id"] == "nap"
    assert cp["completed_nodes"] == ["start", "one"]
    assert (
        git(repo, "log", "-1", "--format=%s", f"refs/fabro/meta/{run_id}")
        == "finalize interrupted\n"
    )

    events = run_events(run_id, repo)
    names = [e["event"] for e in events]
    assert "run.completed" not in names and "run.failed" not in names
    notice = [
        e
        for e in events
        if e["event"] == "run.notice" and e["properties"].get("code") == "interrupted"
    ]
    assert len(notice) == 1
    assert not any(e["event"] == "stage.completed" and e.get("node_id") == "nap" for e in events)
    # The interrupted stage's half-done work is not on the run branch.
    branch = f"fabro/run/{run_id}"
    assert "nap.txt" not in git(repo, "ls-tree", "--name-only", branch)

    (hermetic_env / "quick").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert git(repo, "show", f"{branch}:one.txt") == "one\n"
    assert git(repo, "show", f"{branch}:nap.txt") == "napped\n"
    events = run_events(run_id, repo)
    names = [e["event"] for e in events]
    assert names.count("run.completed") == 1
    assert len({e["id"] for e in events}) == len(events)
    subjects = git(repo, "log", "--reverse", "--format=%s", f"main..{branch}").splitlines()
    assert subjects == [
        f"fabro({run_id}): {n} (succeeded)" for n in ("start", "one", "nap", "exit")
    ]
    fsck = subprocess.run(
        ["git", "fsck", "--strict", "--no-dangling"], cwd=repo, capture_output=True, text=True
    )
    assert fsck.returncode == 0 and not fsck.stdout.strip(), fsck.stdout + fsck.stderr


def test_ctrl_c_at_a_human_gate_waiting_on_the_terminal(repo: Path, tmp_path: Path) -> None:
    """The gate blocks reading the terminal; Ctrl-C must still stop the run at once."""
    workflow = tmp_path / "gate.fabro"
    workflow.write_text(
        "digraph G {\n"
        "  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  ask [shape=hexagon, label="Go on?"]\n'
        '  start -> ask\n  ask -> exit [label="[Y] Yes"]\n  ask -> exit [label="[N] No"]\n'
        "}\n"
    )
    leader, follower = pty.openpty()
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"? Go on?" not in seen:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break
        time.sleep(0.2)  # now blocked reading the terminal
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=15)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            while os.read(leader, 4096):
                pass
        os.close(leader)
    assert code == 130, seen.decode(errors="replace")
    assert took < 5
    (run_id,) = git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta").split()
    info = json.loads(run_fabro("inspect", run_id, "--json", cwd=repo).stdout)
    assert info["checkpoint"]["status"] == "interrupted"
    assert info["checkpoint"]["next_node_id"] == "ask"
    # Resumed with an answer queued, the gate takes it and the run completes.
    resumed = run_fabro("resume", run_id, "--answer", "N", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    events = run_events(run_id, repo)
    answered = [
        e for e in events if e["event"].startswith("interview.") and e.get("node_id") == "ask"
    ]
    assert answered, [e["event"] for e in events]
    edge = [
        e for e in events if e["event"] == "edge.selected" and e["properties"]["from_node"] == "ask"
    ]
    assert [e["properties"]["label"] for e in edge] == ["[N] No"]


def test_a_killed_run_shows_how_long_it_ran(repo: Path, tmp_path: Path) -> None:
    """A run killed outright records no end: `ps` shows it ran from its start to its
    last event, not the time its last checkpoint had counted."""
    workflow = tmp_path / "slow.fabro"
    # `slow` times out after half a second (no checkpoint meanwhile), and is tried again.
    workflow.write_text(
        "digraph Slow { start [shape=Mdiamond] exit [shape=Msquare]\n"
        '  slow [shape=parallelogram, max_retries=1, timeout="500ms", script="sleep 600"]\n'
        "  start -> slow -> exit }\n"
    )
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def retrying() -> str | None:
        ids = git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta")
        run_id = ids.split()[0] if ids.split() else None
        return run_id if run_id and tail_has(run_id, "stage.retrying", "slow") else None

    try:
        run_id = wait_until(retrying, process=proc, limit=60, what="the retry of slow")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in pids_with_env(FABRO_RUN_ID=run_id, FABRO_NODE_ID="slow"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (row,) = [json.loads(line) for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()]
    assert row["status"] == "interrupted"
    # The time the last checkpoint counted, and the timeout waited after it.
    counted = read_checkpoint(repo, f"refs/fabro/meta/{run_id}")["active_ms"]
    assert row["duration_ms"] >= counted + 500, (row, counted)
    table = run_fabro("ps", cwd=repo).stdout.splitlines()
    assert f"{row['duration_ms'] / 1000:.1f}s" in table[1], table


def test_after_ctrl_c_a_narrow_terminal_shows_the_resume_command_whole(
    repo: Path, tmp_path: Path
) -> None:
    """Lines a person copies (the run id, `git fabro resume ID`) are never cut to the
    terminal's width: the terminal wraps them, with no newline of ours inside."""
    workflow = tmp_path / "nap.fabro"
    workflow.write_text(WORKFLOW)
    with Terminal(["run", str(workflow)], repo, env={"COLUMNS": "50"}, stdin=False) as terminal:

        def at_nap() -> str | None:
            terminal.received_within(0.05)  # the spinner draws meanwhile: read it
            ids = git(
                repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta"
            ).split()
            if not ids or not tail_has(ids[0], "stage.started", "nap"):
                return None
            return (
                ids[0]
                if len(pids_with_env(FABRO_RUN_ID=ids[0], FABRO_NODE_ID="nap")) >= 2
                else None
            )

        run_id = wait_until(at_nap, process=terminal.proc, limit=30, what="the run reaching nap")
        os.kill(terminal.proc.pid, signal.SIGINT)
        code = terminal.close(timeout=30)
    text = TERMINAL_ESCAPES.sub(b"", terminal.seen).decode(errors="replace")
    assert code == 130, text
    assert f"(run {run_id})" in text, text
    assert f"continue it with `git fabro resume {run_id}` [interrupted]" in text, text
    assert "Traceback" not in text
