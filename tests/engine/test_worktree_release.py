"""A run that ends, however it ends, releases its worktree: the user's checkout can switch
to the run branch, `git worktree list` shows only the user's own worktrees, and resume
checks the branch out again from git."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from helpers import assert_fsck_clean, git, run_fabro, start_fabro, wait_until, write_workflow

# `check` fails until $HOME/ok exists; `wait` waits for $HOME/go unless told not to.
WORKFLOW = """\
digraph Release {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="echo made > made.txt && mkdir -p cache && echo c > cache/c"]
    wait  [shape=parallelogram, script="%s"]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\" && echo checked > checked.txt"]
    start -> make -> wait -> check -> exit
}
"""
NO_WAIT = "true"
WAIT_FOR_GO = 'while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done'


def _worktrees(repo: Path) -> list[str]:
    listing = git(repo, "worktree", "list", "--porcelain")
    return [ln.split(" ", 1)[1] for ln in listing.splitlines() if ln.startswith("worktree ")]


def _scratch(repo: Path, run_id: str) -> Path:
    from fabro_git.config.locations import run_scratch_dir

    return run_scratch_dir(repo / ".git", run_id)


def _status(repo: Path, run_id: str) -> str:
    proc = run_fabro("inspect", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["status"])


def _setup(repo: Path, wait: str) -> Path:
    (repo / ".gitignore").write_text("cache/\n")
    git(repo, "add", ".gitignore")
    return write_workflow(repo, WORKFLOW % wait, "release.fabro")


def _resume_and_check(repo: Path, run_id: str, home: Path) -> None:
    (home / "ok").write_text("")
    (home / "go").write_text("")
    proc = run_fabro("resume", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["status"] == "succeeded"
    branch = f"fabro/run/{run_id}"
    assert git(repo, "show", f"{branch}:made.txt") == "made\n"
    assert git(repo, "show", f"{branch}:checked.txt") == "checked\n"
    assert _worktrees(repo) == [str(repo)]
    assert_fsck_clean(repo)


def test_a_failed_run_releases_its_worktree_and_resumes(repo: Path, hermetic_env: Path) -> None:
    _setup(repo, NO_WAIT)
    proc = run_fabro("run", "release.fabro", "--json", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    assert _status(repo, run_id) == "failed"
    assert _worktrees(repo) == [str(repo)]
    assert not (_scratch(repo, run_id) / "worktree").exists()
    assert (_scratch(repo, run_id) / "events.jsonl").is_file()  # only the worktree goes

    # The user can look at the run's work in their own checkout, and leave it again.
    switched = subprocess.run(
        ["git", "switch", f"fabro/run/{run_id}"], cwd=repo, capture_output=True, text=True
    )
    assert switched.returncode == 0, switched.stderr
    assert (repo / "made.txt").read_text() == "made\n"
    assert not (repo / "cache").exists()  # ignored: never part of the run's commits
    git(repo, "switch", "-q", "main")

    _resume_and_check(repo, run_id, hermetic_env)


def test_resume_while_the_user_has_the_run_branch_checked_out_says_so(repo: Path) -> None:
    _setup(repo, NO_WAIT)
    proc = run_fabro("run", "release.fabro", "--json", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    git(repo, "switch", "-q", f"fabro/run/{run_id}")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 1, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert f"fabro/run/{run_id}" in resumed.stderr and str(repo) in resumed.stderr
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == f"fabro/run/{run_id}"
    # The user's own checkout goes back to the branch the run started from; git never
    # removes a main worktree, so that is not suggested.
    suggested = f"git -C {repo} switch main"
    assert f"hint: switch that checkout to another branch ({suggested})" in resumed.stderr
    assert "worktree remove" not in resumed.stderr
    subprocess.run(suggested.split(), check=True, capture_output=True)
    again = run_fabro("resume", run_id, cwd=repo)  # `check` fails again: no $HOME/ok
    assert "is checked out at" not in again.stderr and "check" in again.stderr, again.stderr


def _wait_for_stage(repo: Path, proc: subprocess.Popen[bytes], node: str) -> str:
    """The run's id, once its tail says `node` started (the stage then waits for go)."""
    root = Path(os.environ["FABRO_HOME"]) / "runs"

    def started() -> str | None:
        for tail in root.glob("*/events.jsonl"):
            for line in tail.read_bytes().split(b"\n")[:-1]:
                event = json.loads(line)
                if event["event"] == "stage.started" and event.get("node_id") == node:
                    return tail.parent.name[:26]
        return None

    return wait_until(started, process=proc, limit=60, what=f"the start of {node}")


def test_an_interrupted_run_releases_its_worktree_and_resumes(
    repo: Path, hermetic_env: Path
) -> None:
    _setup(repo, WAIT_FOR_GO)
    proc = start_fabro(
        ["run", "release.fabro"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        run_id = _wait_for_stage(repo, proc, "wait")
        assert len(_worktrees(repo)) == 2  # the live run works in its own checkout
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.decode()
    assert _status(repo, run_id) == "interrupted"
    assert _worktrees(repo) == [str(repo)]
    assert not (_scratch(repo, run_id) / "worktree").exists()
    switched = subprocess.run(
        ["git", "switch", f"fabro/run/{run_id}"], cwd=repo, capture_output=True, text=True
    )
    assert switched.returncode == 0, switched.stderr
    git(repo, "switch", "-q", "main")
    _resume_and_check(repo, run_id, hermetic_env)


def test_a_succeeded_run_leaves_only_the_main_worktree(repo: Path) -> None:
    for _ in range(2):
        proc = run_fabro("run", "hello", cwd=repo)
        assert proc.returncode == 0, proc.stderr
    proc = run_fabro("run", "parallel-review", "--dry-run", "--auto-approve", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert _worktrees(repo) == [str(repo)]
