"""A run's events as a reader sees them: what git holds, then the live tail, each once.

The segments on the meta ref are the durable log; the live tail in this repository's
scratch dir (`events.jsonl`) adds what happened since the last snapshot. Either may be
missing (a clone has no tail; a new run has one segment), and the two never repeat an
event: the tail is read after the last event a snapshot holds.

Following a live run is one loop (`_follow_steps`): read what is new, and when nothing
is, wait a moment unless the run has ended (several runs are followed by one loop too,
and the runs a repository starts meanwhile with `NewRuns`). It is written once and driven two ways:
`EventCursor.follow` sleeps between reads (a command's own thread), `follow_async` runs
each read on a worker thread and waits with `trio.sleep`, so a trio program (the web
view, `attach`) is never blocked by git or the disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from fabro_git.config.locations import run_scratch_dir
from fabro_git.errors import StoreError
from fabro_git.events.bus import last_event_id, tail_after
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as layout
from fabro_git.store.repo import GitRepo
from fabro_git.terminal import json_printable

if TYPE_CHECKING:
    import trio

# How often a follower looks at the tail, and how many empty looks after the run's lock
# is gone it makes before stopping, so the run's last lines land first.
FOLLOW_INTERVAL = 0.2
SETTLE_CHECKS = 3


class RunEvent(msgspec.Struct, frozen=True):
    """One recorded event: its line as the run wrote it, and that line decoded."""

    run_id: str
    line: bytes  # one JSON line, no newline, exactly as recorded (redacted at emission)
    envelope: JsonObject

    @property
    def id(self) -> str:
        return str(self.envelope.get("id") or "")

    @property
    def name(self) -> str:
        return str(self.envelope.get("event") or "")

    @property
    def ts(self) -> str:
        return str(self.envelope.get("ts") or "")

    @property
    def node_id(self) -> str | None:
        node = self.envelope.get("node_id")
        return str(node) if node is not None else None

    @property
    def stage_id(self) -> str | None:
        stage = self.envelope.get("stage_id")
        return str(stage) if stage is not None else None

    @property
    def properties(self) -> JsonObject:
        props = self.envelope.get("properties")
        return props if isinstance(props, dict) else {}

    @property
    def json_text(self) -> str:
        """The line as `git fabro logs` prints it (and `events`, and the web view's SSE
        `data:`): the same JSON, with what a terminal could act on escaped."""
        return json_printable(self.line.decode("utf-8", "replace"))


def decode_lines(run_id: str, data: bytes) -> list[RunEvent]:
    """The events of JSONL `data`; a line that is not a JSON object (a fragment a crash
    left) is skipped."""
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            envelope = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(envelope, dict):
            out.append(RunEvent(run_id, line, envelope))
    return out


def tail_path(repo: GitRepo, run_id: str) -> Path:
    """The live event tail this repository keeps for the run (it may not exist)."""
    return run_scratch_dir(Path(repo.git_dir), run_id) / "events.jsonl"


def durable_events(repo: GitRepo, meta_sha: str) -> bytes:
    """Every event the snapshot `meta_sha` holds, in order (sharded and flat layouts)."""
    return layout.read_events(repo, meta_sha)


def recorded_events(repo: GitRepo, run_id: str) -> tuple[bytes, bytes, int]:
    """(the meta ref's events, the live tail's events after them, the tail's length):
    everything the run has recorded so far, each event once. A meta ref git cannot read
    is an error that names the run and says what to do."""
    meta = repo.read_ref(layout.meta_ref(run_id))
    try:
        return recorded_since(repo, run_id, meta)
    except StoreError as exc:
        from fabro_git.engine.session import unreadable_meta

        raise unreadable_meta(run_id, meta or "", exc) from exc


def recorded_since(repo: GitRepo, run_id: str, meta: str | None) -> tuple[bytes, bytes, int]:
    """`recorded_events` as of the snapshot `meta` (None: none yet); git's errors are
    left to the caller."""
    durable = durable_events(repo, meta) if meta else b""
    live_tail = tail_path(repo, run_id)
    try:
        data = live_tail.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no tail here
        return durable, b"", 0
    return durable, tail_after(data, last_event_id(durable)), len(data)


def read_events(repo: GitRepo, run_id: str, *, after: str | None = None) -> list[RunEvent]:
    """Every event the run has recorded so far, oldest first; with `after`, only those
    after the event of that id (a client resuming, as SSE's `Last-Event-ID`)."""
    durable, extra, _ = recorded_events(repo, run_id)
    return events_after(decode_lines(run_id, durable + extra), after)


def events_after(events: Sequence[RunEvent], after: str | None) -> list[RunEvent]:
    """The events after the one whose id is `after`; if no event has that id, those
    whose id (a UUID v7, so in time order) sorts after it. All of them when None."""
    if after is None:
        return list(events)
    for index, event in enumerate(events):
        if event.id == after:
            return list(events[index + 1 :])
    return [event for event in events if event.id > after]


class EventCursor:
    """Where one reader is in a run's events. The first `read` gives the backlog (git's
    events, then the tail's beyond them); each later one the tail's complete lines that
    arrived since. `read` never waits; `follow` and `follow_async` wait for more."""

    def __init__(self, repo: GitRepo, run_id: str, *, after: str | None = None) -> None:
        self.repo = repo
        self.run_id = run_id
        self.after = after
        self.tail = tail_path(repo, run_id)
        self._started = False
        self._offset = 0
        self._pending = b""
        # `attach` reads from the trio thread while its follower reads on a worker.
        self._lock = threading.Lock()

    def read(self) -> list[RunEvent]:
        with self._lock:
            if not self._started:
                self._started = True
                durable, extra, self._offset = recorded_events(self.repo, self.run_id)
                return events_after(decode_lines(self.run_id, durable + extra), self.after)
            try:
                with self.tail.open("rb") as fh:
                    fh.seek(self._offset)
                    chunk = fh.read()
            except (FileNotFoundError, NotADirectoryError):  # no tail here
                return []
            if not chunk:
                return []
            self._offset += len(chunk)
            complete, _, self._pending = (self._pending + chunk).rpartition(b"\n")
            return events_after(decode_lines(self.run_id, complete), self.after)

    def skip_backlog(self) -> None:
        """Start from now: later reads give only the lines the tail gets from here on
        (a reader that wants what happens next, not what happened)."""
        with self._lock:
            self._started = True
            try:
                self._offset = self.tail.stat().st_size
            except (FileNotFoundError, NotADirectoryError):  # no tail here
                self._offset = 0

    def is_live(self) -> bool:
        from fabro_git.engine.lock import is_live

        return is_live(Path(self.repo.git_dir), self.run_id)

    def follow(self, *, interval: float = FOLLOW_INTERVAL) -> Iterator[list[RunEvent]]:
        """Batches of events, the backlog first, until the run has ended and its last
        lines are read. Blocks between reads: for a command's own thread."""
        return follow_all([self], interval=interval)

    def follow_async(
        self, *, interval: float = FOLLOW_INTERVAL, holding: trio.Lock | None = None
    ) -> AsyncIterator[list[RunEvent]]:
        """`follow` for a trio task: reads run on a worker thread, waits are trio's.
        `holding` is held from each read until the batch is handled (see
        `follow_all_async`)."""
        return follow_all_async([self], interval=interval, holding=holding)


class NewRuns:
    """The runs of a repository as they appear: each call gives a cursor on every run
    whose meta ref appeared since the last (those in `known` count as seen). Following
    a whole repository's events picks up the runs started while it follows."""

    def __init__(self, repo: GitRepo, known: Iterable[str] = ()) -> None:
        self.repo = repo
        self.seen = set(known)

    def __call__(self) -> list[EventCursor]:
        fresh = [run_id for run_id in layout.list_run_ids(self.repo) if run_id not in self.seen]
        self.seen.update(fresh)
        return [EventCursor(self.repo, run_id) for run_id in fresh]


def _follow_steps(
    cursors: Sequence[EventCursor], new_runs: Callable[[], list[EventCursor]] | None
) -> Iterator[list[RunEvent] | None]:
    """The one follow loop: a batch of new events from some run, or None for "wait a
    moment". Without `new_runs` it ends once every run has ended and stayed quiet
    SETTLE_CHECKS times; with it, it looks for new runs each round and never ends."""
    following = list(cursors)
    idle = [0] * len(following)
    while new_runs is not None or any(count < SETTLE_CHECKS for count in idle):
        if new_runs is not None:
            fresh = new_runs()
            following += fresh
            idle += [0] * len(fresh)
        got = False
        for index, cursor in enumerate(following):
            if idle[index] >= SETTLE_CHECKS:
                continue  # ended: its last lines are read
            batch = cursor.read()
            if batch:
                idle[index] = 0
                got = True
                yield batch
            elif not cursor.is_live():
                idle[index] += 1
        if not got:
            yield None


def follow_all(
    cursors: Sequence[EventCursor],
    *,
    new_runs: Callable[[], list[EventCursor]] | None = None,
    interval: float = FOLLOW_INTERVAL,
) -> Iterator[list[RunEvent]]:
    """Follow several runs at once (and those `new_runs` finds, e.g. `NewRuns(repo)`),
    blocking between reads; ends when all have ended, or never with `new_runs`."""
    for batch in _follow_steps(cursors, new_runs):
        if batch is None:
            time.sleep(interval)
        else:
            yield batch


async def follow_all_async(
    cursors: Sequence[EventCursor],
    *,
    new_runs: Callable[[], list[EventCursor]] | None = None,
    interval: float = FOLLOW_INTERVAL,
    holding: trio.Lock | None = None,
) -> AsyncIterator[list[RunEvent]]:
    """`follow_all` for a trio task: each step runs on a worker thread.

    With `holding`, the lock is held from each read until the caller asks for the next
    batch, never while waiting: another reader of the same cursors that takes it (attach
    catching up before it asks at a gate) finds every line read so far already handled."""
    import contextlib

    import trio

    steps = _follow_steps(cursors, new_runs)
    done = object()
    guard: contextlib.AbstractAsyncContextManager[object] = (
        holding if holding is not None else contextlib.nullcontext()
    )
    while True:
        async with guard:
            batch = await trio.to_thread.run_sync(next, steps, done)
            if batch is done:
                return
            if batch is not None:
                yield batch  # type: ignore[misc]
                continue
        await trio.sleep(interval)
