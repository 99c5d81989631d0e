"""The sweep's view of `/proc` after each stage (`reaper.ProcessTable`): it reads again
only what may have become the run's, and still sees every process of the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until

from fabro_git.engine import reaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_table_reads_again_only_new_processes_and_descendants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = reaper.ProcessTable()
    before = {p.pid for p in table.read()}
    read: list[int] = []
    real = reaper.read_stat

    def counting(pid: int) -> reaper.ProcessInfo | None:
        read.append(pid)
        return real(pid)

    monkeypatch.setattr(reaper, "read_stat", counting)
    child = subprocess.Popen(["sleep", "30"])
    try:
        after = {p.pid: p for p in table.read()}
        # The new process is read, and seen as this process's child.
        assert child.pid in read
        assert after[child.pid].ppid == reaper.os.getpid()
        # Init, and whatever else was there before and is no descendant, is not read again.
        unrelated = (
            before
            - {reaper.os.getpid()}
            - {
                p.pid
                for p in reaper.descendants(
                    [reaper.os.getpid()], list(after.values()), zombies=True
                )
            }
        )
        assert 1 in before and 1 in unrelated  # so the next line has something to check
        assert not unrelated & set(read)
        # A descendant is read at every look: what it is now, not what it was.
        read.clear()
        table.read()
        assert child.pid in read
    finally:
        child.kill()
        child.wait()


def test_a_started_command_is_recorded_with_a_start_window_that_holds_its_start(
    tmp_path: Path,
) -> None:
    """`process_groups.start` brackets the start time instead of reading it back: the
    record still names that very group, and one whose window misses the leader's start
    does not."""
    import json

    import trio

    from fabro_git.engine import process_groups

    async def main() -> None:
        with open(os.devnull, "wb") as sink:
            process = await process_groups.start(
                ["sleep", "30"], cwd=tmp_path, stdout=sink, stderr=sink, env=dict(os.environ)
            )
        try:
            window = process_groups.started_between(process)
            assert window is not None
            path = process_groups.record(tmp_path / "groups", process.pid, started=window)
            assert path is not None
            entry = json.loads(path.read_text())
            leader = reaper.read_stat(process.pid)
            assert leader is not None
            assert entry["start"] <= leader.start <= entry.get("start_max", entry["start"])
            assert reaper.still_ours(
                process.pid, entry["start"], entry["boot"], entry.get("start_max")
            )
            # A recycled pid: a leader that started after the window is not the one recorded.
            assert not reaper.still_ours(process.pid, window[0] - 5, entry["boot"], window[0] - 1)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            process_groups.end_run(tmp_path / "groups", grace=0.0)  # the record's watcher

    trio.run(main)


def test_command_stages_record_their_groups_in_one_reused_file(repo: Path) -> None:
    """A command stage's group record goes into the file the stage before released when
    its group ended: stages make no record file each, and the run's end leaves none."""
    from helpers import git, run_fabro, write_workflow

    # The group is recorded just after its leader starts: the first stage waits (up to
    # 5 s) for its record's file to appear before it looks.
    wait = "for t in $(seq 100); do [ $(ls ../process-groups | wc -l) -ge 2 ] && break; sleep 0.05; done"
    stages = "".join(
        f'  s{i} [shape=parallelogram, script="{wait}; ls ../process-groups > seen_{i}.txt"]\n'
        for i in range(3)
    )
    write_workflow(
        repo,
        "digraph R {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        + stages
        + "  start -> s0 -> s1 -> s2 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    branch = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/fabro/run").strip()
    seen = [git(repo, "show", f"{branch}:seen_{i}.txt").split() for i in range(3)]
    assert len(seen[0]) == 2  # the run's mark, and the stage's own group
    assert seen[1] == seen[0] and seen[2] == seen[0]
    scratch = next((Path(os.environ["FABRO_HOME"]) / "runs").iterdir())
    assert not list((scratch / "process-groups").glob("*.json"))


def test_the_runs_end_kills_its_groups_and_reaps_its_watcher(tmp_path: Path) -> None:
    """`end_run`, as a run's end does: the group a stage left running is killed, and the
    watcher started with the first record is told `done` and waited for, so a process
    that goes on after the run (a test's, a server's) keeps no child of it."""
    from fabro_git.engine import process_groups

    records = process_groups.records_dir(tmp_path)
    leftover = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        process_groups.record(records, leftover.pid)
        watcher = process_groups._watchers[records]
        assert watcher is not None and watcher.process.poll() is None
        process_groups.end_run(records, grace=1.0)
        assert leftover.wait(timeout=10) == -signal.SIGTERM
        assert watcher.process.returncode == 0  # reaped, having read `done`
        assert records not in process_groups._watchers
    finally:
        if leftover.poll() is None:
            os.killpg(leftover.pid, signal.SIGKILL)
            leftover.wait()


def test_a_released_record_is_no_record_and_the_next_one_reads_whole(tmp_path: Path) -> None:
    """`release` marks a record's first byte, and the next record is written over it in
    place, padded where shorter: the released one is never taken for a group, the next
    one is read whole and its group killed."""
    from fabro_git.engine import process_groups, reaper

    records = process_groups.records_dir(tmp_path)
    ended = subprocess.Popen(["true"], start_new_session=True)
    ended.wait()
    # A bracketed start (`start_max` too): longer than the record written over it.
    path = process_groups.record(records, ended.pid, started=(1, 2))
    assert path is not None
    longer = path.read_bytes()
    process_groups.release(path)
    assert path.read_bytes() == process_groups.RELEASED + longer[1:]
    assert reaper.kill_recorded(records, owner=os.getpid()) == []
    assert path.exists()  # kept for the next record

    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert process_groups.record(records, live.pid) == path  # the same file
        text = path.read_text()
        assert len(text) == len(longer) and text.endswith(" ")
        assert json.loads(text)["pgid"] == live.pid
        assert reaper.kill_recorded(records, grace=1.0) == [live.pid]
        assert live.wait(timeout=10) == -signal.SIGTERM
    finally:
        if live.poll() is None:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait()
        process_groups.stop_watcher(records)


SWEEPS = """
import os, subprocess
from fabro_git.engine import process_groups, reaper

process_groups._Subreaper.on = True
reads = []
table_read = process_groups._table.read
process_groups._table.read = lambda: reads.append(1) or table_read()
process_groups.sweep_stage("nothing.stage.1", since=reaper.pids())
print("no child:", len(reads))
env = {k: v for k, v in os.environ.items() if k != "FABRO_PROCESS_MARK"}
orphan = subprocess.Popen(["sleep", "30"], start_new_session=True, env=env)
process_groups.sweep_stage("nothing.stage.2", since=reaper.pids())
orphan.wait(timeout=10)  # killed, and reaped by the sweep itself
print("unknown child:", len(reads), reaper.read_stat(orphan.pid))
"""


def test_a_stage_sweep_reads_the_table_only_when_something_was_adopted() -> None:
    """The sweep after a stage reads every process's `/proc` entry only when this
    process has a child that is neither a watcher nor one it started itself: with none,
    nothing was re-parented to it. A child of another session it did not start (what a
    stage's orphan is, once adopted) sends it to the table, which finds and kills it.
    In a process of its own, whose only children are the test's."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    proc = subprocess.run(
        [sys.executable, "-c", SWEEPS], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "no child: 0"
    reads, left = second.removeprefix("unknown child: ").split()
    assert int(reads) >= 1 and left == "None"  # read, and the orphan is gone


def test_the_pids_before_a_stage_are_the_last_read_when_it_is_recent() -> None:
    """A stage's "pids it did not start" may be the read of `/proc` its predecessor's
    sweep made, when that is recent: a process started since is not in it, so a marked
    one started then is still among those the sweep looks at, and is killed."""
    seen = reaper.pids()
    mark = f"test{os.getpid()}.stage.1"
    env = dict(os.environ, **{reaper.MARK_VARIABLE: mark})
    late = subprocess.Popen(["sleep", "30"], env=env)
    try:
        lately = reaper.pids_lately(max_age=60)
        assert lately == seen  # the earlier read, not a new one
        assert late.pid not in lately
        # Marked as /proc shows it before the sweep looks (and said, should it fail).
        wait_until(lambda: late.pid in reaper.marked(mark), what="the marked process")
        killed = set(reaper.kill_marked(mark, since=lately))
        assert killed == {late.pid}, (late.poll(), reaper.read_stat(late.pid))
        assert late.wait(timeout=10) == -signal.SIGKILL
    finally:
        late.kill()
        late.wait()
    # An old read is not taken: a new one is.
    fresh = subprocess.Popen(["sleep", "30"])
    try:
        assert fresh.pid in reaper.pids_lately(max_age=0)
    finally:
        fresh.kill()
        fresh.wait()
