"""kill -9 of a real `git fabro run` at 26 points; `git fabro resume` must finish it.

The workflow is a chain of eight command stages that each sleep a little and write a
file (one of them deletes a file an earlier stage wrote). The `git-fabro` process (the
Python process itself, not git's front end) is killed with SIGKILL either right after a
given event reaches the live tail (so the kill lands inside a known part of the
checkpoint cycle: objects being written, the meta ref about to move, the run commit
about to be made, the worktree being created or removed, the final snapshot), or a few
milliseconds after it, inside a stage's command. No kill point is a fraction of a
measured run time: that would depend on how busy the machine is. Half of the kills take
the whole process group, so a `git add` or `git worktree` child dies with it and may
leave its own lock files behind.

After each kill, the resumed run must:
- exit 0, with no traceback;
- leave a run branch whose tree holds every file the workflow writes, and whose history
  has one commit per stage, each stage exactly once, in order;
- keep every stage the checkpoint already counted as completed, every event segment
  already on the meta ref (same blob, same path) and every event `logs` showed before;
- log exactly one `run.completed`, with event ids unique across the whole log;
- leave `git fsck --strict` clean, no `.lock` files under the refs, and no worktree.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import assert_fsck_clean, git, run_events, run_fabro, start_fabro

from fabro_git.config.locations import run_scratch_dir

N = 8
STAGES = [f"s{i}" for i in range(1, N + 1)]
CHAIN = ["start", *STAGES, "exit"]


def _script(i: int) -> str:
    body = f"sleep 0.05; mkdir -p out; printf 'stage {i}\\n' > out/f{i}.txt"
    if i == 2:
        body += "; printf 'temporary\\n' > out/gone.txt"
    if i == 5:
        body += "; rm -f out/gone.txt"
    if i == 7:
        body += "; mkdir -p out/deep && printf 'nested\\n' > out/deep/er.txt"
    return body


WORKFLOW = (
    "digraph Crash {\n"
    '    graph [goal="survive kill -9"]\n'
    "    start [shape=Mdiamond]\n"
    "    exit  [shape=Msquare]\n"
    + "".join(f'    s{i} [shape=parallelogram, script="{_script(i)}"]\n' for i in range(1, N + 1))
    + "    "
    + " -> ".join(CHAIN)
    + "\n"
    "}\n"
)

EXPECTED_FILES = {f"out/f{i}.txt": f"stage {i}\n" for i in range(1, N + 1)}
EXPECTED_FILES["out/deep/er.txt"] = "nested\n"
ABSENT_FILES = ["out/gone.txt"]


@dataclass(frozen=True)
class KillPoint:
    """Kill after the `nth` event named `event` reaches the tail (plus `extra` s);
    `group` kills the whole process group."""

    event: str
    nth: int = 1
    extra: float = 0.0
    group: bool = False

    @property
    def label(self) -> str:
        how = "pg" if self.group else "pid"
        return f"{self.event}#{self.nth}+{int(self.extra * 1000)}ms-{how}"


POINTS = [
    # Before the run exists in git (run.created precedes the run branch and `init`).
    KillPoint("run.created", 1),
    # The run just made to exist (`init`): what its resume needs (the user's trust in
    # it) was written before.
    KillPoint("metadata.snapshot.completed", 1),
    # The worktree being created by `git worktree add`.
    KillPoint("sandbox.initializing", 1, group=True),
    KillPoint("sandbox.initializing", 1, 0.03),
    # A command stage in flight.
    KillPoint("stage.started", 3, 0.02, group=True),
    # Stage done, checkpoint not started: the tail holds events no snapshot has.
    KillPoint("stage.completed", 2),
    # Inside a snapshot: objects being written, the meta ref about to move.
    KillPoint("metadata.snapshot.started", 3),
    KillPoint("metadata.snapshot.started", 4, 0.003, group=True),
    KillPoint("metadata.snapshot.started", 5, 0.008),
    # Meta ref moved, run-branch commit not made yet (reconcile's case).
    KillPoint("metadata.snapshot.completed", 3),
    KillPoint("metadata.snapshot.completed", 6, group=True),
    # Run commit made, checkpoint.completed not emitted.
    KillPoint("git.commit", 4),
    KillPoint("git.commit", 7, 0.002, group=True),
    KillPoint("checkpoint.completed", 5),
    # The exit node's checkpoint, the finish, the worktree removal, the final snapshot.
    KillPoint("stage.started", N + 2, group=True),
    KillPoint("git.commit", N + 2),
    KillPoint("run.completed", 1),
    KillPoint("sandbox.cleanup.started", 1, group=True),
    KillPoint("sandbox.cleanup.completed", 1),
    # Later in the run: inside a command (each sleeps 50 ms), between routing and the
    # next stage, right after a checkpoint, and between a stage's end and its snapshot.
    KillPoint("stage.started", 6, 0.02, group=True),
    KillPoint("edge.selected", 5),
    KillPoint("checkpoint.completed", 6, group=True),
    KillPoint("stage.completed", 7, 0.001),
]


class _Tail:
    """The events the live tails under `fabro_home` hold so far, read on from where the
    last look stopped: the kill loop looks every half millisecond."""

    def __init__(self, fabro_home: Path) -> None:
        self.fabro_home = fabro_home
        self.read: dict[Path, int] = {}
        self.events: list[dict] = []

    def __call__(self) -> list[dict]:
        for tail in (self.fabro_home / "runs").glob("*/events.jsonl"):
            with open(tail, "rb") as stream:
                stream.seek(self.read.get(tail, 0))
                data = stream.read()
            complete = data[: data.rfind(b"\n") + 1]  # complete lines only
            self.read[tail] = self.read.get(tail, 0) + len(complete)
            for line in complete.split(b"\n")[:-1]:
                with contextlib.suppress(ValueError):
                    self.events.append(json.loads(line))
        return self.events


def _kill_at(point: KillPoint, repo: Path, workflow: Path, fabro_home: Path, logdir: Path) -> float:
    """Start `git-fabro run`, kill it at `point`; returns seconds from start to kill."""
    out = open(logdir / "run.out", "wb")  # noqa: SIM115 - closed below
    err = open(logdir / "run.err", "wb")  # noqa: SIM115
    started = time.monotonic()
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
    )
    try:
        deadline = started + 30
        tail = _Tail(fabro_home)
        while True:
            seen = sum(1 for e in tail() if e.get("event") == point.event)
            if seen >= point.nth:
                break
            assert proc.poll() is None, (
                f"the run ended (exit {proc.returncode}) before the {point.nth}th {point.event}:\n"
                + (logdir / "run.err").read_text()
            )
            assert time.monotonic() < deadline, f"no {point.event} #{point.nth} after 30s"
            time.sleep(0.0005)
        if point.extra:
            time.sleep(point.extra)
        assert proc.poll() is None, f"the run finished before the kill point {point.label}"
        if point.group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic() - started
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
        err.close()
    # Let orphaned stage commands (their own sessions) finish their short sleeps.
    time.sleep(0.15)
    return killed_at


def _inspect(repo: Path, run_id: str) -> dict:
    proc = run_fabro("inspect", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _segments(repo: Path, run_id: str) -> dict[str, str]:
    listing = git(repo, "ls-tree", "-r", f"refs/fabro/meta/{run_id}", "events/")
    return {line.split("\t")[1]: line.split()[2] for line in listing.splitlines()}


def _ref(repo: Path, name: str) -> str | None:
    out = git(repo, "rev-parse", "--verify", "-q", name, check=False).strip()
    return out or None


def _is_ancestor(repo: Path, old: str, new: str) -> bool:
    proc = subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=repo, check=False)
    return proc.returncode == 0


def _lock_files(repo: Path) -> list[str]:
    git_dir = repo / ".git"
    found = [str(p.relative_to(git_dir)) for p in (git_dir / "refs").rglob("*.lock")]
    found += [p.name for p in git_dir.glob("*.lock")]
    return found


@pytest.fixture
def crash_repo(repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    workflow = tmp_path / "crash.fabro"
    workflow.write_text(WORKFLOW)
    return repo, workflow


def test_workflow_runs_to_completion_without_a_kill(crash_repo: tuple[Path, Path]) -> None:
    """The workflow the kills interrupt, run without one."""
    repo, workflow = crash_repo
    proc = run_fabro("run", str(workflow), cwd=repo, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (run_id,) = [
        r.split("/")[-1]
        for r in git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    ]
    _check_finished(repo, run_id, before=None)


@pytest.mark.parametrize("point", POINTS, ids=[p.label for p in POINTS])
def test_kill_9_then_resume(
    point: KillPoint, crash_repo: tuple[Path, Path], hermetic_env: Path, tmp_path: Path
) -> None:
    repo, workflow = crash_repo
    fabro_home = Path(os.environ["FABRO_HOME"])
    _kill_at(point, repo, workflow, fabro_home, tmp_path)

    metas = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    if not metas:
        # Killed before the `init` snapshot: the run never came to exist in git and its
        # id was never printed. Nothing may be broken by the attempt.
        assert point.event in ("run.created", None), f"no meta ref after a kill at {point.label}"
        assert_fsck_clean(repo)
        ps = run_fabro("ps", cwd=repo)
        assert ps.returncode == 0 and "Traceback" not in ps.stderr, ps.stderr
        assert run_fabro("run", str(workflow), cwd=repo, timeout=60).returncode == 0
        return
    (meta_ref,) = metas
    run_id = meta_ref.split("/")[-1]

    before = _inspect(repo, run_id)
    before_events = run_events(run_id, repo)
    before_segments = _segments(repo, run_id)
    before_meta = _ref(repo, meta_ref)
    before_run = _ref(repo, f"refs/heads/fabro/run/{run_id}")
    # The run branch comes after the first snapshot (`engine.runs.create_run`): a kill
    # that lands between the two leaves the meta ref alone, and resume makes the branch.
    assert before_meta is not None
    assert before["status"] in ("interrupted", "succeeded"), before["status"]

    # Resume through git's front end by a unique prefix, as a user would.
    proc = run_fabro("resume", run_id[:16], cwd=repo, timeout=90)
    assert proc.returncode == 0, f"resume after kill at {point.label} failed:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr

    _check_finished(
        repo,
        run_id,
        before=(before, before_events, before_segments, before_meta, before_run),
    )


def _check_finished(repo: Path, run_id: str, *, before: tuple | None) -> None:
    run_ref = f"refs/heads/fabro/run/{run_id}"
    meta_ref = f"refs/fabro/meta/{run_id}"
    after = _inspect(repo, run_id)
    assert after["status"] == "succeeded", after
    cp = after["checkpoint"]
    assert cp["status"] == "succeeded"
    assert cp["pending_commit"] is None

    # The work product: every file, nothing deleted comes back.
    for path, content in EXPECTED_FILES.items():
        assert git(repo, "show", f"{run_ref}:{path}") == content, path
    tree = set(git(repo, "ls-tree", "-r", "--name-only", run_ref).split())
    for path in ABSENT_FILES:
        assert path not in tree, f"{path} was deleted by s5 but is back"
    assert "README.md" in tree

    # One commit per stage, each exactly once, in order, with the trailers.
    subjects = git(
        repo, "log", "--first-parent", "--reverse", "--format=%s", f"main..{run_ref}"
    ).splitlines()
    assert subjects == [f"fabro({run_id}): {n} (succeeded)" for n in CHAIN], subjects
    for sha in git(repo, "rev-list", f"main..{run_ref}").split():
        trailers = git(repo, "log", "-1", "--format=%(trailers:only,unfold)", sha)
        assert f"Fabro-Run: {run_id}" in trailers
        assert "Fabro-Checkpoint: " in trailers and "Fabro-Completed: " in trailers
        checkpoint = trailers.split("Fabro-Checkpoint: ")[1].split()[0]
        assert git(repo, "cat-file", "-t", checkpoint).strip() == "commit"
        assert _is_ancestor(repo, checkpoint, meta_ref)

    # The event log.
    events = run_events(run_id, repo)
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "duplicate event ids in the log"
    names = [e["event"] for e in events]
    assert names.count("run.completed") == 1, names
    assert names.count("run.created") == 1
    completed_nodes = {e.get("node_id") for e in events if e["event"] == "stage.completed"}
    assert set(CHAIN) <= completed_nodes
    assert cp["completed_nodes"] == CHAIN, cp["completed_nodes"]

    # No worktree left, no lock files, fsck clean.
    worktrees = [
        ln
        for ln in git(repo, "worktree", "list", "--porcelain").splitlines()
        if ln.startswith("worktree ")
    ]
    assert len(worktrees) == 1, worktrees
    assert _lock_files(repo) == []
    assert_fsck_clean(repo)
    ps = run_fabro("ps", "--json", cwd=repo)
    rows = [json.loads(line) for line in ps.stdout.splitlines()]
    assert [r["status"] for r in rows if r["run_id"] == run_id] == ["succeeded"]

    if before is None:
        return
    old, old_events, old_segments, old_meta, old_run = before
    # Nothing a snapshot recorded is lost: completed stages, segments, events, history.
    done_before = old["checkpoint"]["completed_nodes"]
    assert cp["completed_nodes"][: len(done_before)] == done_before
    new_segments = _segments(repo, run_id)
    for path, blob in old_segments.items():
        assert new_segments.get(path) == blob, f"segment {path} was rewritten or lost"
    missing = {e["id"] for e in old_events} - set(ids)
    assert not missing, f"{len(missing)} events shown before the resume are gone"
    assert _is_ancestor(repo, old_meta, meta_ref), "the meta ref was rewritten"
    if old_run is not None:
        assert _is_ancestor(repo, old_run, run_ref), "the run branch was rewritten"


def _only_run(repo: Path) -> str:
    (meta_ref,) = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    return meta_ref.split("/")[-1]


def test_resume_clears_lock_files_a_kill_left_inside_ref_updates(
    crash_repo: tuple[Path, Path], tmp_path: Path
) -> None:
    """A kill between dulwich creating `<ref>.lock` and renaming it into place leaves the
    lock behind (as does a killed `git add` with the worktree's `index.lock`). The kill
    window is tiny, so the debris is planted here exactly as such a kill leaves it."""
    repo, workflow = crash_repo
    fabro_home = Path(os.environ["FABRO_HOME"])
    _kill_at(KillPoint("stage.started", 4), repo, workflow, fabro_home, tmp_path)
    run_id = _only_run(repo)
    before = (
        _inspect(repo, run_id),
        run_events(run_id, repo),
        _segments(repo, run_id),
        _ref(repo, f"refs/fabro/meta/{run_id}"),
        _ref(repo, f"refs/heads/fabro/run/{run_id}"),
    )
    git_dir = repo / ".git"
    planted = [
        git_dir / "refs" / "fabro" / "meta" / f"{run_id}.lock",
        git_dir / "refs" / "heads" / "fabro" / "run" / f"{run_id}.lock",
    ]
    for lock in planted:
        lock.write_text("0" * 40 + "\n")
    worktree_git = Path(
        git(
            run_scratch_dir(git_dir, run_id) / "worktree", "rev-parse", "--absolute-git-dir"
        ).strip()
    )
    (worktree_git / "index.lock").write_bytes(b"")

    proc = run_fabro("resume", run_id, cwd=repo, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "locked" not in proc.stderr, proc.stderr
    assert not any(p.exists() for p in planted)
    _check_finished(repo, run_id, before=before)


def test_run_whose_snapshots_cannot_be_written_does_not_claim_success(
    crash_repo: tuple[Path, Path], tmp_path: Path
) -> None:
    """A foreign lock on the meta ref mid-run makes every later snapshot fail. The run
    must not exit 0 as if its outcome were recorded; once the lock's owner is gone, a
    resume (which owns the run's refs) clears it and finishes the run."""
    repo, workflow = crash_repo
    fabro_home = Path(os.environ["FABRO_HOME"])
    # Each snapshot waits out the lock as long as git would be told to, not 4 s.
    git(repo, "config", "core.filesRefLockTimeout", "100")
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    tail = _Tail(fabro_home)
    while not any(e.get("event") == "stage.started" and e.get("node_id") == "s2" for e in tail()):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.002)
    run_id = _only_run(repo)
    lock = repo / ".git" / "refs" / "fabro" / "meta" / f"{run_id}.lock"
    lock.write_text("")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert f"refs/fabro/meta/{run_id}" in stderr
    assert _inspect(repo, run_id)["status"] == "interrupted"
    resumed = run_fabro("resume", run_id, cwd=repo, timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    assert not lock.exists()
    _check_finished(repo, run_id, before=None)


PARALLEL = """\
digraph Fanned {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    b1    [shape=parallelogram, script="sleep 0.2; printf 'b1\\\\n' > b1.txt"]
    b2    [shape=parallelogram, script="sleep 0.2; printf 'b2\\\\n' > b2.txt"]
    join  [shape=tripleoctagon]
    after [shape=parallelogram, script="printf 'after\\\\n' > after.txt"]
    start -> fan
    fan -> b1
    fan -> b2
    b1 -> join
    b2 -> join
    join -> after -> exit
}
"""

# (kill point, then plant a stale lock on every parallel ref as a kill inside one of
# their updates would leave it)
PARALLEL_POINTS = [
    (KillPoint("parallel.branch.started", 2, 0.05, group=True), False),
    (KillPoint("git.commit", 2), False),  # a branch's own commit made (the first is start's)
    (KillPoint("parallel.completed", 1), False),
    (KillPoint("parallel.branch.started", 2, 0.1), True),
]


@pytest.mark.parametrize(
    ("point", "plant_lock"),
    PARALLEL_POINTS,
    ids=[p.label + ("-stale-ref-locks" if lock else "") for p, lock in PARALLEL_POINTS],
)
def test_kill_9_inside_parallel_branches_then_resume(
    point: KillPoint, plant_lock: bool, repo: Path, tmp_path: Path
) -> None:
    """Branch worktrees, branch refs and their commits are mid-flight when the process
    dies; resume re-runs the fan-out over them."""
    workflow = tmp_path / "fanned.fabro"
    workflow.write_text(PARALLEL)
    fabro_home = Path(os.environ["FABRO_HOME"])
    _kill_at(point, repo, workflow, fabro_home, tmp_path)
    run_id = _only_run(repo)
    info = _inspect(repo, run_id)
    assert info["checkpoint"]["next_node_id"] in ("fan", "join"), info["checkpoint"]
    before_events = {e["id"] for e in run_events(run_id, repo)}
    if plant_lock:
        refs = git(
            repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}"
        ).split()
        assert refs, "no branch ref to leave a stale lock beside"
        for ref in refs:
            (repo / ".git" / f"{ref}.lock").write_text("")

    proc = run_fabro("resume", run_id, cwd=repo, timeout=90)
    assert proc.returncode == 0, proc.stderr
    branch = f"refs/heads/fabro/run/{run_id}"
    files = set(git(repo, "ls-tree", "--name-only", branch).split())
    assert "after.txt" in files and files & {"b1.txt", "b2.txt"}, files
    subjects = git(
        repo, "log", "--first-parent", "--reverse", "--format=%s", f"main..{branch}"
    ).splitlines()
    assert subjects == [
        f"fabro({run_id}): {n} (succeeded)" for n in ("start", "fan", "join", "after", "exit")
    ]
    events = run_events(run_id, repo)
    assert [e["event"] for e in events].count("run.completed") == 1
    assert before_events <= {e["id"] for e in events}
    assert len({e["id"] for e in events}) == len(events)
    assert _inspect(repo, run_id)["status"] == "succeeded"
    worktrees = [
        ln
        for ln in git(repo, "worktree", "list", "--porcelain").splitlines()
        if ln.startswith("worktree ")
    ]
    assert len(worktrees) == 1, worktrees
    assert _lock_files(repo) == []
    assert_fsck_clean(repo)
