"""Runs' events as Server-Sent Events: replay what is recorded, then follow the live tail.

Each event is one SSE message whose `id:` is the envelope's id and whose `data:` line is
exactly the line `git fabro logs` prints for it (the same `json_printable` text), so a
client that reconnects with `Last-Event-ID` resumes after that event.

A live run is followed once, however many pages watch it: a `Feed` polls the tail and
keeps the run's events in order, and each stream is an index into them that waits for
the feed to grow. A finished run is read once per request, a segment at a time, and
needs no feed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import cast

import trio

from fabro_git.engine.reader import EventCursor, NewRuns, RunEvent, events_after
from fabro_git.web.source import RepositoryRuns

# How often a live run's tail is looked at: well under the 100 ms an event may take to
# reach a page, and cheap (one read of what was appended).
POLL_SECONDS = 0.03
# Every run's stream also looks for new runs each time: a little less often.
ALL_RUNS_POLL_SECONDS = 0.1
# A comment line sent on a quiet stream, so a client that went away is noticed.
KEEPALIVE_SECONDS = 15.0
# A finished run's events are sent this many at a time (a message each), or fewer when
# their lines come to REPLAY_BYTES: a line may be as big as a segment.
REPLAY_BATCH = 200
REPLAY_BYTES = 1 << 20


def message(event: RunEvent) -> bytes:
    """One event as an SSE message: `id:` its id, `data:` the line `logs` prints."""
    event_id = "".join(ch for ch in event.id if ch not in "\r\n\0")  # a forged id may
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {event.json_text}\n\n".encode()


class Feed:
    """A live run's events, growing as the run writes them, until it ends."""

    def __init__(self, source: RepositoryRuns, run_id: str) -> None:
        self.source = source
        self.run_id = run_id
        # Each event's id and its SSE message, in order: the decoded events are not
        # kept, and the messages are what every watching page is sent.
        self.ids: list[str] = []
        self.messages: list[bytes] = []
        self.ended = False
        self.watchers = 0
        self._grown = trio.Event()
        self.loaded = trio.Event()
        # Cancelled when the last page watching it leaves: a run may wait at a gate for
        # days, and nobody needs its tail read every POLL_SECONDS meanwhile.
        self.scope = trio.CancelScope()

    async def follow(self) -> None:
        """Load what is recorded, then follow the tail until the run ends (or nobody
        watches it any more)."""
        try:
            with self.scope:
                cursor = await trio.to_thread.run_sync(self.source.cursor, self.run_id)
                self._add(await trio.to_thread.run_sync(cursor.read))
                self.loaded.set()
                async with _closing(cursor.follow_async(interval=POLL_SECONDS)) as batches:
                    async for batch in batches:
                        self._add(batch)
        finally:
            self.ended = True
            self.loaded.set()
            self._wake()

    def _add(self, events: list[RunEvent]) -> None:
        if events:
            self.ids.extend(event.id for event in events)
            self.messages.extend(message(event) for event in events)
            self._wake()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = trio.Event()

    async def wait_grown(self) -> None:
        await self._grown.wait()

    def start_after(self, last_id: str | None) -> int:
        """Where a page that saw `last_id` goes on: after that event, or, when it is not
        one of the run's, at the first event whose id (a UUID v7, in time order) sorts
        after it."""
        if last_id is None:
            return 0
        with contextlib.suppress(ValueError):
            return self.ids.index(last_id) + 1
        return next((i for i, id_ in enumerate(self.ids) if id_ > last_id), len(self.ids))


class Feeds:
    """The feeds of the live runs being watched, each followed by one task."""

    def __init__(self, source: RepositoryRuns, nursery: trio.Nursery) -> None:
        self.source = source
        self.nursery = nursery
        self._feeds: dict[str, Feed] = {}

    def watch(self, run_id: str) -> Feed:
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = Feed(self.source, run_id)
            self._feeds[run_id] = feed
            self.nursery.start_soon(feed.follow)
        feed.watchers += 1
        return feed

    def unwatch(self, feed: Feed) -> None:
        feed.watchers -= 1
        if feed.watchers == 0:
            feed.scope.cancel()
            if self._feeds.get(feed.run_id) is feed:
                del self._feeds[feed.run_id]

    def followed(self) -> list[str]:
        """The runs followed now."""
        return list(self._feeds)


Send = Callable[[bytes], Awaitable[None]]
Produce = Callable[[Send], Awaitable[None]]


async def run_stream(feeds: Feeds, run_id: str, last_id: str | None) -> Produce:
    """What sends one run's events after `last_id`, following while it lives. A finished
    run's events are opened here, before the answer starts: a run that cannot be read is
    refused (a FabroError) as the other endpoints refuse it, not cut off mid-stream."""
    source = feeds.source
    if await trio.to_thread.run_sync(source.live, run_id):
        return lambda send: _follow_live(feeds, run_id, last_id, send)
    stream = await trio.to_thread.run_sync(source.iter_events, run_id, last_id)
    return lambda send: _replay(stream, send)


async def _replay(stream: Iterator[RunEvent], send: Send) -> None:
    """Send a finished run's events: a batch and the segment it came from in memory."""
    while batch := await trio.to_thread.run_sync(_next_batch, stream):
        await send(b"".join(message(event) for event in batch))


def _next_batch(stream: Iterator[RunEvent]) -> list[RunEvent]:
    batch: list[RunEvent] = []
    size = 0
    for event in stream:
        batch.append(event)
        size += len(event.line)
        if len(batch) == REPLAY_BATCH or size >= REPLAY_BYTES:
            break
    return batch


async def _follow_live(feeds: Feeds, run_id: str, last_id: str | None, send: Send) -> None:
    feed = feeds.watch(run_id)
    try:
        await feed.loaded.wait()
        await _follow(feed, feed.start_after(last_id), send)
    finally:
        feeds.unwatch(feed)


async def _follow(feed: Feed, index: int, send: Send) -> None:
    while True:
        if index < len(feed.messages):
            batch = feed.messages[index:]
            index += len(batch)
            await send(b"".join(batch))
            continue
        if feed.ended:
            return
        with trio.move_on_after(KEEPALIVE_SECONDS) as waited:
            await feed.wait_grown()
        if waited.cancelled_caught:
            await send(b":\n\n")


async def all_runs_stream(source: RepositoryRuns, last_id: str | None, send: Send) -> None:
    """Send every run's events: each run's recorded events, then the live runs' new ones
    as they come, and those of runs that start later. Never returns by itself. `last_id`
    resumes after that event (ids are ordered by time across runs too)."""
    from fabro_git.engine.reader import follow_all_async

    new_runs = await trio.to_thread.run_sync(source.new_runs)
    following = follow_all_async([], new_runs=new_runs, interval=ALL_RUNS_POLL_SECONDS)
    await relay(following, send, after=last_id)


async def new_events_stream(following: tuple[dict[str, EventCursor], NewRuns], send: Send) -> None:
    """Send every run's events from the point `following` was taken at (what the live
    runs emit from now, and the runs that start or are resumed later), never a backlog:
    what the runs page needs to update its rows. Never returns by itself."""
    from fabro_git.engine.reader import follow_all_async

    stirring = await trio.to_thread.run_sync(RunsStirring, *following)
    live = [stirring.cursors[run_id] for run_id in stirring.live]
    await relay(follow_all_async(live, new_runs=stirring, interval=ALL_RUNS_POLL_SECONDS), send)


class RunsStirring:
    """The runs a follower from now takes up as it goes: each new run (from its first
    event), and now and then each known run that is live again (`git fabro resume`),
    from where its events stood. A cursor handed out twice is read once per line: it
    keeps its own place, so a run taken up again while still followed repeats nothing."""

    # Looking at every known run's lock costs two stats each: once a second.
    EVERY = max(1, round(1.0 / ALL_RUNS_POLL_SECONDS))

    def __init__(self, cursors: dict[str, EventCursor], new_runs: NewRuns) -> None:
        self.cursors = cursors
        self.new_runs = new_runs
        self.live = {run_id for run_id, cursor in cursors.items() if cursor.is_live()}
        self.rounds = 0

    def __call__(self) -> list[EventCursor]:
        fresh = self.new_runs()
        for cursor in fresh:
            self.cursors[cursor.run_id] = cursor
            self.live.add(cursor.run_id)
        self.rounds += 1
        if self.rounds % self.EVERY == 0:
            for run_id, cursor in self.cursors.items():
                if not cursor.is_live():
                    self.live.discard(run_id)
                elif run_id not in self.live:
                    self.live.add(run_id)
                    fresh.append(cursor)
        return fresh


async def relay(
    batches: AsyncIterator[list[RunEvent]], send: Send, *, after: str | None = None
) -> None:
    """Send a follower's batches as they come (the events after `after`), and a comment
    line when the stream has been quiet for KEEPALIVE_SECONDS, so a client that vanished
    without closing is noticed (a write fails) and its follower stops."""
    sender, receiver = trio.open_memory_channel[list[RunEvent]](0)

    async def pump() -> None:
        async with sender, _closing(batches) as following:
            async for batch in following:
                await sender.send(batch)

    async def forward() -> None:
        async with receiver:
            while True:
                batch = None
                with trio.move_on_after(KEEPALIVE_SECONDS):
                    try:
                        batch = await receiver.receive()
                    except trio.EndOfChannel:
                        return
                if batch is None:
                    await send(b":\n\n")
                    continue
                wanted = events_after(batch, after)
                if wanted:
                    await send(b"".join(message(event) for event in wanted))

    gone: OSError | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        try:
            await forward()
        except OSError as exc:  # the client went away: said as a write says it
            gone = exc
        nursery.cancel_scope.cancel()
    if gone is not None:
        raise gone


def _closing(
    batches: AsyncIterator[list[RunEvent]],
) -> contextlib.aclosing[AsyncGenerator[list[RunEvent], None]]:
    """The reader's follower, closed when the stream is left (a client hung up)."""
    return contextlib.aclosing(cast("AsyncGenerator[list[RunEvent], None]", batches))
