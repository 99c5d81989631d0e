"""The local scratch dir is disposable: git holds everything `logs`, `inspect` and
`resume` need, and resume rebuilds the worktree from the run branch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import (
    assert_fsck_clean,
    git,
    run_fabro,
    run_json,
    start_fabro,
    wait_until,
    write_workflow,
)

# `two` reads the file `one` wrote: after the scratch dir is gone, that file can only
# come from the run branch.
WORKFLOW = """\
digraph Scratch {
    graph [goal="outlive the scratch dir"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    one   [shape=parallelogram, script="printf 'one\\\\n' > one.txt"]
    gate  [shape=parallelogram, script="%s"]
    two   [shape=parallelogram, script="cat one.txt > two.txt && printf 'two\\\\n' >> two.txt"]
    start -> one -> gate -> two -> exit
}
"""
WAIT_FOR_GO = 'while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done'
FAIL_WITHOUT_GO = 'test -f \\"$HOME/go\\"'


def _scratch_root() -> Path:
    return Path(os.environ["FABRO_HOME"]) / "runs"


def _scratch(repo: Path, run_id: str) -> Path:
    from fabro_git.config.locations import run_scratch_dir

    return run_scratch_dir(repo / ".git", run_id)


def _events(repo: Path, run_id: str) -> list[dict]:
    proc = run_fabro("logs", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _inspect(repo: Path, run_id: str) -> dict:
    proc = run_fabro("inspect", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _worktrees(repo: Path) -> list[str]:
    listing = git(repo, "worktree", "list", "--porcelain")
    return [ln.split(" ", 1)[1] for ln in listing.splitlines() if ln.startswith("worktree ")]


def _workflow(tmp_path: Path, gate: str) -> Path:
    path = tmp_path / "scratch.fabro"
    path.write_text(WORKFLOW % gate)
    return path


def _interrupted_run(repo: Path, workflow: Path) -> str:
    """Start the run and kill -9 it while `gate` waits; returns the run id."""
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def at_the_gate() -> bool:
        tails = list(_scratch_root().glob("*/events.jsonl"))
        lines = tails[0].read_text().splitlines() if tails else []
        return any('"stage.started"' in ln and '"node_id":"gate"' in ln for ln in lines)

    try:
        wait_until(at_the_gate, process=proc, limit=30, what="the gate")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (run_id,) = git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta").split()
    return run_id


def _finish_and_check(repo: Path, run_id: str, home: Path) -> None:
    (home / "go").write_text("")
    proc = run_fabro("resume", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    branch = f"fabro/run/{run_id}"
    assert git(repo, "show", f"{branch}:one.txt") == "one\n"
    assert git(repo, "show", f"{branch}:two.txt") == "one\ntwo\n"
    assert _inspect(repo, run_id)["status"] == "succeeded"
    names = [e["event"] for e in _events(repo, run_id)]
    assert names.count("run.completed") == 1
    # The registration of the deleted worktree was pruned; the rebuilt one removed.
    assert _worktrees(repo) == [str(repo)]
    assert_fsck_clean(repo)


def test_interrupted_run_survives_losing_its_scratch_dir(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    run_id = _interrupted_run(repo, _workflow(tmp_path, WAIT_FOR_GO))
    scratch = _scratch(repo, run_id)
    assert (scratch / "worktree" / "one.txt").is_file()
    before = _events(repo, run_id)
    shutil.rmtree(scratch)

    after = _events(repo, run_id)
    # Only what the last snapshot held is left, and it is exactly that prefix.
    assert [e["id"] for e in after] == [e["id"] for e in before[: len(after)]]
    assert any(e["event"] == "stage.completed" and e.get("node_id") == "one" for e in after)
    assert "run.created" in [e["event"] for e in after]
    pretty = run_fabro("logs", run_id, "--pretty", cwd=repo)
    assert pretty.returncode == 0 and "one" in pretty.stdout
    info = _inspect(repo, run_id)
    assert info["status"] == "interrupted"
    assert info["live"] is False
    assert info["scratch_dir"] is None
    assert info["checkpoint"]["completed_nodes"] == ["start", "one"]
    assert info["checkpoint"]["next_node_id"] == "gate"
    human = run_fabro("inspect", run_id, cwd=repo)
    assert human.returncode == 0 and "interrupted" in human.stdout
    ps = run_fabro("ps", cwd=repo)
    assert run_id in ps.stdout and "interrupted" in ps.stdout

    _finish_and_check(repo, run_id, hermetic_env)
    events = _events(repo, run_id)
    assert any(e["event"] == "stage.completed" and e.get("node_id") == "two" for e in events)
    # The resumed run worked in a new worktree, checked out from the run branch.
    assert not any(e["event"] == "git.reset" for e in events[len(after) :])


def test_failed_run_survives_losing_its_scratch_dir(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    proc = run_fabro("run", str(_workflow(tmp_path, FAIL_WITHOUT_GO)), "--json", cwd=repo)
    assert proc.returncode == 1
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    shutil.rmtree(_scratch(repo, run_id))

    events = _events(repo, run_id)
    names = [e["event"] for e in events]
    assert "run.failed" in names and "run.completed" not in names
    failed = next(e for e in events if e["event"] == "stage.failed")
    assert failed["node_id"] == "gate"
    info = _inspect(repo, run_id)
    assert info["status"] == "failed"
    assert info["checkpoint"]["next_node_id"] == "gate"
    assert "gate" in info["checkpoint"]["error"]
    _finish_and_check(repo, run_id, hermetic_env)


def test_resume_rebuilds_a_worktree_deleted_behind_gits_back(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """Only the worktree goes (the tail stays): its events after the last snapshot are
    kept, and the worktree is rebuilt from the run branch."""
    run_id = _interrupted_run(repo, _workflow(tmp_path, WAIT_FOR_GO))
    before = _events(repo, run_id)
    shutil.rmtree(_scratch(repo, run_id) / "worktree")
    assert len(_worktrees(repo)) == 2  # git still has it registered
    _finish_and_check(repo, run_id, hermetic_env)
    ids = {e["id"] for e in _events(repo, run_id)}
    assert {e["id"] for e in before} <= ids


@pytest.mark.parametrize("what", ["scratch", "worktree-only"])
def test_finished_run_needs_no_scratch_dir(repo: Path, what: str) -> None:
    proc = run_fabro("run", "hello", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    run_id = result["run_id"]
    scratch = _scratch(repo, run_id)
    assert not (scratch / "worktree").exists()  # removed when the run succeeded
    before = _events(repo, run_id)
    if what == "scratch":
        shutil.rmtree(scratch)
    else:
        (scratch / "events.jsonl").unlink()
    after = _events(repo, run_id)
    assert [e["id"] for e in after] == [e["id"] for e in before[: len(after)]]
    assert [e["event"] for e in after].count("run.completed") == 1
    # What only the tail held: the events after the final snapshot was taken.
    assert all(e["event"].startswith("metadata.snapshot") for e in before[len(after) :])
    info = _inspect(repo, run_id)
    assert info["status"] == "succeeded"
    assert info["run_branch_sha"] == result["final_git_commit_sha"]
    assert git(repo, "show", f"fabro/run/{run_id}:hello.txt").startswith("Hello from git fabro!")
    again = run_fabro("resume", run_id, cwd=repo)
    assert again.returncode == 0 and "already finished" in again.stderr
    rows = [json.loads(line) for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()]
    assert [(r["run_id"], r["status"]) for r in rows] == [(run_id, "succeeded")]


def test_resume_makes_the_branch_of_a_run_cut_off_before_it_existed(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph B {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            work [shape=parallelogram, script="echo done > done.txt"]
            start -> work -> exit
        }
        """,
    )
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0
    (run_id,) = [
        r.rsplit("/", 1)[1]
        for r in git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    ]
    # Rebuild the state a kill right after the `init` snapshot leaves: meta ref at init,
    # no run branch, no scratch.
    init = git(repo, "rev-list", "--max-parents=0", f"refs/fabro/meta/{run_id}").strip()
    git(repo, "update-ref", f"refs/fabro/meta/{run_id}", init)
    git(repo, "update-ref", "-d", f"refs/heads/fabro/run/{run_id}")
    shutil.rmtree(_scratch(repo, run_id))
    resumed, result = run_json("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert result["status"] == "succeeded"
    assert git(repo, "show", f"fabro/run/{run_id}:done.txt") == "done\n"
    base = git(repo, "rev-parse", "main").strip()
    assert (
        git(repo, "rev-list", "--max-parents=0", f"fabro/run/{run_id}").strip()
        == git(repo, "rev-list", "--max-parents=0", base).strip()
    )
