"""The server's feeds of live runs, in process over a real live run: one feed however
many streams watch a run, and none once the last stream has left (a run may wait at a
gate for days; nobody needs its tail read meanwhile)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import trio
import trio.testing
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
                assert any(b'"event":"run.created"' in m for m in first.messages)
                # A page that reconnects goes on after the last event it saw; an id
                # that is none of the run's places it by time.
                ids = first.ids
                assert len(ids) == len(first.messages) >= 2
                assert (first.start_after(None), first.start_after(ids[0])) == (0, 1)
                assert first.start_after("0" * 36) == 0
                assert first.start_after("f" * 36) == len(ids)
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


def test_a_quiet_stream_gets_a_comment_line_so_a_vanished_client_is_noticed() -> None:
    """Every run's stream may be quiet for hours: it still writes now and then (a comment
    line), since only a write finds a client that vanished without closing."""
    from fabro_git.engine.reader import RunEvent
    from fabro_git.web.feeds import KEEPALIVE_SECONDS, relay

    first = RunEvent("R", b'{"id":"1","event":"run.created"}', {"id": "1"})
    sent: list[tuple[float, bytes]] = []

    async def follower() -> AsyncIterator[list[RunEvent]]:
        yield [first]
        await trio.sleep_forever()

    async def send(data: bytes) -> None:
        sent.append((trio.current_time(), data))
        if len(sent) == 3:
            raise OSError("the client is gone")  # as a write to a vanished client fails

    async def stream() -> None:
        start = trio.current_time()
        with trio.move_on_after(10 * KEEPALIVE_SECONDS):  # virtual time
            with contextlib.suppress(OSError):
                await relay(follower(), send)
        assert [data for _, data in sent] == [
            b'id: 1\ndata: {"id":"1","event":"run.created"}\n\n',
            b":\n\n",
            b":\n\n",
        ]
        assert [round(at - start) for at, _ in sent] == [
            0,
            KEEPALIVE_SECONDS,
            2 * KEEPALIVE_SECONDS,
        ]

    trio.run(stream, clock=trio.testing.MockClock(autojump_threshold=0))
