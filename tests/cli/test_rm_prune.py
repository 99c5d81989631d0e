"""`git fabro rm`, `prune` and `fetch`: runs go with everything they own, live runs and
the user's checkouts are refused, nothing goes without a yes, and a clone that fetched
the runs can do all of it too."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    assert_fsck_clean,
    bare_remote,
    copy_repo,
    git,
    run_fabro,
    start_fabro,
    wait_until,
    write_workflow,
)

FAILS = """\
digraph Fails {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="echo \\"unique $FABRO_RUN_ID\\" > unique.txt"]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]
    start -> make -> check -> exit
}
"""
# Waits for $HOME/go: holds a run live for as long as a test needs.
HOLDS = """\
digraph Holds {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done"]
    start -> hold -> exit
}
"""


def _refs(repo: Path) -> list[str]:
    out = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro", "refs/heads/fabro")
    return out.split()


def _run_refs(repo: Path, run_id: str) -> list[str]:
    return [ref for ref in _refs(repo) if run_id in ref]


def _worktrees(repo: Path) -> list[str]:
    listing = git(repo, "worktree", "list", "--porcelain")
    return [ln.split(" ", 1)[1] for ln in listing.splitlines() if ln.startswith("worktree ")]


def _scratch(repo: Path, run_id: str) -> Path:
    from fabro_git.config.locations import run_scratch_dir

    return run_scratch_dir(repo / ".git", run_id)


def _run(repo: Path, *args: str, code: int = 0) -> str:
    proc = run_fabro("run", *args, "--json", cwd=repo)
    assert proc.returncode == code, proc.stderr
    return str(json.loads(proc.stdout.splitlines()[-1])["run_id"])


def _runs(repo: Path) -> dict[str, dict]:
    proc = run_fabro("ps", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return {row["run_id"]: row for row in map(json.loads, proc.stdout.splitlines())}


def _leave_worktree_as_a_kill_would(repo: Path, run_id: str) -> Path:
    """A run killed with -9 cannot release its worktree: make the checkout it leaves."""
    path = _scratch(repo, run_id) / "worktree"
    git(repo, "worktree", "add", "-q", str(path), f"fabro/run/{run_id}")
    return path


@pytest.fixture(scope="module")
def made_runs(module_repo: Path) -> dict[str, str]:
    """A succeeded, a failed and a parallel run, by kind, made once for the module."""
    write_workflow(module_repo, FAILS, "fails.fabro")
    return {
        "hello": _run(module_repo, "hello"),
        "failed": _run(module_repo, "fails.fabro", code=1),
        "parallel": _run(module_repo, "parallel-review", "--dry-run", "--auto-approve"),
    }


@pytest.fixture
def runs(
    repo: Path, module_repo: Path, module_env: Path, made_runs: dict[str, str]
) -> dict[str, str]:
    """`made_runs` in `repo`: a copy of the module's repository and of its runs' scratch
    dirs, each test's to change."""
    shutil.rmtree(repo)
    copy_repo(module_repo, repo, module_env)
    return made_runs


def test_rm_removes_every_trace_of_its_runs_and_nothing_else(
    repo: Path, runs: dict[str, str]
) -> None:
    failed, parallel, hello = runs["failed"], runs["parallel"], runs["hello"]
    assert any("refs/fabro/parallel/" in ref for ref in _run_refs(repo, parallel))
    blob = git(repo, "rev-parse", f"fabro/run/{failed}:unique.txt").strip()
    leftover = _leave_worktree_as_a_kill_would(repo, failed)
    git(repo, "pack-refs", "--all")  # deletion must reach packed refs as well

    proc = run_fabro("rm", "--yes", failed, parallel[:10].lower(), cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert f"refs/heads/fabro/run/{failed}" in proc.stdout and str(leftover) in proc.stdout
    assert f"removed run {failed}" in proc.stderr and f"removed run {parallel}" in proc.stderr
    for run_id in (failed, parallel):
        assert _run_refs(repo, run_id) == []
        assert not _scratch(repo, run_id).exists()
        assert not list((repo / ".git" / "fabro" / "locks").glob(f"{run_id}*"))
        assert not list((repo / ".git" / "logs").rglob(f"*{run_id}*"))  # reflogs went too
    assert _worktrees(repo) == [str(repo)]
    assert set(_runs(repo)) == {hello}
    assert len(_run_refs(repo, hello)) == 2 and _scratch(repo, hello).exists()
    assert_fsck_clean(repo)

    # Nothing keeps the run's objects: the user's next gc takes them.
    assert subprocess.run(["git", "cat-file", "-e", blob], cwd=repo).returncode == 0
    git(repo, "gc", "-q", "--prune=now")
    assert subprocess.run(["git", "cat-file", "-e", blob], cwd=repo).returncode != 0
    assert_fsck_clean(repo)


def test_rm_asks_first_and_refuses_without_a_terminal(repo: Path, runs: dict[str, str]) -> None:
    failed = runs["failed"]
    before = _refs(repo)
    proc = run_fabro("rm", failed, cwd=repo)  # stdin is /dev/null: nobody to ask
    assert proc.returncode == 1
    assert "no terminal" in proc.stderr and "--yes" in proc.stderr
    assert f"refs/fabro/meta/{failed}" in proc.stdout  # it said what it would remove

    dry = run_fabro("rm", "--dry-run", failed, cwd=repo)
    assert dry.returncode == 0, dry.stderr
    assert f"refs/heads/fabro/run/{failed}" in dry.stdout and "nothing was deleted" in dry.stderr
    assert _refs(repo) == before and _scratch(repo, failed).exists()
    assert "Traceback" not in proc.stderr + dry.stderr


def _on_terminal(repo: Path, args: list[str], answer: str) -> tuple[int, str]:
    """Run `git fabro ARGS` with a terminal as stdin, and type `answer` at its prompt."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        ["git", "fabro", *args],
        cwd=repo,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    os.write(master, answer.encode())
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(master)
    return proc.returncode, out + err


def test_rm_on_a_terminal_removes_only_after_a_yes(repo: Path, runs: dict[str, str]) -> None:
    failed = runs["failed"]
    code, said = _on_terminal(repo, ["rm", failed], "n\n")
    assert code == 1 and "Remove 1 run? [y/N]" in said and "nothing was removed" in said
    assert len(_run_refs(repo, failed)) == 2
    code, said = _on_terminal(repo, ["rm", failed], "y\n")
    assert code == 0, said
    assert _run_refs(repo, failed) == []


def test_rm_refuses_what_it_must_not_delete(repo: Path, runs: dict[str, str]) -> None:
    failed, hello = runs["failed"], runs["hello"]
    before = _refs(repo)
    # A workflow's name would mean "its latest run": rm wants the id.
    named = run_fabro("rm", "--yes", "hello", cwd=repo)
    assert named.returncode == 1
    assert "is a workflow" in named.stderr and hello in named.stderr
    assert "prune --workflow hello" in named.stderr
    unknown = run_fabro("rm", "--yes", "ZZZZZZ", cwd=repo)
    assert unknown.returncode == 1 and "no run matches 'ZZZZZZ'" in unknown.stderr
    # The user's own checkout is on the run branch: deleting it would strand them.
    git(repo, "switch", "-q", f"fabro/run/{failed}")
    checked_out = run_fabro("rm", "--yes", hello, failed, cwd=repo)
    assert checked_out.returncode == 1
    assert "is checked out in" in checked_out.stderr and "git switch" in checked_out.stderr
    assert _refs(repo) == before  # refused before anything went, hello included
    pruned = run_fabro("prune", "--older-than", "0s", "--yes", cwd=repo)
    assert pruned.returncode == 0, pruned.stderr
    assert f"keeping run {failed}" in pruned.stderr
    assert set(_runs(repo)) == {failed}
    for proc in (named, unknown, checked_out, pruned):
        assert "Traceback" not in proc.stderr


def _held_run(repo: Path, workflow: str = HOLDS) -> tuple[subprocess.Popen[bytes], str]:
    """A run that stays live in its `hold` stage until $HOME/go exists."""
    write_workflow(repo, workflow, "holds.fabro")
    proc = start_fabro(
        ["run", "holds.fabro"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = Path(os.environ["FABRO_HOME"]) / "runs"

    def held() -> str | None:
        for tail in root.glob("*/events.jsonl"):
            if b'"node_id":"hold"' in tail.read_bytes():
                return tail.parent.name[:26]
        return None

    return proc, wait_until(held, process=proc, limit=60, what="the held run's stage")


def test_a_live_run_is_never_removed(repo: Path, hermetic_env: Path) -> None:
    proc, run_id = _held_run(repo)
    try:
        refused = run_fabro("rm", "--yes", run_id, cwd=repo)
        assert refused.returncode == 1
        assert f"run {run_id} is running" in refused.stderr
        pruned = run_fabro("prune", "--older-than", "0s", "--yes", cwd=repo)
        assert pruned.returncode == 0, pruned.stderr
        assert len(_run_refs(repo, run_id)) == 2
        assert _runs(repo)[run_id]["status"] == "running"
    finally:
        (hermetic_env / "go").write_text("")
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert _runs(repo)[run_id]["status"] == "succeeded"
    removed = run_fabro("rm", "-y", run_id, cwd=repo)
    assert removed.returncode == 0, removed.stderr
    assert _run_refs(repo, run_id) == []


def test_prune_selects_by_status_workflow_and_age(repo: Path, runs: dict[str, str]) -> None:
    hello, failed, parallel = runs["hello"], runs["failed"], runs["parallel"]
    second_hello = _run(repo, "hello")
    # With no filter it keeps the last day's runs.
    fresh = run_fabro("prune", "--yes", cwd=repo)
    assert fresh.returncode == 0, fresh.stderr
    assert "nothing to prune (older than 24h)" in fresh.stderr
    assert len(_runs(repo)) == 4

    bad = run_fabro("prune", "--status", "running", cwd=repo)
    assert bad.returncode == 1 and "never pruned" in bad.stderr
    bad_age = run_fabro("prune", "--older-than", "soon", cwd=repo)
    assert bad_age.returncode == 1 and "--older-than expects a duration" in bad_age.stderr

    before = _refs(repo)
    dry = run_fabro("prune", "--status", "failed,interrupted", "--dry-run", cwd=repo)
    assert dry.returncode == 0, dry.stderr
    assert f"run {failed}" in dry.stdout and hello not in dry.stdout
    assert _refs(repo) == before

    by_status = run_fabro("prune", "--status", "failed", "--yes", cwd=repo)
    assert by_status.returncode == 0, by_status.stderr
    assert set(_runs(repo)) == {hello, second_hello, parallel}
    by_workflow = run_fabro("prune", "--workflow", "hello", "-y", cwd=repo)
    assert by_workflow.returncode == 0, by_workflow.stderr
    assert set(_runs(repo)) == {parallel}
    kept = run_fabro("prune", "--older-than", "1h", "-y", cwd=repo)
    assert "nothing to prune" in kept.stderr and set(_runs(repo)) == {parallel}
    gone = run_fabro("prune", "--older-than", "0s", "-y", cwd=repo)
    assert gone.returncode == 0, gone.stderr
    assert _runs(repo) == {} and _refs(repo) == []
    assert _worktrees(repo) == [str(repo)]
    assert_fsck_clean(repo)


def test_prune_removes_what_gone_runs_left(repo: Path, runs: dict[str, str]) -> None:
    failed, hello = runs["failed"], runs["hello"]
    leftover = _leave_worktree_as_a_kill_would(repo, failed)
    scratch = _scratch(repo, failed)
    # The run's refs deleted by hand: its checkout, scratch dir and lock are orphans.
    for ref in _run_refs(repo, failed):
        git(repo, "update-ref", "-d", ref)
    orphan_parallel = "refs/fabro/parallel/01ZZZZZZZZZZZZZZZZZZZZZZZZ/fan-1/0"
    git(repo, "update-ref", orphan_parallel, "HEAD")
    # A `run -d` child that died before taking its run's lock left its marker.
    dead = subprocess.Popen(["true"])
    dead.wait()
    starting = repo / ".git" / "fabro" / "locks" / f"{hello}.starting"
    starting.write_text(f"pid {dead.pid}\n")
    other_repo_dir = scratch.parent / f"{failed}-0123456789ab"  # another clone's: not ours
    other_repo_dir.mkdir()
    old = time.time() - 3600
    for path in (scratch, other_repo_dir):
        os.utime(path, (old, old))

    dry = run_fabro("prune", "--dry-run", cwd=repo)
    assert dry.returncode == 0, dry.stderr
    assert "left by runs that are gone" in dry.stdout
    for shown in (str(leftover), str(scratch), orphan_parallel, f"{failed}.lock", str(starting)):
        assert shown in dry.stdout
    assert leftover.exists() and len(_worktrees(repo)) == 2

    proc = run_fabro("prune", "--yes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert _worktrees(repo) == [str(repo)]
    assert not scratch.exists() and other_repo_dir.exists()
    assert git(repo, "for-each-ref", "refs/fabro/parallel/01ZZZZZZZZZZZZZZZZZZZZZZZZ") == ""
    assert not (repo / ".git" / "fabro" / "locks" / f"{failed}.lock").exists()
    assert not starting.exists()
    assert hello in _runs(repo) and _scratch(repo, hello).exists()
    assert_fsck_clean(repo)


def _killed_run(repo: Path) -> str:
    """A run killed with -9 in its `hold` stage: recorded running, nobody holds it."""
    proc, run_id = _held_run(repo)
    proc.kill()
    proc.wait()
    return run_id


def test_prune_takes_a_killed_run_as_interrupted(repo: Path) -> None:
    run_id = _killed_run(repo)
    assert _runs(repo)[run_id]["status"] == "interrupted"
    assert len(_worktrees(repo)) == 2  # a killed run could not release its worktree
    proc = run_fabro("prune", "--status", "interrupted", "--yes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert _runs(repo) == {} and _worktrees(repo) == [str(repo)]
    assert not _scratch(repo, run_id).exists()
    assert_fsck_clean(repo)


def _stat(pid: int | str) -> list[str]:
    """The fields of `/proc/<pid>/stat` after the command name (state, ppid, ...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rfind(")") + 2 :].split()


def _alive(pid: int) -> bool:
    return _stat(pid)[:1] not in ([], ["Z"])


def _watcher_of(pid: int) -> int:
    """The watcher `git fabro` started beside its run (`fabro_git.engine.reaper`)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                _stat(entry.name)[1:2] == [str(pid)]
                and b"process-groups" in (entry / "cmdline").read_bytes()
            ):
                found.append(int(entry.name))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("how", ["rm", "prune-of-its-leftovers", "resume-after-a-move"])
def test_what_a_killed_runs_stage_left_running_goes_with_the_run(
    repo: Path, hermetic_env: Path, how: str
) -> None:
    """A run killed with -9 leaves its stage to its watcher; with the watcher gone too,
    the stage runs on. Removing the run (or, its refs gone, what it left) kills the
    stage before the worktree it writes into goes; so does a resume after the
    repository moved, which drops the checkout under the old scratch dir."""
    pid_file = hermetic_env / "stage.pid"
    proc, run_id = _held_run(repo, HOLDS.replace('script="', f'script="echo $$ > {pid_file}; '))
    stage = int(
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            process=proc,
            what="the stage's pid",
        )
    )
    os.kill(_watcher_of(proc.pid), signal.SIGKILL)
    proc.kill()
    proc.wait()
    try:
        assert _alive(stage)  # nothing else would stop it
        if how == "resume-after-a-move":
            moved = repo.parent / "moved"
            repo.rename(moved)
            resumed = start_fabro(
                ["resume", run_id],
                cwd=moved,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                wait_until(lambda: not _alive(stage), process=resumed, what="end of the old stage")
            finally:
                (hermetic_env / "go").write_text("")  # the resumed stage may finish now
            _, stderr = resumed.communicate(timeout=60)
            assert resumed.returncode == 0, stderr
            assert _worktrees(moved) == [str(moved)]
            return
        if how == "rm":
            removed = run_fabro("rm", "--yes", run_id, cwd=repo)
        else:
            for ref in _run_refs(repo, run_id):
                git(repo, "update-ref", "-d", ref)
            old = time.time() - 3600
            os.utime(_scratch(repo, run_id), (old, old))
            removed = run_fabro("prune", "--yes", cwd=repo)
        assert removed.returncode == 0, removed.stderr
        wait_until(lambda: not _alive(stage), what="end of the stage")
        assert _worktrees(repo) == [str(repo)]
        assert not _scratch(repo, run_id).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stage, signal.SIGKILL)


# -- a clone that fetched the runs -----------------------------------------------------


@pytest.fixture
def clone(repo: Path, runs: dict[str, str], tmp_path: Path) -> Path:
    origin = bare_remote(tmp_path, origin_of=repo)
    pushed = run_fabro("push", "origin", cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    path = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(path))
    return path


def test_fetch_says_what_came_and_can_take_one_run(
    repo: Path, runs: dict[str, str], clone: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    failed = runs["failed"]
    first = run_fabro("fetch", cwd=clone)
    assert first.returncode == 0, first.stderr
    assert "3 runs new, 0 runs updated, 3 known here" in first.stderr
    assert set(_runs(clone)) == set(runs.values())
    again = run_fabro("fetch", "origin", cwd=clone)
    assert "0 runs new, 0 runs updated" in again.stderr

    (hermetic_env / "ok").write_text("")
    resumed = run_fabro("resume", failed, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert run_fabro("push", "origin", failed, cwd=repo).returncode == 0
    updated = run_fabro("fetch", cwd=clone)
    assert "0 runs new, 1 run updated" in updated.stderr and f"updated  {failed}" in updated.stderr
    assert _runs(clone)[failed]["status"] == "succeeded"

    # A run branch the user has checked out is left alone, and the rest still comes.
    git(clone, "switch", "-q", f"fabro/run/{failed}")
    later = _run(repo, "hello")
    assert run_fabro("push", "origin", later, cwd=repo).returncode == 0
    held = run_fabro("fetch", cwd=clone)
    assert held.returncode == 0, held.stderr
    assert "1 run new" in held.stderr and later in _runs(clone)
    assert f"not fetched: fabro/run/{failed} is checked out in {clone}" in held.stderr
    one_held = run_fabro("fetch", "origin", failed[:12], cwd=clone)
    assert one_held.returncode == 0, one_held.stderr
    assert "not fetched" in one_held.stderr
    git(clone, "switch", "-q", "main")

    single = tmp_path / "single"
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(single))
    one = run_fabro("fetch", "origin", runs["parallel"][:12], cwd=single)
    assert one.returncode == 0, one.stderr
    assert "fetched run" in one.stderr and "1 run new" in one.stderr
    assert set(_runs(single)) == {runs["parallel"]}
    assert any("refs/fabro/parallel/" in ref for ref in _refs(single))
    missing = run_fabro("fetch", "origin", "ZZZZZZ", cwd=single)
    assert missing.returncode == 1 and "no run on origin matches 'ZZZZZZ'" in missing.stderr
    assert_fsck_clean(single)


def test_rm_and_prune_work_in_a_clone_that_fetched_the_runs(
    runs: dict[str, str], clone: Path
) -> None:
    assert run_fabro("fetch", cwd=clone).returncode == 0
    failed, hello = runs["failed"], runs["hello"]
    switched = subprocess.run(
        ["git", "switch", f"fabro/run/{failed}"], cwd=clone, capture_output=True, text=True
    )
    assert switched.returncode == 0, switched.stderr
    git(clone, "switch", "-q", "main")

    removed = run_fabro("rm", "-y", failed, cwd=clone)
    assert removed.returncode == 0, removed.stderr
    assert _run_refs(clone, failed) == []
    # git clone made remote-tracking branches of the runs; rm says they keep the commits.
    assert f"refs/remotes/origin/fabro/run/{failed}" in removed.stderr
    pruned = run_fabro("prune", "--workflow", "hello", "--yes", cwd=clone)
    assert pruned.returncode == 0, pruned.stderr
    assert set(_runs(clone)) == {runs["parallel"]}
    assert hello not in " ".join(_refs(clone))
    assert _worktrees(clone) == [str(clone)]
    assert_fsck_clean(clone)


def test_removing_a_live_run_says_how_to_stop_it(repo: Path) -> None:
    proc, run_id = _held_run(repo)
    try:
        refused = run_fabro("rm", "--yes", run_id, cwd=repo)
        assert refused.returncode == 1, refused.stderr
        assert f"run {run_id} is running" in refused.stderr
        suggested = f"`git fabro interrupt {run_id}`"
        assert f"hint: stop it first with {suggested}" in refused.stderr, refused.stderr
        assert "Ctrl-C" not in refused.stderr
        # What the hint says does stop it.
        stopped = run_fabro(*suggested.strip("`").split()[2:], cwd=repo)
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    removed = run_fabro("rm", "-y", run_id, cwd=repo)
    assert removed.returncode == 0, removed.stderr
    assert _run_refs(repo, run_id) == []
