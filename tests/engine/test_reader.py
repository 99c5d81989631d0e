"""The run reader (`fabro_git.engine.reader`) in process, over a run made by the real
command: what it reads is what the commands print, and following works from trio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from helpers import run_fabro

from fabro_git.engine import reader
from fabro_git.store.repo import GitRepo


def _hello(repo: Path) -> str:
    proc = run_fabro("run", "hello", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def test_a_finished_run_read_back(repo: Path) -> None:
    run_id = _hello(repo)
    logs = run_fabro("logs", run_id, cwd=repo).stdout.splitlines()
    git = GitRepo.discover(repo)
    assert reader.resolve_run(git, run_id[:10]) == run_id
    notes: list[str] = []
    assert reader.resolve_run(git, "hello", note=notes.append) == run_id
    assert notes == [f"hello is a workflow: using its latest run, {run_id}"]
    [summary] = reader.list_runs(git, labels=True)
    assert (summary.run_id, summary.status, summary.workflow) == (run_id, "succeeded", "hello")

    run = reader.open_run(git, run_id)
    assert run.status == "succeeded" and not run.live
    assert [s.label for s in run.stages()] == ["start@1", "greet@1", "show@1", "exit@1"]
    greet = run.stage("greet")
    assert greet.status == "succeeded" and greet.files_touched == ["hello.txt"]
    record = greet.to_json()
    assert (record["stage"], record["status"], record["files_touched"]) == (
        "greet@1",
        "succeeded",
        ["hello.txt"],
    )
    show = run.stage("show@1")
    assert run.stage_file(show, "stdout.log") == b"Hello from git fabro!\n" + (
        b"This file was written by a workflow stage.\n2 lines\n"
    )
    diff = run.stage_diff(greet)
    assert diff is not None and "+++ b/hello.txt" in diff and "+Hello from git fabro!" in diff
    assert run.stage_diff(show) is None  # it changed no file
    assert run.transcript(greet) == []  # no agent
    assert [entry.label for entry in run.timeline()] == [s.label for s in run.stages()]

    events = run.events()
    assert [event.json_text for event in events] == logs
    middle = events[10]
    assert run.events(after=middle.id) == events[11:]
    assert run.events(after="00000000-0000-7000-8000-000000000000") == events
    assert run.events(after="ffffffff-ffff-7fff-bfff-ffffffffffff") == []


def test_following_a_finished_run_from_trio_gives_its_events_and_ends(repo: Path) -> None:
    run_id = _hello(repo)
    git = GitRepo.discover(repo)
    expected = reader.read_events(git, run_id)

    async def follow() -> list[reader.RunEvent]:
        got: list[reader.RunEvent] = []
        cursor = reader.EventCursor(git, run_id, after=expected[4].id)
        async for batch in cursor.follow_async(interval=0.01):
            got += batch
        return got

    assert trio.run(follow) == expected[5:]
    # Blocking, several runs at once (here one, named twice), and it ends too.
    cursors = [reader.EventCursor(git, run_id), reader.EventCursor(git, run_id)]
    batches = list(reader.follow_all(cursors, interval=0.01))
    assert [event for batch in batches for event in batch] == expected + expected


def test_a_follower_holding_a_lock_keeps_it_from_each_read_until_the_batch_is_handled(
    repo: Path,
) -> None:
    # `attach` draws what its follower read while a gate, catching up, takes the same
    # lock: it must find every line read so far drawn, and not wait for the next line.
    run_id = _hello(repo)
    git = GitRepo.discover(repo)

    async def follow() -> list[str]:
        lock = trio.Lock()
        order: list[str] = []

        async def catch_up() -> None:
            async with lock:
                order.append("caught up")

        cursor = reader.EventCursor(git, run_id)
        async with trio.open_nursery() as nursery:
            async for batch in cursor.follow_async(interval=0.01, holding=lock):
                assert lock.locked()
                nursery.start_soon(catch_up)
                await trio.sleep(0.05)  # the catching up tries its lock meanwhile
                order.append(f"drawn {len(batch)}")
        return order

    events = reader.read_events(git, run_id)
    # The run has ended, so the follower then only waits: the lock is free meanwhile.
    assert trio.run(follow) == [f"drawn {len(events)}", "caught up"]


def test_a_runs_backlog_is_followed_a_batch_at_a_time(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following every run takes each run's history a batch at a time, in order, never
    whole: a fetched run may have millions of events. A follower that shares its cursor
    (one holding a lock) still takes the backlog at once."""
    from fabro_git.engine.reader import events as events_module

    first, second = _hello(repo), _hello(repo)
    git = GitRepo.discover(repo)
    expected = {run_id: reader.read_events(git, run_id) for run_id in (first, second)}
    monkeypatch.setattr(events_module, "BACKLOG_BATCH", 7)
    got: dict[str, list[reader.RunEvent]] = {first: [], second: []}
    sizes = []
    for batch in reader.follow_all([], new_runs=reader.NewRuns(git), interval=0.01):
        sizes.append(len(batch))
        got[batch[0].run_id] += batch
        if got == expected:
            break
    assert max(sizes) == 7 and len(sizes) >= 2 * (len(expected[first]) // 7)

    # From trio too, with `after` placed in the third batch.
    async def follow(holding: trio.Lock | None) -> list[list[reader.RunEvent]]:
        cursor = reader.EventCursor(git, first, after=expected[first][17].id)
        return [batch async for batch in cursor.follow_async(interval=0.01, holding=holding)]

    batches = trio.run(follow, None)
    assert [e for batch in batches for e in batch] == expected[first][18:]
    assert max(len(batch) for batch in batches) <= 7
    [whole] = trio.run(follow, trio.Lock())
    assert whole == expected[first][18:]
