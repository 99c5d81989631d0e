"""Resume after a kill -9 is exact: the worktree is the checkpoint's tree, nothing a
killed stage started is left running, and the cut-off attempt is closed in the log.

Kill points are set by files, never by delays: a stage's first attempt writes a `ready`
file outside the worktree and then blocks, or a git clean filter (run by the checkpoint's
`git add`) does, so the kill lands exactly between a stage's end and its checkpoint.
The stage scripts live outside the repository; a second attempt sees the marker its
first attempt left and finishes at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    bare_remote,
    git,
    read_checkpoint,
    run_events,
    run_fabro,
    start_fabro,
    wait_until,
)


@pytest.fixture(autouse=True)
def hold(tmp_path: Path) -> Iterator[Path]:
    """Stage loops run while this file exists: even a failing test leaves none behind."""
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def _forever(tmp_path: Path) -> str:
    return f"while [ -e {tmp_path / 'hold'} ]; do sleep 0.02; done; exit 1"


@pytest.fixture
def spawned() -> Iterator[list[int]]:
    """Pids of processes the test's stages start; whatever is left is killed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _workflow(tmp_path: Path, stages: dict[str, str]) -> Path:
    """A chain start -> stages... -> exit; each stage runs `sh <its script file>`."""
    lines = [
        "digraph Exact {",
        '    graph [goal="resume exactly"]',
        "    start [shape=Mdiamond]",
        "    exit  [shape=Msquare]",
    ]
    for name, body in stages.items():
        script = tmp_path / f"{name}.sh"
        script.write_text("set -e\n" + body)
        lines.append(f'    {name} [shape=parallelogram, script="sh {script}"]')
    lines.append("    " + " -> ".join(["start", *stages, "exit"]))
    lines.append("}")
    path = tmp_path / "exact.fabro"
    path.write_text("\n".join(lines) + "\n")
    return path


def _start(repo: Path, workflow: Path, logdir: Path) -> subprocess.Popen[bytes]:
    with (logdir / "run.out").open("wb") as out, (logdir / "run.err").open("wb") as err:
        return start_fabro(
            ["run", str(workflow)],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], logdir: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, (logdir / "run.err").read_text()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.005)


def _kill_9(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the `git fabro` process alone, as a crash or an OOM kill would."""
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL


def _only_run(repo: Path) -> str:
    (meta,) = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    return meta.rsplit("/", 1)[-1]


def _checkpoint(repo: Path, run_id: str) -> dict:
    return read_checkpoint(repo, f"refs/fabro/meta/{run_id}")


def _resume(repo: Path, run_id: str) -> None:
    proc = run_fabro("resume", run_id, cwd=repo, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent and fields[0] != "Z":
                    found.append(int(entry.name))
    return found


def _attempts(events: list[dict]) -> dict[str, list[tuple[int, list[dict]]]]:
    """Per stage_id, each attempt's number and its terminal events, checking the order:
    an attempt starts only once the previous one ended, and numbers only go up."""
    found: dict[str, list[tuple[int, list[dict]]]] = {}
    for event in events:
        name, stage_id = event["event"], event.get("stage_id")
        if not name.startswith("stage.") or stage_id is None:
            continue
        attempts = found.setdefault(stage_id, [])
        if name == "stage.started":
            number = event["properties"]["attempt"]
            assert not attempts or attempts[-1][1], (
                f"{stage_id}: attempt {number} began before the last ended"
            )
            assert not attempts or number > attempts[-1][0], (
                f"{stage_id}: attempt {number} repeats a number"
            )
            attempts.append((number, []))
        elif name in ("stage.completed", "stage.failed"):
            assert attempts, f"{stage_id}: {name} without stage.started"
            attempts[-1][1].append(event)
    for stage_id, attempts in found.items():
        for number, ends in attempts:
            completed = [e for e in ends if e["event"] == "stage.completed"]
            failed = [e for e in ends if e["event"] == "stage.failed"]
            # One terminal event per attempt; a final failure is told as stage.failed
            # then stage.completed(status failed), and that pair counts as one.
            assert len(completed) <= 1 and len(failed) <= 1, (stage_id, number, ends)
            assert ends, f"{stage_id}: attempt {number} never ended"
            if completed and failed:
                assert completed[0]["properties"]["status"] == "failed", (stage_id, number, ends)
    return found


# -- the worktree ------------------------------------------------------------------------


def test_resume_removes_what_the_cut_off_stage_left_untracked_and_keeps_ignored_files(
    repo: Path, tmp_path: Path
) -> None:
    (repo / ".gitignore").write_text("cache/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore the cache")
    marker, ready = tmp_path / "attempted", tmp_path / "ready"
    workflow = _workflow(
        tmp_path,
        {
            "one": "printf 'one\\n' > one.txt\n",
            "two": f"""\
if [ -e {marker} ]; then
    # The rerun: the cut-off attempt's untracked files are gone, its cache is not.
    test ! -e partial.txt || {{ echo 'partial.txt survived' >&2; exit 7; }}
    test ! -e deep || {{ echo 'deep/ survived' >&2; exit 8; }}
    test ! -e nested || {{ echo 'the nested repository survived' >&2; exit 9; }}
    test "$(cat cache/keep.txt)" = kept || {{ echo 'the ignored cache is gone' >&2; exit 10; }}
    printf 'line\\n' >> partial.txt
    exit 0
fi
touch {marker}
printf 'line\\n' >> partial.txt
printf 'changed\\n' > one.txt
mkdir -p cache deep/er nested && printf 'kept\\n' > cache/keep.txt
printf 'x\\n' > deep/er/file.txt
git -C nested init -q && printf 'y\\n' > nested/file.txt
touch {ready}
{_forever(tmp_path)}
""",
        },
    )
    proc = _start(repo, workflow, tmp_path)
    try:
        _wait_for(ready, proc, tmp_path)
        _kill_9(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run_id = _only_run(repo)
    _resume(repo, run_id)
    branch = f"refs/heads/fabro/run/{run_id}"
    assert git(repo, "show", f"{branch}:partial.txt") == "line\n"
    assert git(repo, "show", f"{branch}:one.txt") == "one\n"
    files = set(git(repo, "ls-tree", "-r", "--name-only", branch).split())
    assert files == {".gitignore", "README.md", "one.txt", "partial.txt"}, files


# -- processes ---------------------------------------------------------------------------


def _holding_workflow(tmp_path: Path) -> Path:
    """One stage whose first attempt starts a background loop writing into the worktree
    and waits for it; its second attempt just finishes."""
    marker, ready, pids = tmp_path / "attempted", tmp_path / "ready", tmp_path / "pids"
    return _workflow(
        tmp_path,
        {
            "work": f"""\
if [ -e {marker} ]; then printf 'done\\n' > done.txt; exit 0; fi
touch {marker}
(while [ -e {tmp_path / "hold"} ]; do date >> w.log; sleep 0.05; done) &
echo $! > {pids}.grandchild
echo $$ > {pids}.shell
until [ -s w.log ]; do sleep 0.01; done
touch {ready}
wait
""",
        },
    )


def _watcher_of(pid: int) -> int:
    """The watcher process `git fabro` started beside its stages."""
    for child in _children(pid):
        with contextlib.suppress(OSError):
            if b"reaper.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
    raise AssertionError(f"git fabro ({pid}) has no watcher process")


def _kill_9_mid_stage(
    repo: Path, tmp_path: Path, spawned: list[int], *, watcher_first: bool
) -> tuple[int, int, int]:
    """Run `_holding_workflow`, kill -9 git fabro while its stage holds (its watcher
    first, with `watcher_first`); returns the pids of the stage's shell, its background
    loop and the watcher."""
    proc = _start(repo, _holding_workflow(tmp_path), tmp_path)
    try:
        _wait_for(tmp_path / "ready", proc, tmp_path)
        grandchild = int((tmp_path / "pids.grandchild").read_text())
        shell = int((tmp_path / "pids.shell").read_text())
        spawned += [grandchild, shell]
        watcher = _watcher_of(proc.pid)
        if watcher_first:
            os.kill(watcher, signal.SIGKILL)
        _kill_9(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return shell, grandchild, watcher


def _resumed_cleanly(repo: Path) -> None:
    run_id = _only_run(repo)
    _resume(repo, run_id)
    # Nothing wrote into the worktree after the restore: the rerun committed no w.log.
    branch = f"refs/heads/fabro/run/{run_id}"
    files = set(git(repo, "ls-tree", "-r", "--name-only", branch).split())
    assert files == {"README.md", "done.txt"}, files
    (scratch,) = (Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*")
    assert (scratch / "events.jsonl").is_file()  # the run's own scratch dir, not a guess
    assert not list((scratch / "process-groups").glob("*")), "records outlived their groups"


def test_no_process_of_a_killed_run_outlives_it(
    repo: Path, tmp_path: Path, spawned: list[int]
) -> None:
    shell, grandchild, watcher = _kill_9_mid_stage(repo, tmp_path, spawned, watcher_first=False)
    # The run's watcher kills the stage's whole process group the moment git fabro
    # dies: the command, and what it started in the background; then it goes too.
    wait_until(
        lambda: not any(_alive(pid) for pid in (shell, grandchild, watcher)),
        limit=10,
        what="the end of the stage's processes",
    )
    _resumed_cleanly(repo)


def test_a_resume_kills_what_a_killed_run_left_when_nothing_else_could(
    repo: Path, tmp_path: Path, spawned: list[int]
) -> None:
    # The watcher killed first, as a kill of everything git fabro started would.
    shell, grandchild, _ = _kill_9_mid_stage(repo, tmp_path, spawned, watcher_first=True)
    assert _alive(grandchild) and _alive(shell)
    _resumed_cleanly(repo)
    assert not _alive(grandchild), "the stage's background loop outlived the resume"
    assert not _alive(shell), "the stage's shell outlived the resume"


def test_a_finished_run_leaves_no_background_process_behind(
    repo: Path, tmp_path: Path, spawned: list[int]
) -> None:
    pids = tmp_path / "pids"
    workflow = _workflow(
        tmp_path,
        {"serve": f"({_forever(tmp_path)}) &\necho $! > {pids}\nprintf 'ok\\n' > ok.txt\n"},
    )
    proc = run_fabro("run", str(workflow), cwd=repo, timeout=60)
    background = int(pids.read_text())
    spawned.append(background)
    assert proc.returncode == 0, proc.stderr
    assert not _alive(background), "a stage's background process outlived the run"


# -- the event log -----------------------------------------------------------------------


def test_the_cut_off_attempt_is_closed_and_the_rerun_is_a_new_attempt(
    repo: Path, tmp_path: Path
) -> None:
    marker, ready = tmp_path / "attempted", tmp_path / "ready"
    workflow = _workflow(
        tmp_path,
        {
            "one": "printf 'one\\n' > one.txt\n",
            "two": f"""\
if [ -e {marker} ]; then printf 'two\\n' > two.txt; exit 0; fi
touch {marker} {ready}
{_forever(tmp_path)}
""",
            "three": "printf 'three\\n' > three.txt\n",
        },
    )
    proc = _start(repo, workflow, tmp_path)
    try:
        _wait_for(ready, proc, tmp_path)
        _kill_9(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run_id = _only_run(repo)
    _resume(repo, run_id)
    events = run_events(run_id, repo)
    attempts = _attempts(events)
    (first, cut), (second, rerun) = attempts["two@1"]
    assert (first, second) == (1, 2)
    (closed,) = cut
    assert closed["event"] == "stage.failed"
    assert closed["properties"]["failure_class"] == "canceled"
    assert "interrupted" in closed["properties"]["error"]
    assert closed["node_id"] == "two"
    assert [e["event"] for e in rerun] == ["stage.completed"]
    assert rerun[0]["properties"]["attempt"] == 2
    assert all(len(a) == 1 for sid, a in attempts.items() if sid != "two@1"), attempts
    cp = _checkpoint(repo, run_id)
    assert cp["completed_nodes"] == ["start", "one", "two", "three", "exit"]


def test_a_stage_killed_while_its_files_are_recorded_runs_again_as_a_new_attempt(
    repo: Path, tmp_path: Path
) -> None:
    """A clean filter holds the `git add` of `*.slow` files that records the stage's
    tree, so the kill lands after the script ended and before the checkpoint, every
    time. A command stage's tree is recorded before `stage.completed` (which lists the
    files it touched), so the cut-off attempt is closed as interrupted on resume."""
    hold, ready = tmp_path / "hold", tmp_path / "ready"
    hold.touch()
    (repo / ".gitattributes").write_text("*.slow filter=slow\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "slow filter")
    git(
        repo,
        "config",
        "filter.slow.clean",
        f"sh -c 'touch {ready}; while [ -e {hold} ]; do sleep 0.02; done; cat'",
    )
    workflow = _workflow(
        tmp_path,
        {
            "one": "printf 'one\\n' > one.txt\n",
            "two": "printf 'line\\n' >> two.slow\n",
            "three": "printf 'three\\n' > three.txt\n",
        },
    )
    proc = _start(repo, workflow, tmp_path)
    try:
        _wait_for(ready, proc, tmp_path)
        _kill_9(proc)
    finally:
        hold.unlink()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The orphaned `git add` finishes once the filter lets go; wait for its index lock.
    wait_until(
        lambda: not list((repo / ".git" / "worktrees").glob("*/index.lock")),
        limit=30,
        what="the orphaned git add's end",
    )
    run_id = _only_run(repo)
    before = _checkpoint(repo, run_id)
    assert before["completed_nodes"] == ["start", "one"], before
    _resume(repo, run_id)
    events = run_events(run_id, repo)
    attempts = _attempts(events)
    (first, ended), (second, rerun) = attempts["two@1"]
    assert (first, second) == (1, 2)
    assert [e["event"] for e in ended] == ["stage.failed"]
    assert ended[0]["properties"]["failure_class"] == "canceled"
    assert [e["event"] for e in rerun] == ["stage.completed"]
    assert rerun[0]["properties"]["files_touched"] == ["two.slow"]
    cp = _checkpoint(repo, run_id)
    assert cp["completed_nodes"] == ["start", "one", "two", "three", "exit"]
    branch = f"refs/heads/fabro/run/{run_id}"
    assert git(repo, "show", f"{branch}:two.slow") == "line\n"
    names = [e["event"] for e in events]
    assert names.count("run.completed") == 1


# -- parallel refs and remotes --------------------------------------------------------------


def _fan_out(tmp_path: Path, marker: Path, ready: Path) -> Path:
    """Branch `a` commits a stage, then blocks in its second stage on the first attempt."""
    scripts = {
        "a1": "printf 'a1\\n' > a1.txt\n",
        "a2": f"if [ -e {marker} ]; then printf 'a2\\n' > a2.txt; exit 0; fi\n"
        f"touch {marker} {ready}\n{_forever(tmp_path)}\n",
        "b1": "printf 'b1\\n' > b1.txt\n",
    }
    nodes = []
    for name, body in scripts.items():
        script = tmp_path / f"{name}.sh"
        script.write_text(body)
        nodes.append(f'    {name} [shape=parallelogram, script="sh {script}"]')
    path = tmp_path / "fan.fabro"
    path.write_text(
        "digraph Fan {\n"
        "    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        "    fan [shape=component]\n    join [shape=tripleoctagon]\n"
        + "\n".join(nodes)
        + "\n    start -> fan\n    fan -> a1 -> a2 -> join\n    fan -> b1 -> join\n"
        "    join -> exit\n}\n"
    )
    return path


def _fabro(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_fabro(*args, cwd=cwd, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_a_resumed_fan_out_never_rewinds_a_pushed_parallel_ref(repo: Path, tmp_path: Path) -> None:
    remote = bare_remote(tmp_path, "remote.git", origin_of=repo)
    marker, ready = tmp_path / "attempted", tmp_path / "ready"
    workflow = _fan_out(tmp_path, marker, ready)
    proc = _start(repo, workflow, tmp_path)
    try:
        _wait_for(ready, proc, tmp_path)
        _kill_9(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run_id = _only_run(repo)
    pushed = _fabro(repo, "push", "origin", run_id)
    assert pushed.returncode == 0, pushed.stderr
    prefix = f"refs/fabro/parallel/{run_id}/"
    before = dict(
        line.split()[::-1]
        for line in git(
            repo, "for-each-ref", "--format=%(objectname) %(refname)", prefix
        ).splitlines()
    )
    assert before, "the fan-out wrote no parallel refs before the kill"

    _resume(repo, run_id)
    after = dict(
        line.split()[::-1]
        for line in git(
            repo, "for-each-ref", "--format=%(objectname) %(refname)", prefix
        ).splitlines()
    )
    for ref, sha in before.items():
        moved = after.get(ref)
        assert moved is not None, f"{ref} was deleted"
        assert (
            subprocess.run(["git", "merge-base", "--is-ancestor", sha, moved], cwd=repo).returncode
            == 0
        ), f"{ref} was rewound from {sha[:12]} to {moved[:12]}"
    pushed = _fabro(repo, "push", "origin", run_id)
    assert pushed.returncode == 0, pushed.stderr
    # The fan-out and the branch stage in flight were both cut off and closed.
    attempts = _attempts(run_events(run_id, repo))
    for stage_id in ("fan@1", "a2@1"):
        (first, cut), (second, rerun) = attempts[stage_id]
        assert (first, second) == (1, 2), stage_id
        assert [e["properties"]["failure_class"] for e in cut] == ["canceled"], stage_id
        assert [e["event"] for e in rerun] == ["stage.completed"], stage_id
    cp = _checkpoint(repo, run_id)
    assert cp["completed_nodes"] == ["start", "fan", "join", "exit"], cp["completed_nodes"]

    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(remote), str(other))
    fetched = _fabro(other, "fetch", "origin")
    assert fetched.returncode == 0, fetched.stderr
    again = _fabro(other, "fetch", "origin")
    assert again.returncode == 0, again.stderr
    branch = f"refs/heads/fabro/run/{run_id}"
    assert git(other, "rev-parse", branch) == git(repo, "rev-parse", branch)
    files = set(git(other, "ls-tree", "--name-only", branch).split())
    assert {"a1.txt", "a2.txt"} <= files, files


def test_a_rejected_push_shows_gits_own_message(repo: Path, tmp_path: Path) -> None:
    remote = bare_remote(tmp_path, "remote.git")
    git(repo, "remote", "add", "origin", str(remote))
    workflow = _workflow(tmp_path, {"one": "printf 'one\\n' > one.txt\n"})
    assert _fabro(repo, "run", str(workflow)).returncode == 0
    run_id = _only_run(repo)
    meta = f"refs/fabro/meta/{run_id}"
    # The remote's copy of the meta ref moves somewhere this repository never saw.
    stray = git(repo, "commit-tree", "-m", "elsewhere", f"{meta}^{{tree}}").strip()
    git(repo, "push", "-q", "origin", f"{stray}:{meta}")
    proc = _fabro(repo, "push", "origin", run_id)
    assert proc.returncode == 1, proc.stderr
    assert "rejected" in proc.stderr
    # git's own words, not only ours.
    assert "failed to push some refs" in proc.stderr, proc.stderr


def test_a_fetch_that_would_rewrite_a_run_keeps_it_and_says_so(repo: Path, tmp_path: Path) -> None:
    remote = bare_remote(tmp_path, "remote.git")
    git(repo, "remote", "add", "origin", str(remote))
    workflow = _workflow(tmp_path, {"one": "printf 'one\\n' > one.txt\n"})
    assert _fabro(repo, "run", str(workflow)).returncode == 0
    run_id = _only_run(repo)
    meta = f"refs/fabro/meta/{run_id}"
    stray = git(repo, "commit-tree", "-m", "elsewhere", f"{meta}^{{tree}}").strip()
    git(repo, "push", "-q", "origin", f"{stray}:{meta}")
    proc = _fabro(repo, "fetch", "origin")
    assert proc.returncode == 1, proc.stderr
    assert f"kept local {meta}" in proc.stderr and "not a fast-forward" in proc.stderr
    assert git(repo, "rev-parse", meta).strip() != stray


def test_a_stage_stopped_by_ctrl_c_is_closed_and_resumed_as_the_same_visit(
    repo: Path, tmp_path: Path
) -> None:
    """Ctrl-C writes a checkpoint; the stage it stopped did not finish, so it is not a
    visit: resume runs the same visit again (a node with max_visits=1 included)."""
    marker, ready = tmp_path / "attempted", tmp_path / "ready"
    workflow = _workflow(
        tmp_path,
        {
            "one": "printf 'one\\n' > one.txt\n",
            "two": f"""\
if [ -e {marker} ]; then printf 'two\\n' > two.txt; exit 0; fi
touch {marker} {ready}
{_forever(tmp_path)}
""",
        },
    )
    workflow.write_text(
        workflow.read_text().replace("shape=parallelogram", "shape=parallelogram, max_visits=1")
    )
    proc = _start(repo, workflow, tmp_path)
    try:
        _wait_for(ready, proc, tmp_path)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, (tmp_path / "run.err").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run_id = _only_run(repo)
    _resume(repo, run_id)
    attempts = _attempts(run_events(run_id, repo))
    (first, cut), (second, rerun) = attempts["two@1"]
    assert (first, second) == (1, 2)
    assert [e["properties"]["failure_class"] for e in cut] == ["canceled"]
    assert [e["event"] for e in rerun] == ["stage.completed"]
    assert "two@2" not in attempts
    cp = _checkpoint(repo, run_id)
    assert cp["completed_nodes"] == ["start", "one", "two", "exit"]
    assert cp["node_visits"]["two"] == 1


def test_a_setup_commands_background_process_ends_with_the_run(
    repo: Path, tmp_path: Path, spawned: list[int]
) -> None:
    pids = tmp_path / "pids"
    setup = tmp_path / "setup.sh"
    setup.write_text(f"({_forever(tmp_path)}) &\necho $! > {pids}\n")
    workflow = _workflow(tmp_path, {"one": "printf 'one\\n' > one.txt\n"})
    workflow.write_text(
        workflow.read_text().replace('graph [goal="resume exactly"]', f'graph [setup="sh {setup}"]')
    )
    proc = run_fabro("run", str(workflow), cwd=repo, timeout=60)
    background = int(pids.read_text())
    spawned.append(background)
    assert proc.returncode == 0, proc.stderr
    assert not _alive(background), "a setup command's background process outlived the run"


# -- child workflows ---------------------------------------------------------------------


def test_a_child_workflow_resumes_after_its_last_completed_stage(
    repo: Path, tmp_path: Path, spawned: list[int]
) -> None:
    """Killed inside a child after its first stage: resume runs the child on from its
    second stage, on the first stage's files, and never runs the first again."""
    ran, marker, ready = tmp_path / "k1-ran", tmp_path / "attempted", tmp_path / "ready"
    (tmp_path / "k1.sh").write_text(f"printf 'k1\\n' > k1.txt\nprintf 'x\\n' >> {ran}\n")
    (tmp_path / "k2.sh").write_text(
        f"""\
if [ -e {marker} ]; then
    test "$(cat k1.txt)" = k1 || {{ echo 'k1.txt is gone' >&2; exit 7; }}
    printf 'k2\\n' > k2.txt
    exit 0
fi
touch {marker}
echo $$ >> {tmp_path / "pids"}
touch {ready}
{_forever(tmp_path)}
"""
    )
    (tmp_path / "kid.fabro").write_text(
        f"""\
digraph Kid {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    k1 [shape=parallelogram, script="sh {tmp_path / "k1.sh"}"]
    k2 [shape=parallelogram, script="sh {tmp_path / "k2.sh"}"]
    start -> k1 -> k2 -> exit
}}
"""
    )
    workflow = tmp_path / "parent.fabro"
    workflow.write_text(
        """\
digraph Parent {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    kid   [shape=house, stack.child_workflow="kid.fabro"]
    start -> kid -> exit
}
"""
    )
    proc = _start(repo, workflow, tmp_path)
    _wait_for(ready, proc, tmp_path)
    spawned.extend(int(p) for p in (tmp_path / "pids").read_text().split())
    _kill_9(proc)
    run_id = _only_run(repo)
    _resume(repo, run_id)

    assert ran.read_text() == "x\n", "the child's first stage ran again"
    events = run_events(run_id, repo)
    completed = [e["node_id"] for e in events if e["event"] == "stage.completed"]
    assert completed.count("kid/k1") == 1 and completed.count("kid/k2") == 1
    assert completed.count("kid") == 1
    assert git(repo, "show", f"fabro/run/{run_id}:k1.txt") == "k1\n"
    assert git(repo, "show", f"fabro/run/{run_id}:k2.txt") == "k2\n"
    _attempts(events)
