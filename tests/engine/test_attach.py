"""`git fabro attach`: another terminal follows a live run and answers its human gates.

A detached run's gate waits for an attached answer; a run that has ended prints its
result; an unknown run is a clear error; the first answer, here or at the run's own
terminal, wins.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import Terminal, git, run_events, run_fabro, start_fabro, write_workflow


def test_attach_answers_a_detached_runs_gate(repo: Path) -> None:
    started = run_fabro("run", "human-gate", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    term = Terminal(["attach", run_id], repo)
    try:
        text = term.read_until(b"\n> ")
        assert "? Publish these notes?" in text and "[A] Approve" in text
        assert "│ - First draft." in text  # what the gate is about
        term.type("maybe\n")  # a typo is asked again, not sent
        term.read_until(b"is none of the choices; type one of: [A] Approve, [R] Revise")
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


def test_attach_shows_the_stage_before_its_gate_then_asks_cleanly(repo: Path) -> None:
    """A gate that opens while attached: the stage that led to it is shown ended first,
    the spinner is gone, and the question ends at a `>` prompt nothing draws over."""
    started = run_fabro("run", "human-gate", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    term = Terminal(["attach", run_id], repo)
    try:
        term.read_until(b"\n> ")
        term.type("R\n")  # the revise stage runs while attached, then the gate asks again
        text = term.read_until(b"\n> ", count=2)
        after = term.received_within(0.6)
        assert after == b"", after  # no spinner redrawn over the prompt
        term.type("A\n")
        text = term.read_until(b"Result: branch")
        code = term.close()
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
            term.close()
    assert code == 0, text
    second = text[text.index("\n> ") + 3 :]
    asked = second[: second.index("\n> ")]
    assert asked.index("Revise (revise): succeeded") < asked.index("? Publish these notes?"), asked
    question = asked[asked.index("? Publish these notes?") :]
    assert "[A] Approve" in question and "[R] Revise" in question, asked


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


def test_first_answer_wins_between_the_runs_terminal_and_attach(repo: Path, tmp_path: Path) -> None:
    """A run asking at its own terminal can be answered from an attached one too, and
    its terminal still answers the next gate."""
    run_term = Terminal(["run", "human-gate"], repo)
    attach = None
    try:
        run_term.read_until(b"\n> ")
        (row,) = [
            json.loads(line) for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()
        ]
        attach_log = tmp_path / "attach.log"
        with attach_log.open("w") as log:
            attach = start_fabro(
                ["attach", row["run_id"]],
                cwd=repo,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        assert attach.stdin is not None
        attach.stdin.write("R\n")
        attach.stdin.close()
        text = run_term.read_until(b"answered from git fabro attach: R")
        # Asked again after the revision: this time at the run's own terminal.
        run_term.read_until(b"- Revised.", count=2)  # the revise stage's, the question's
        run_term.read_until(b"\n> ", count=2)
        run_term.type("A\n")
        text = run_term.read_until(b"Result: branch")
        code = run_term.close()
        attach.wait(timeout=90)
        attach_err = attach_log.read_text()
    finally:
        if run_term.proc.poll() is None:
            run_term.close()
        if attach is not None and attach.poll() is None:
            attach.kill()
            attach.wait()
    assert code == 0, text
    assert attach.returncode == 0, attach_err
    assert "answered at the run's terminal: A" in attach_err
    notes = git(repo, "show", f"fabro/run/{row['run_id']}:RELEASE.md")
    assert notes.count("- Revised.") == 1  # R from attach, then A at the terminal


def test_a_detached_gate_keeps_its_timeout(repo: Path) -> None:
    """Nobody attaches: the gate's own timeout still ends the wait, with its default.
    (That waiting on a person is no stall is shown in process, on a MockClock:
    inprocess/test_walk_inprocess.py.)"""
    write_workflow(
        repo,
        "digraph T { start [shape=Mdiamond] exit [shape=Msquare]\n"
        '  ask [shape=hexagon, label="Ship?", human.timeout="300ms", human.default_choice="hold"]\n'
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
    assert "interview.timeout" in names and "watchdog.timeout" not in names
    assert git(repo, "show", f"fabro/run/{run_id}:held.txt").strip() == "held"
