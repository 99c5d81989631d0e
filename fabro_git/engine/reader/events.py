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
from fabro_git.errors import FabroError, StoreError
from fabro_git.events.bus import last_event_id, lines_after
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
# A follower that has the cursors to itself takes a run's backlog this many events at a
# time, a segment in memory at most, not the whole history at once (a fetched run may
# have millions of events).
BACKLOG_BATCH = 1000
# How much of a live tail is read at a time.
_TAIL_BLOCK = 1 << 20


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
    return list(_decoded(run_id, data))


def _decoded(run_id: str, data: bytes) -> Iterator[RunEvent]:
    """`decode_lines`, a line at a time: what is decoded is one event, not a segment."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        line = data[start:end].rstrip(b"\r")
        start = end + 1
        if not line.strip():
            continue
        try:
            envelope = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(envelope, dict):
            yield RunEvent(run_id, line, envelope)


def tail_path(repo: GitRepo, run_id: str) -> Path:
    """The live event tail this repository keeps for the run (it may not exist)."""
    return run_scratch_dir(Path(repo.git_dir), run_id) / "events.jsonl"


def recorded_stream(repo: GitRepo, run_id: str) -> tuple[Iterator[bytes], int]:
    """Everything the run has recorded so far, each event once, as blocks of JSON lines:
    the meta ref's segments, one in memory at a time, then the live tail's lines after
    them, read a block at a time; and the length of the tail they go up to.

    What git holds is checked before this returns, each segment by its header: a meta
    ref git cannot read (a segment missing, or too big to be one) is an error here that
    names the run and says what to do, before any event is given."""
    return recorded_stream_since(repo, run_id, repo.read_ref(layout.meta_ref(run_id)))


def recorded_stream_since(
    repo: GitRepo, run_id: str, meta: str | None
) -> tuple[Iterator[bytes], int]:
    """`recorded_stream` as of the snapshot `meta` (None: none yet)."""
    try:
        if meta:
            layout.check_segments(repo, meta)
    except StoreError as exc:
        raise _unreadable(run_id, meta or "", exc) from exc
    tail = tail_path(repo, run_id)
    length = _size(tail)
    return _recorded_blocks(repo, run_id, meta, tail, length), length


def _recorded_blocks(
    repo: GitRepo, run_id: str, meta: str | None, tail: Path, length: int
) -> Iterator[bytes]:
    last = None
    try:
        for data in layout.iter_segments(repo, meta) if meta else ():
            last = last_event_id(data) or last
            yield data
    except StoreError as exc:  # gone since it was checked
        raise _unreadable(run_id, meta or "", exc) from exc
    for line in lines_after(lambda: _tail_lines(tail, length), last):
        yield line + b"\n"


def _unreadable(run_id: str, meta: str, exc: StoreError) -> FabroError:
    """The error for a run whose meta ref git cannot read (`exc`), naming the run."""
    from fabro_git.engine.stored_run import unreadable_meta

    return unreadable_meta(run_id, meta, exc)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except (FileNotFoundError, NotADirectoryError):  # no tail here
        return 0


def _tail_lines(tail: Path, length: int) -> Iterator[bytes]:
    """The complete, non-blank lines of the first `length` bytes of a live tail, without
    their newlines, read a block at a time (none when there is no tail). A line a crash
    cut short has no newline, and is left out."""
    try:
        fh = tail.open("rb")
    except (FileNotFoundError, NotADirectoryError):
        return
    with fh:
        left, pending = length, b""
        while left > 0 and (block := fh.read(min(left, _TAIL_BLOCK))):
            left -= len(block)
            *lines, pending = (pending + block).split(b"\n")
            yield from (line for line in lines if line.strip())


def iter_events(repo: GitRepo, run_id: str, *, after: str | None = None) -> Iterator[RunEvent]:
    """`read_events`, a segment in memory at a time (`recorded_stream`): the run is
    checked before this returns, and a run that cannot be read refused."""
    blocks, _ = recorded_stream(repo, run_id)
    return _after(_events_of(run_id, blocks), after)


def read_events(repo: GitRepo, run_id: str, *, after: str | None = None) -> list[RunEvent]:
    """Every event the run has recorded so far, oldest first; with `after`, only those
    after the event of that id (a client resuming, as SSE's `Last-Event-ID`)."""
    return list(iter_events(repo, run_id, after=after))


def _events_of(run_id: str, blocks: Iterable[bytes]) -> Iterator[RunEvent]:
    for data in blocks:
        yield from _decoded(run_id, data)


def events_after(events: Sequence[RunEvent], after: str | None) -> list[RunEvent]:
    """The events after the one whose id is `after`; if no event has that id, those
    whose id (a UUID v7, so in time order) sorts after it. All of them when None."""
    return list(_after(events, after))


def _after(events: Iterable[RunEvent], after: str | None) -> Iterator[RunEvent]:
    """`events_after` as the events come: until the event `after` is met, only those
    that sort after it are held, in case it never is."""
    if after is None:
        yield from events
        return
    held = []
    rest = iter(events)
    for event in rest:
        if event.id == after:
            yield from rest
            return
        if event.id > after:
            held.append(event)
    yield from held


class EventCursor:
    """Where one reader is in a run's events. The first `read` gives the backlog (git's
    events, then the tail's beyond them; `backlog` streams it); each later one the
    tail's complete lines that arrived since. `read` never waits; `follow` and
    `follow_async` wait for more."""

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

    def backlog(self) -> Iterator[RunEvent]:
        """The first read, a segment in memory at a time (`recorded_stream`): a run
        whose events cannot be read is refused here, before any event is given. Later
        reads give what the tail gets beyond it. Once the cursor has read, `read`."""
        with self._lock:
            if not self._started:
                return self._backlog()
        return iter(self.read())

    @property
    def started(self) -> bool:
        """Whether the backlog has been taken (`read`, `backlog` or `skip_backlog`)."""
        return self._started

    def _backlog(self) -> Iterator[RunEvent]:
        self._started = True
        blocks, self._offset = recorded_stream(self.repo, self.run_id)
        return _after(_events_of(self.run_id, blocks), self.after)

    def read(self) -> list[RunEvent]:
        with self._lock:
            if not self._started:
                return list(self._backlog())
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
    cursors: Sequence[EventCursor],
    new_runs: Callable[[], list[EventCursor]] | None,
    backlog_batch: int | None,
) -> Iterator[list[RunEvent] | None]:
    """The one follow loop: a batch of new events from some run, or None for "wait a
    moment". Without `new_runs` it ends once every run has ended and stayed quiet
    SETTLE_CHECKS times; with it, it looks for new runs each round and never ends. A
    run's backlog comes `backlog_batch` events at a time (None: whole, for cursors that
    another reader reads too)."""
    following = list(cursors)
    idle = [0] * len(following)
    given = len(following)  # the runs asked for: one that cannot be read is an error
    backlogs: dict[int, Iterator[RunEvent]] = {}  # the backlogs being given
    while new_runs is not None or any(count < SETTLE_CHECKS for count in idle):
        if new_runs is not None:
            fresh = new_runs()
            following += fresh
            idle += [0] * len(fresh)
        got = False
        for index, cursor in enumerate(following):
            if idle[index] >= SETTLE_CHECKS:
                continue  # ended: its last lines are read
            try:
                batch = _next_batch(cursor, backlogs, index, backlog_batch)
            except FabroError:
                backlogs.pop(index, None)
                if index < given:
                    raise
                # A run found along the way (every run's events) that cannot be read
                # (a forged one's refused segment) is passed over, as `events` does.
                idle[index] = SETTLE_CHECKS
                continue
            if batch:
                idle[index] = 0
                got = True
                yield batch
            elif not cursor.is_live():
                idle[index] += 1
        if not got:
            yield None


def _next_batch(
    cursor: EventCursor, backlogs: dict[int, Iterator[RunEvent]], index: int, size: int | None
) -> list[RunEvent]:
    """What `cursor` gives next: the next `size` events of its backlog while it lasts,
    then what its tail got."""
    import itertools

    rest = backlogs.get(index)
    if rest is None:
        if size is None or cursor.started:
            return cursor.read()
        rest = backlogs[index] = cursor.backlog()
    assert size is not None
    batch = list(itertools.islice(rest, size))
    if len(batch) < size:
        del backlogs[index]
    return batch


def follow_all(
    cursors: Sequence[EventCursor],
    *,
    new_runs: Callable[[], list[EventCursor]] | None = None,
    interval: float = FOLLOW_INTERVAL,
) -> Iterator[list[RunEvent]]:
    """Follow several runs at once (and those `new_runs` finds, e.g. `NewRuns(repo)`),
    blocking between reads; ends when all have ended, or never with `new_runs`."""
    for batch in _follow_steps(cursors, new_runs, BACKLOG_BATCH):
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

    steps = _follow_steps(cursors, new_runs, None if holding is not None else BACKLOG_BATCH)
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
