"""Runs' events as Server-Sent Events: replay what is recorded, then follow the live tail.

Each event is one SSE message whose `id:` is the envelope's id and whose `data:` line is
exactly the line `git fabro logs` prints for it (the same `json_printable` text), so a
client that reconnects with `Last-Event-ID` resumes after that event.

A live run is followed once, however many pages watch it: a `Feed` polls the tail and
keeps the run's events in order, and each stream is an index into them that waits for
the feed to grow. A finished run is read once per request and needs no feed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from fabro_git.terminal import json_printable
from fabro_git.web.source import RunSource

# How often a live run's tail is looked at: well under the 100 ms an event may take to
# reach a page, and cheap (one read of what was appended).
POLL_SECONDS = 0.03
# A run whose lock nobody holds is ended after this many looks, so its last lines land.
IDLE_CHECKS_TO_END = 3
# A comment line sent on a quiet stream, so a client that went away is noticed.
KEEPALIVE_SECONDS = 15.0


class Event:
    """One event ready to send: its id and its SSE message."""

    __slots__ = ("id", "message", "run_id")

    def __init__(self, run_id: str, event_id: str, message: bytes) -> None:
        self.run_id = run_id
        self.id = event_id
        self.message = message


def parse_lines(run_id: str, data: bytes) -> list[Event]:
    """The whole event lines in `data` (a line that is not an envelope is skipped, as
    `logs` skips it)."""
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        text = line.decode("utf-8", "replace")
        try:
            envelope = json.loads(text)
        except ValueError:
            continue
        if not isinstance(envelope, dict):
            continue
        event_id = _one_line(str(envelope.get("id", "")))
        printed = json_printable(text)
        message = f"id: {event_id}\ndata: {printed}\n\n" if event_id else f"data: {printed}\n\n"
        out.append(Event(run_id, event_id, message.encode("utf-8")))
    return out


def _one_line(text: str) -> str:
    """An id as an SSE field value (a recorded id is never multi-line, a forged one may be)."""
    return "".join(ch for ch in text if ch not in "\r\n\0")


class Feed:
    """A live run's events, growing as the run writes them, until it ends."""

    def __init__(self, source: RunSource, run_id: str) -> None:
        self.source = source
        self.run_id = run_id
        self.events: list[Event] = []
        self.ended = False
        self.watchers = 0
        self._grown = trio.Event()
        self.loaded = trio.Event()

    async def follow(self) -> None:
        """Load what is recorded, then follow the tail until the run ends."""
        try:
            data, offset = await trio.to_thread.run_sync(self.source.events, self.run_id)
            self._add(parse_lines(self.run_id, data))
            self.loaded.set()
            tail = self.source.tail(self.run_id)
            pending = b""
            idle_checks = 0
            while idle_checks < IDLE_CHECKS_TO_END:
                chunk, live = await trio.to_thread.run_sync(self._read_tail, tail, offset)
                if chunk:
                    offset += len(chunk)
                    complete, _, pending = (pending + chunk).rpartition(b"\n")
                    self._add(parse_lines(self.run_id, complete))
                    idle_checks = 0
                elif not live:
                    idle_checks += 1
                await trio.sleep(POLL_SECONDS)
        finally:
            self.ended = True
            self.loaded.set()
            self._wake()

    def _read_tail(self, tail: Any, offset: int) -> tuple[bytes, bool]:
        try:
            with tail.open("rb") as fh:
                fh.seek(offset)
                chunk: bytes = fh.read()
        except OSError:
            chunk = b""
        return chunk, chunk != b"" or self.source.live(self.run_id)

    def _add(self, events: list[Event]) -> None:
        if events:
            self.events.extend(events)
            self._wake()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = trio.Event()

    async def wait_grown(self) -> None:
        await self._grown.wait()


class Feeds:
    """The feeds of the live runs being watched, each followed by one task."""

    def __init__(self, source: RunSource, nursery: trio.Nursery) -> None:
        self.source = source
        self.nursery = nursery
        self._feeds: dict[str, Feed] = {}

    def watch(self, run_id: str) -> Feed:
        feed = self._feeds.get(run_id)
        if feed is None or (feed.ended and feed.watchers == 0):
            feed = Feed(self.source, run_id)
            self._feeds[run_id] = feed
            self.nursery.start_soon(feed.follow)
        feed.watchers += 1
        return feed

    def unwatch(self, feed: Feed) -> None:
        feed.watchers -= 1
        if feed.ended and feed.watchers == 0 and self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]


def start_index(events: list[Event], last_id: str | None) -> int:
    """Where a stream resumes: after the event `last_id` names. Envelope ids grow with
    time (UUIDv7), so an id this run does not hold resumes after the events before it."""
    if not last_id:
        return 0
    for index, event in enumerate(events):
        if event.id == last_id:
            return index + 1
    return sum(1 for event in events if event.id and event.id <= last_id)


Send = Callable[[bytes], Awaitable[None]]


async def run_stream(feeds: Feeds, run_id: str, last_id: str | None, send: Send) -> None:
    """Send one run's events after `last_id`, following while it lives."""
    source = feeds.source
    if not await trio.to_thread.run_sync(source.live, run_id):
        data, _offset = await trio.to_thread.run_sync(source.events, run_id)
        events = parse_lines(run_id, data)
        for event in events[start_index(events, last_id) :]:
            await send(event.message)
        return
    feed = feeds.watch(run_id)
    try:
        await feed.loaded.wait()
        await _follow(feed, start_index(feed.events, last_id), send)
    finally:
        feeds.unwatch(feed)


async def _follow(feed: Feed, index: int, send: Send) -> None:
    while True:
        if index < len(feed.events):
            batch = feed.events[index:]
            index += len(batch)
            await send(b"".join(event.message for event in batch))
            continue
        if feed.ended:
            return
        with trio.move_on_after(KEEPALIVE_SECONDS) as waited:
            await feed.wait_grown()
        if waited.cancelled_caught:
            await send(b":\n\n")


async def all_runs_stream(
    feeds: Feeds, last_id: str | None, send: Send, *, rescan_seconds: float = 1.0
) -> None:
    """Send every run's events: each run's recorded events, then the live runs' new ones
    as they come, and those of runs that start later. Never returns by itself. `last_id`
    resumes after that event (ids are ordered by time across runs too)."""
    seen: set[str] = set()
    lock = trio.Lock()  # one run's batch at a time, so messages never interleave

    async def send_whole(message: bytes) -> None:
        async with lock:
            await send(message)

    async with trio.open_nursery() as nursery:
        while True:
            rows = await trio.to_thread.run_sync(feeds.source.rows)
            for row in reversed(rows):  # oldest first
                run_id = str(row["run_id"])
                if run_id not in seen:
                    seen.add(run_id)
                    nursery.start_soon(run_stream, feeds, run_id, last_id, send_whole)
            await trio.sleep(rescan_seconds)
