"""A run fails in repository A, is pushed, and is resumed in a fresh clone B.

`git clone` copies `refs/heads/*` only, so B has neither the run's meta ref nor (by
default) its branch; `git fabro resume <prefix>` must find the run on origin, fetch
both refs and finish it. `git fabro fetch` / `push` move runs explicitly and push
never forces.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import assert_fsck_clean, bare_remote, git, run_events, run_fabro, start_fabro

# `check` fails until $HOME/ok exists: the "fix" a user makes before resuming.
WORKFLOW = """\
digraph CloneMe {
    graph [goal="finish on another machine"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="printf 'made\\\\n' > made.txt"]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\" && printf 'checked\\\\n' > checked.txt"]
    start -> make -> check -> exit
}
"""

HELLO = "hello"


def _refs(repo: Path, *patterns: str) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname)", *patterns)
    return dict(line.split() for line in out.splitlines())


@pytest.fixture
def failed_run(repo: Path, tmp_path: Path) -> tuple[Path, Path, str]:
    """Repository A with a run failed at `check`, a bare origin, and A pushed to it."""
    workflow = tmp_path / "clone-me.fabro"
    workflow.write_text(WORKFLOW)
    proc = run_fabro("run", str(workflow), "--json", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["status"] == "failed"
    run_id = result["run_id"]
    origin = bare_remote(tmp_path, origin_of=repo)
    pushed = run_fabro("push", "origin", cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    assert f"ok  refs/fabro/meta/{run_id}" in pushed.stderr
    assert f"ok  refs/heads/fabro/run/{run_id}" in pushed.stderr
    return repo, origin, run_id


def test_push_moves_both_refs_of_a_run(failed_run: tuple[Path, Path, str]) -> None:
    repo, origin, run_id = failed_run
    local = _refs(repo, "refs/fabro", "refs/heads/fabro")
    remote = _refs(origin, "refs/fabro", "refs/heads/fabro")
    assert remote == local
    assert set(remote) == {f"refs/fabro/meta/{run_id}", f"refs/heads/fabro/run/{run_id}"}
    assert_fsck_clean(origin)
    # Pushing again is a no-op, not an error.
    again = run_fabro("push", "origin", run_id[:10], cwd=repo)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("same_machine", [False, True], ids=["other-machine", "same-machine"])
def test_resume_in_a_fresh_clone_fetches_the_run_and_finishes_it(
    failed_run: tuple[Path, Path, str], tmp_path: Path, hermetic_env: Path, same_machine: bool
) -> None:
    """On another machine B has no scratch dir at all. On the same machine, A's scratch
    dir (with A's worktree) is still there under the same run id: B must not use it."""
    repo_a, origin, run_id = failed_run
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    assert _refs(clone, "refs/fabro") == {}
    assert f"refs/heads/fabro/run/{run_id}" not in _refs(clone, "refs/heads")
    env = None if same_machine else {"FABRO_HOME": str(tmp_path / "machine-b")}
    ps = run_fabro("ps", cwd=clone, env=env)
    assert ps.returncode == 0 and run_id not in ps.stdout

    (hermetic_env / "ok").write_text("")
    proc = run_fabro("resume", run_id[:12].lower(), "--json", cwd=clone, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["run_id"] == run_id and result["status"] == "succeeded"

    branch = f"refs/heads/fabro/run/{run_id}"
    meta = f"refs/fabro/meta/{run_id}"
    assert git(clone, "show", f"{branch}:made.txt") == "made\n"
    assert git(clone, "show", f"{branch}:checked.txt") == "checked\n"
    assert git(clone, "rev-parse", branch).strip() == result["final_git_commit_sha"]
    # The history A made is kept: B's refs descend from what A pushed.
    pushed = _refs(origin, "refs/fabro", "refs/heads/fabro")
    for ref in (branch, meta):
        base = pushed[ref]
        assert (
            subprocess.run(["git", "merge-base", "--is-ancestor", base, ref], cwd=clone).returncode
            == 0
        )
    subjects = git(clone, "log", "--reverse", "--format=%s", f"main..{branch}").splitlines()
    assert subjects == [
        f"fabro({run_id}): {n}"
        for n in (
            "start (succeeded)",
            "make (succeeded)",
            "check (failed)",
            "check (succeeded)",
            "exit (succeeded)",
        )
    ]
    assert git(clone, "log", "-1", "--format=%s", meta) == "finalize succeeded\n"

    events = run_events(run_id, clone, env)
    names = [e["event"] for e in events]
    assert names.count("run.created") == 1 and names.count("run.failed") == 1
    assert names.count("run.completed") == 1
    created = next(e for e in events if e["event"] == "run.created")
    assert created["properties"]["source_directory"] == str(repo_a)
    assert len({e["id"] for e in events}) == len(events)
    inspected = json.loads(run_fabro("inspect", run_id, "--json", cwd=clone, env=env).stdout)
    assert inspected["status"] == "succeeded"
    assert inspected["checkpoint"]["completed_nodes"][-2:] == ["check", "exit"]
    assert_fsck_clean(clone)
    # A's own copy of the run is untouched by what happened in B.
    assert git(repo_a, "log", "-1", "--format=%s", meta) == "finalize failed\n"
    assert _refs(repo_a, "refs/fabro", "refs/heads/fabro") == pushed
    assert_fsck_clean(repo_a)
    if same_machine:
        # B's resume never touched A's scratch dir (A's failed run released its
        # worktree), and A can still finish its copy.
        from fabro_git.config.locations import run_scratch_dir

        a_worktree = run_scratch_dir(repo_a / ".git", run_id) / "worktree"
        assert not a_worktree.exists()
        assert git(repo_a, "rev-parse", branch).strip() == pushed[branch]
        resumed_a = run_fabro("resume", run_id, cwd=repo_a)
        assert resumed_a.returncode == 0, resumed_a.stderr
        assert git(repo_a, "show", f"{branch}:checked.txt") == "checked\n"
        assert_fsck_clean(repo_a)
        assert_fsck_clean(clone)


def test_resume_of_an_unknown_prefix_says_where_it_looked(
    failed_run: tuple[Path, Path, str], tmp_path: Path
) -> None:
    _, origin, _ = failed_run
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    proc = run_fabro("resume", "ZZZZZZ", cwd=clone)
    assert proc.returncode == 1
    assert "no run matches 'ZZZZZZ' here or on origin" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_fetch_brings_every_run(failed_run: tuple[Path, Path, str], tmp_path: Path) -> None:
    repo, origin, first = failed_run
    hello = run_fabro("run", HELLO, "--json", cwd=repo)
    assert hello.returncode == 0, hello.stderr
    second = json.loads(hello.stdout.splitlines()[-1])["run_id"]
    assert run_fabro("push", cwd=repo).returncode == 0  # default remote: origin

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    fetched = run_fabro("fetch", cwd=clone)
    assert fetched.returncode == 0, fetched.stderr
    assert "2 runs new, 0 runs updated, 2 known here" in fetched.stderr
    assert _refs(clone, "refs/fabro", "refs/heads/fabro") == _refs(
        repo, "refs/fabro", "refs/heads/fabro"
    )
    rows = {
        r["run_id"]: r
        for r in map(json.loads, run_fabro("ps", "--json", cwd=clone).stdout.splitlines())
    }
    assert rows[first]["status"] == "failed"
    assert rows[second]["status"] == "succeeded"
    # A clone's logs come from the segments alone (no tail here): A's log, less what
    # only A's live tail holds (what happened after the final snapshot was taken).
    in_clone = [e["id"] for e in run_events(second, clone)]
    in_a = run_events(second, repo)
    assert in_clone == [e["id"] for e in in_a[: len(in_clone)]]
    assert in_clone[-1] == next(e["id"] for e in in_a if e["event"] == "run.completed") or all(
        e["event"].startswith(("sandbox.cleanup", "metadata.snapshot"))
        for e in in_a[len(in_clone) :]
    )
    again = run_fabro("fetch", "origin", cwd=clone)
    assert again.returncode == 0 and "0 runs new, 0 runs updated, 2 known here" in again.stderr
    assert_fsck_clean(clone)


def test_push_never_forces_a_diverged_run(
    failed_run: tuple[Path, Path, str], tmp_path: Path, hermetic_env: Path
) -> None:
    """B finishes the run and pushes; A, still holding the old failed run, finishes it too
    (a different history). A's push must be rejected and leave origin as B left it."""
    repo_a, origin, run_id = failed_run
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    (hermetic_env / "ok").write_text("")
    env_b = {"FABRO_HOME": str(tmp_path / "machine-b")}
    assert run_fabro("resume", run_id, cwd=clone, env=env_b).returncode == 0
    pushed_b = run_fabro("push", "origin", run_id, cwd=clone, env=env_b)
    assert pushed_b.returncode == 0, pushed_b.stderr
    after_b = _refs(origin, "refs/fabro", "refs/heads/fabro")

    assert run_fabro("resume", run_id, cwd=repo_a).returncode == 0
    local_a = _refs(repo_a, "refs/fabro", "refs/heads/fabro")
    assert local_a != after_b  # the two finishes are different histories
    rejected = run_fabro("push", "origin", cwd=repo_a)
    assert rejected.returncode == 1
    assert "Traceback" not in rejected.stderr
    assert f"rejected  refs/fabro/meta/{run_id}" in rejected.stderr
    assert f"rejected  refs/heads/fabro/run/{run_id}" in rejected.stderr
    assert "2 ref(s) were rejected by origin" in rejected.stderr
    assert "git fabro fetch" in rejected.stderr
    assert _refs(origin, "refs/fabro", "refs/heads/fabro") == after_b
    assert_fsck_clean(origin)


PARALLEL = """\
digraph Fanned {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    b1    [shape=parallelogram, script="printf 'b1\\\\n' > b1.txt"]
    b2    [shape=parallelogram, script="printf 'b2\\\\n' > b2.txt"]
    join  [shape=tripleoctagon]
    start -> fan
    fan -> b1
    fan -> b2
    b1 -> join
    b2 -> join
    join -> exit
}
"""


def _fan_checkpointed(tails: Path) -> bool:
    for tail in tails.glob("*/events.jsonl"):
        for line in tail.read_bytes().split(b"\n")[:-1]:
            event = json.loads(line)
            if event["event"] == "metadata.snapshot.completed" and event.get("node_id") == "fan":
                return True
    return False


def _killed_between_fan_out_and_fan_in(repo: Path, workflow: Path) -> str | None:
    """kill -9 once the fan-out's checkpoint is on the meta ref, before the fan-in's is.
    Returns the run id, or None if the kill landed outside that window."""
    before = set(_refs(repo, "refs/fabro/meta"))
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tails = Path(os.environ["FABRO_HOME"]) / "runs"
    deadline = time.monotonic() + 30
    try:
        while not _fan_checkpointed(tails) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
    finally:
        proc.kill()
        proc.wait()
    (new,) = set(_refs(repo, "refs/fabro/meta")) - before
    run_id = new.rsplit("/", 1)[1]
    info = json.loads(run_fabro("inspect", run_id, "--json", cwd=repo).stdout)
    return run_id if info["checkpoint"]["next_node_id"] == "join" else None


def test_run_cut_between_fan_out_and_fan_in_resumes_in_a_clone(repo: Path, tmp_path: Path) -> None:
    """The fan-in needs the parallel branches' head commits, which only the parallel
    refs reach: push and the clone's resume must carry them."""
    workflow = tmp_path / "fanned.fabro"
    workflow.write_text(PARALLEL)
    run_id = None
    for _ in range(5):  # the window is a few tens of ms; retry if the kill missed it
        run_id = _killed_between_fan_out_and_fan_in(repo, workflow)
        if run_id is not None:
            break
    assert run_id is not None, "never killed the run between its fan-out and fan-in"
    parallel = _refs(repo, f"refs/fabro/parallel/{run_id}")
    assert len(parallel) == 2

    origin = bare_remote(tmp_path, origin_of=repo)
    pushed = run_fabro("push", "origin", run_id, cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    assert _refs(origin, f"refs/fabro/parallel/{run_id}") == parallel

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {"FABRO_HOME": str(tmp_path / "machine-b")}
    proc = run_fabro("resume", run_id, cwd=clone, env=env)
    assert proc.returncode == 0, proc.stderr
    branch = f"refs/heads/fabro/run/{run_id}"
    files = git(clone, "ls-tree", "--name-only", branch).split()
    assert "b1.txt" in files or "b2.txt" in files
    merge = git(clone, "log", "-1", "--format=%P", f"{branch}~1").split()
    assert len(merge) == 2 and merge[1] in parallel.values(), (
        "the fan-in commit merges a branch head"
    )
    assert_fsck_clean(clone)
