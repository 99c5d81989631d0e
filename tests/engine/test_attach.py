"""`git fabro attach`: another terminal follows a live run and answers its human gates.

A detached run's gate waits for an attached answer; a run that has ended prints its
result; an unknown run is a clear error; the first answer, here or at the run's own
terminal, wins.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import time
from pathlib import Path

from helpers import fabro_exe, git, run_events, run_fabro, write_workflow

ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _read_until(fd: int, marker: bytes, seen: bytes = b"", limit: float = 90) -> bytes:
    deadline = time.monotonic() + limit
    while marker not in ESCAPES.sub(b"", seen):
        assert time.monotonic() < deadline, seen.decode(errors="replace")
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


class _Terminal:
    """A command on a pty, as a person at a terminal runs it."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        import pty

        self.leader, follower = pty.openpty()
        env = {**os.environ, "TERM": "xterm-256color"}
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=follower,
            stdout=follower,
            stderr=follower,
            start_new_session=True,
            env=env,
        )
        os.close(follower)
        self.seen = b""

    def read_until(self, marker: bytes) -> str:
        self.seen = _read_until(self.leader, marker, self.seen)
        return ESCAPES.sub(b"", self.seen).decode(errors="replace")

    def type(self, text: str) -> None:
        os.write(self.leader, text.encode())

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=90)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            with contextlib.suppress(OSError):
                while os.read(self.leader, 4096):
                    pass
            os.close(self.leader)


def test_attach_answers_a_detached_runs_gate(repo: Path) -> None:
    started = run_fabro("run", "human-gate", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    term = _Terminal([*fabro_exe(), "attach", run_id], repo)
    try:
        text = term.read_until(b"\n> ")
        assert "? Publish these notes?" in text and "[A] Approve" in text
        assert "│ - First draft." in text  # what the gate is about
        term.type("A\n")
        text = term.read_until(b"Result: branch")
        code = term.close()
    finally:
        if term.proc.poll() is None:
            term.close()
    assert code == 0, text
    assert f"run {run_id} succeeded" in text
    assert "Publish (publish): succeeded" in text  # the run's own progress display
    assert git(repo, "show", f"fabro/run/{run_id}:RELEASE.md").startswith("# Release notes")
    (done,) = [e for e in run_events(run_id, repo) if e["event"] == "interview.completed"]
    assert done["properties"]["answer"] == "A"

    # Attached again after the end: the result, and the run's exit status.
    again = run_fabro("attach", run_id[:10], cwd=repo)
    assert again.returncode == 0, again.stderr
    assert f"run {run_id} succeeded" in again.stderr and "Result: branch" in again.stderr


def test_attach_to_an_ended_or_unknown_run(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph F { start [shape=Mdiamond] exit [shape=Msquare]\n"
        '  boom [shape=parallelogram, script="exit 3"]\n  start -> boom -> exit }\n',
    )
    failed = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert failed.returncode == 1
    run_id = json.loads(failed.stdout.splitlines()[-1])["run_id"]
    attached = run_fabro("attach", run_id, cwd=repo)
    assert attached.returncode == 1
    assert f"run {run_id} failed" in attached.stderr
    assert f"git fabro resume {run_id}" in attached.stderr

    unknown = run_fabro("attach", "01NOSUCHRUN", cwd=repo)
    assert unknown.returncode == 1
    assert "no run matches '01NOSUCHRUN'" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_first_answer_wins_between_the_runs_terminal_and_attach(repo: Path) -> None:
    """A run asking at its own terminal can be answered from an attached one too."""
    run_term = _Terminal([*fabro_exe(), "run", "human-gate"], repo)
    try:
        run_term.read_until(b"\n> ")
        (row,) = [
            json.loads(line) for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()
        ]
        attached = run_fabro("attach", row["run_id"], cwd=repo, input="R\nA\n")
        assert attached.returncode == 0, attached.stderr
        text = run_term.read_until(b"Result: branch")
        code = run_term.close()
    finally:
        if run_term.proc.poll() is None:
            run_term.close()
    assert code == 0, text
    assert "answered from git fabro attach: R" in text
    notes = git(repo, "show", f"fabro/run/{row['run_id']}:RELEASE.md")
    assert notes.count("- Revised.") == 1  # R from attach, then A from attach


def test_a_detached_gate_keeps_its_timeout(repo: Path) -> None:
    """Nobody attaches: the gate's own timeout still ends the wait, with its default."""
    write_workflow(
        repo,
        "digraph T { start [shape=Mdiamond] exit [shape=Msquare]\n"
        '  ask [shape=hexagon, label="Ship?", human.timeout="1s", human.default_choice="hold"]\n'
        '  hold [shape=parallelogram, script="echo held > held.txt"]\n'
        '  start -> ask\n  ask -> exit [label="[S] Ship"]\n  ask -> hold [label="[H] Hold"]\n'
        "  hold -> exit }\n",
    )
    started = run_fabro("run", "wf.fabro", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    waited = run_fabro("wait", run_id, cwd=repo, timeout=120)
    assert waited.returncode == 0, waited.stderr
    names = [e["event"] for e in run_events(run_id, repo)]
    assert "interview.timeout" in names
    assert git(repo, "show", f"fabro/run/{run_id}:held.txt").strip() == "held"
