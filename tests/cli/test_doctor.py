"""`git fabro doctor`: each check against a real machine state it should catch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import fabro_exe, git, run_fabro, run_json, write_workflow

FAILS = """\
digraph Fails {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    work [shape=parallelogram, script="echo work > work.txt"]
    boom [shape=parallelogram, script="exit 3"]
    start -> work -> boom -> exit
}
"""


def _checks(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    doc = json.loads(proc.stdout)
    return {c["name"]: c for c in doc["checks"]}


def test_a_clean_machine_passes_with_a_warning_for_missing_keys(repo: Path) -> None:
    proc = run_fabro("doctor", cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for name in ("git", "graphviz", "providers", "scratch", "locks", "worktrees"):
        assert any(line.split()[1] == f"{name}:" for line in lines if line.strip()), name
    assert any(line.startswith("warn") and "providers:" in line for line in lines)
    assert "fix: export one of ANTHROPIC_API_KEY" in proc.stdout
    checks = _checks(run_fabro("doctor", "--json", cwd=repo))
    assert checks["git"]["status"] == "ok" and checks["providers"]["status"] == "warn"


def test_provider_keys_are_found_but_never_shown(repo: Path) -> None:
    secret = "sk-ant-test-0123456789abcdef0123456789"
    proc = run_fabro("doctor", "--json", cwd=repo, env={"ANTHROPIC_API_KEY": secret})
    assert proc.returncode == 0
    assert secret not in proc.stdout
    checks = _checks(proc)
    assert checks["providers"]["status"] == "ok" and "anthropic" in checks["providers"]["message"]

    half = run_fabro("doctor", cwd=repo, env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert half.returncode == 1
    assert "problem  provider openai: OPENAI_BASE_URL is set but no key is" in half.stdout
    assert "fix: export OPENAI_API_KEY=" in half.stdout


def test_a_scratch_dir_others_can_read_is_a_problem(repo: Path, hermetic_env: Path) -> None:
    runs = hermetic_env / "fabro" / "runs"
    runs.mkdir(parents=True)
    os.chmod(runs, 0o755)
    proc = run_fabro("doctor", cwd=repo)
    assert proc.returncode == 1
    assert "problem  scratch:" in proc.stdout and f"fix: chmod 700 {runs}" in proc.stdout
    os.chmod(runs, 0o700)
    assert run_fabro("doctor", cwd=repo).returncode == 0


def test_stale_locks_are_found(repo: Path) -> None:
    write_workflow(repo, FAILS)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    run_id = result["run_id"]
    ref_lock = repo / ".git" / "refs" / "fabro" / "meta" / f"{run_id}.lock"
    ref_lock.write_text("")
    proc = run_fabro("doctor", cwd=repo)
    assert proc.returncode == 1
    assert "problem  locks: 1 ref lock(s)" in proc.stdout and f"fix: rm {ref_lock}" in proc.stdout
    ref_lock.unlink()

    orphan = repo / ".git" / "fabro" / "locks" / "01AAAAAAAAAAAAAAAAAAAAAAAA.lock"
    orphan.write_text("pid 1\n")
    proc = run_fabro("doctor", "--json", cwd=repo)
    assert proc.returncode == 0
    locks = _checks(proc)["locks"]
    assert locks["status"] == "warn" and str(orphan) in locks["fix"]
    orphan.unlink()
    assert _checks(run_fabro("doctor", "--json", cwd=repo))["locks"]["status"] == "ok"


def test_worktrees_of_deleted_runs_are_leftovers(repo: Path) -> None:
    write_workflow(repo, FAILS)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    scratch = json.loads(run_fabro("inspect", run_id, "--json", cwd=repo).stdout)["scratch_dir"]
    # A failed run releases its worktree; a killed one keeps it, as made here. A parallel
    # branch's worktree lies deeper in the run's scratch dir.
    git(repo, "worktree", "add", "-q", "--detach", f"{scratch}/worktree", "HEAD")
    git(repo, "worktree", "add", "-q", "--detach", f"{scratch}/parallel/boom-1/0", "HEAD")
    kept = _checks(run_fabro("doctor", "--json", cwd=repo))["worktrees"]
    assert kept["status"] == "ok" and "2 kept for resumable runs" in kept["message"]
    git(repo, "worktree", "remove", f"{scratch}/parallel/boom-1/0")

    git(repo, "update-ref", "-d", f"refs/fabro/meta/{run_id}")
    proc = run_fabro("doctor", cwd=repo)
    assert proc.returncode == 0
    assert (
        "warn     worktrees: leftover run worktrees: 1 of runs that no longer exist" in proc.stdout
    )
    fix = next(line for line in proc.stdout.splitlines() if "git worktree remove" in line)
    command = fix.split("fix: ", 1)[1]
    subprocess.run(command, shell=True, cwd=repo, check=True)
    assert _checks(run_fabro("doctor", "--json", cwd=repo))["worktrees"]["status"] == "ok"


def test_old_git_and_missing_graphviz(tmp_path: Path) -> None:
    """A git older than 2.31 is a problem; no `dot` only limits `graph`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    real_git = shutil.which("git")
    assert real_git
    fake = bindir / "git"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "git version 2.20.1"; exit 0; }}\nexec {real_git} "$@"\n'
    )
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{bindir}")
    proc = subprocess.run(
        [*fabro_exe(), "doctor"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "problem  git: git 2.20.1 is older than 2.31" in proc.stdout
    assert "warn     graphviz: `dot` is not on PATH" in proc.stdout
    assert "repository: not inside a git repository" in proc.stdout


def test_scratch_dirs_of_a_deleted_repository_are_reported_and_pruned(
    repo: Path, tmp_path: Path
) -> None:
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    git(doomed, "init", "-q", "-b", "main")
    git(doomed, "commit", "-q", "--allow-empty", "-m", "initial")
    proc, _ = run_json("run", "hello", cwd=doomed)
    assert proc.returncode == 0, proc.stderr
    runs = Path(os.environ["FABRO_HOME"]) / "runs"
    (scratch,) = list(runs.iterdir())
    old = scratch.stat().st_mtime - 7 * 86400  # past the grace period a new run gets
    os.utime(scratch, (old, old))
    before = json.loads(run_fabro("doctor", "--json", cwd=repo).stdout)
    assert next(c for c in before["checks"] if c["name"] == "abandoned scratch")["status"] == "ok"
    shutil.rmtree(doomed)
    after = run_fabro("doctor", cwd=repo)
    assert (
        f"abandoned scratch: 1 scratch dir(s) of repositories that no longer exist: {scratch}"
        in (after.stdout)
    )
    pruned = run_fabro("prune", "-y", cwd=repo)
    assert pruned.returncode == 0, pruned.stderr
    assert f"scratch   {scratch}" in pruned.stdout and not scratch.exists()


def _path_without(bindir: Path) -> str:
    return os.pathsep.join(
        entry
        for entry in os.environ["PATH"].split(os.pathsep)
        if not (os.path.isdir(entry) and os.path.samefile(entry, bindir))
    )


def test_git_fabros_own_python_first_on_path_is_a_warning(repo: Path) -> None:
    bindir = Path(sys.executable).parent
    if sys.prefix == sys.base_prefix:
        import pytest

        pytest.skip("the tests run outside a virtual environment")
    # The tests put this venv's bin first on PATH, as `export PATH=.venv/bin:$PATH` does.
    check = _checks(run_fabro("doctor", "--json", cwd=repo))["stage python"]
    assert check["status"] == "warn", check
    assert "python3" in check["message"] and str(bindir) in check["message"]
    assert "ln -s" in check["fix"] and "pipx install" in check["fix"]
    # The command called by its path, its directory off PATH: stages get the user's Python.
    clean = subprocess.run(
        [str(bindir / "git-fabro"), "doctor", "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=_path_without(bindir)),
        check=False,
    )
    assert _checks(clean)["stage python"]["status"] == "ok", clean.stdout + clean.stderr
