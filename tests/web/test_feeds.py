"""The server's feeds of live runs, in process over a real live run: one feed however
many streams watch a run, and none once the last stream has left (a run may wait at a
gate for days; nobody needs its tail read meanwhile)."""

from __future__ import annotations

from pathlib import Path

import trio
from helpers import run_fabro

from fabro_git.web.feeds import Feeds
from fabro_git.web.source import RepositoryRuns
from web.serving import start_waiting_run


def test_a_live_runs_feed_ends_when_its_last_watcher_leaves(repo: Path) -> None:
    run_id, release = start_waiting_run(repo)

    async def watch_and_leave() -> None:
        with trio.move_on_after(60) as waited:
            async with trio.open_nursery() as nursery:
                feeds = Feeds(RepositoryRuns(repo), nursery)
                first, second = feeds.watch(run_id), feeds.watch(run_id)
                assert first is second
                await first.loaded.wait()
                assert any(event.name == "run.created" for event in first.events)
                feeds.unwatch(first)
                assert feeds.followed() == [run_id]
                feeds.unwatch(second)
                assert feeds.followed() == []
            # The nursery is left only once the feed's task has ended, while the run
            # still waits (a feed that went on would hold it until the run's end).
        assert not waited.cancelled_caught, "the feed went on following with nobody watching"

    try:
        trio.run(watch_and_leave)
    finally:
        release.touch()
        waited_run = run_fabro("wait", run_id, cwd=repo)
    assert waited_run.returncode == 0, waited_run.stderr
