"""Human gates read answers from a pipe or a file on stdin, one a line; at EOF they fail
closed and say how to answer instead."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import fabro_exe, git, run_fabro


def _run(repo: Path, stdin: bytes | Path | None) -> subprocess.CompletedProcess[str]:
    argv = [*fabro_exe(), "run", "human-gate", "--json"]
    if isinstance(stdin, Path):
        with stdin.open("rb") as fh:
            return subprocess.run(
                argv, cwd=repo, stdin=fh, capture_output=True, text=True, timeout=120
            )
    if stdin is None:
        return subprocess.run(
            argv, cwd=repo, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )
    return subprocess.run(
        argv, cwd=repo, input=stdin.decode(), capture_output=True, text=True, timeout=120
    )


def _result(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_piped_answers_drive_the_gates(repo: Path) -> None:
    proc = _run(repo, b"R\nA\n")
    assert proc.returncode == 0, proc.stderr
    run_id = _result(proc)["run_id"]
    notes = git(repo, "show", f"fabro/run/{run_id}:RELEASE.md")
    assert notes.count("- Revised.") == 1  # one revision, then approved
    answers = [
        e["properties"]["answer"]
        for e in map(json.loads, run_fabro("logs", run_id, cwd=repo).stdout.splitlines())
        if e["event"] == "interview.completed"
    ]
    assert answers == ["R", "A"]


def test_answers_from_a_file(repo: Path, tmp_path: Path) -> None:
    answers = tmp_path / "answers.txt"
    answers.write_text("A\n")
    proc = _run(repo, answers)
    assert proc.returncode == 0, proc.stderr
    assert _result(proc)["status"] == "succeeded"


def test_pipe_runs_dry_then_fails_closed_with_a_hint(repo: Path) -> None:
    proc = _run(repo, b"R\n")
    assert proc.returncode == 1
    assert _result(proc)["status"] == "failed"
    assert "was not answered; failing closed" in proc.stderr
    assert "--answer" in proc.stderr and "--auto-approve" in proc.stderr


def test_dev_null_fails_closed_without_asking(repo: Path) -> None:
    proc = _run(repo, None)
    assert proc.returncode == 1
    assert "? Publish these notes?" not in proc.stderr
    assert "failing closed" in proc.stderr


def test_an_answer_no_gate_can_take_is_refused_before_the_run(repo: Path) -> None:
    proc = run_fabro("run", "human-gate", "--answer", "R", "--answer", "Aprove", cwd=repo)
    assert proc.returncode == 1
    assert "--answer 'Aprove' matches no choice of any human gate" in proc.stderr
    assert "[A] Approve" in proc.stderr and "Traceback" not in proc.stderr
    assert run_fabro("ps", "--json", cwd=repo).stdout == ""  # no run was created
    for good in (["A"], ["approve"], ["publish"], ["[R] Revise", "A"]):
        argv = [arg for answer in good for arg in ("--answer", answer)]
        assert run_fabro("run", "human-gate", *argv, cwd=repo).returncode == 0, good
