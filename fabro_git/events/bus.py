"""One emitter per run, fanning every event out to its sinks and to the next snapshot.

Every event goes three places: the live tail file (so `logs -f` can follow a running
run), the terminal renderer, and — at the next metadata snapshot — the append-only
segment `events/<NNN>/<NNNNNN>.jsonl` on the meta ref (`store.runs.segment_path`). The bus encodes each event once and
hands the same bytes to all of them, so the tail and the durable log agree byte for byte.

`emit` is synchronous and does no awaiting: trio tasks (parallel branches included)
share one thread and each `emit` runs to completion, so lines never interleave and no
lock is needed. The tail sink writes each line with a single `O_APPEND` write.

Secrets: every event is checked against the run's redactor (`fabro_git.redact`) as it
is emitted, and one that holds a secret is rebuilt with it masked before any sink or the
segment sees it; so the tail, the terminal and the meta ref show the same masked text.
A piece of a stream (an event with `STREAMED` set: a reply's text or reasoning, a tool's
output) is masked by its stream's own masker instead, never alone, since a secret may be
cut across two pieces: a piece carries what the masker lets go (none is emitted while it
lets go nothing), and the stream's rest goes out as one more piece before the next other
event of its stage or session (`agent.message`, `agent.tool.completed`, `stage.failed`,
...), or at `close`. A stream is one kind of piece from one stage and agent session.

Crash consistency: events emitted since the last snapshot live only in the tail. On
resume, `tail_after()` picks those lines out of the old tail and `restore_pending()`
queues them again, so the next snapshot's segment still holds them; nothing is lost and
nothing already snapshotted is written twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import msgspec

from fabro_git import redact
from fabro_git.config.locations import make_private_dir, open_private
from fabro_git.events.envelope import (
    Actor,
    Envelope,
    EventProps,
    encode_event,
    iter_complete_lines,
    make_envelope,
)


class Sink(Protocol):
    def handle(self, env: Envelope, line: bytes) -> None:
        """Take one event; `line` is its encoded JSON, without a newline."""

    def close(self) -> None: ...


class EventBus:
    def __init__(
        self, run_id: str, sinks: Sequence[Sink] = (), *, redactor: redact.Redactor | None = None
    ) -> None:
        self.run_id = run_id
        self.redactor = redactor or redact.for_process()
        self._sinks: list[Sink] = list(sinks)
        self._pending: list[bytes] = []
        self._streams: dict[tuple[str | None, str | None, str], _Stream] = {}
        self.last_event_id: str | None = None

    def emit(
        self,
        props: EventProps,
        *,
        node_id: str | None = None,
        node_label: str | None = None,
        stage_id: str | None = None,
        session_id: str | None = None,
        parent_session_id: str | None = None,
        actor: Actor | None = None,
    ) -> Envelope | None:
        """Stamp `props` with an id and time, queue it for the next segment, fan it out.

        The event is queued before any sink runs, so a failing sink (a closed terminal)
        cannot lose it from the durable log; the sink's exception still propagates.
        A stream's piece is held back while its masker lets go nothing: None then.
        """
        stamp = _Stamp(node_id, node_label, stage_id, session_id, parent_session_id, actor)
        if props.STREAMED:
            return self._emit_piece(props, stamp)
        if self._streams:
            self._end_streams(stage_id, session_id)
        env = make_envelope(self.run_id, props, **stamp._asdict())
        line = encode_event(env)
        if self.redactor.found_in(line):
            env, line = _redacted(env, self.redactor)
        return self._send(env, line)

    def _emit_piece(self, props: EventProps, stamp: _Stamp) -> Envelope | None:
        key = (stamp.stage_id, stamp.session_id, props.NAME)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(type(props), self.redactor.stream(), stamp)
        stream.stamp = stamp
        if stream.left is not None and stream.left <= 0:
            return None  # past its limit: nothing more of it is shown or kept
        piece = stream.take(stream.masker.feed(props.delta))  # type: ignore[attr-defined]
        if not piece:
            return None
        return self._emit_masked(msgspec.structs.replace(props, delta=piece), stamp)

    def _emit_masked(self, props: EventProps, stamp: _Stamp) -> Envelope:
        """Emit a piece its stream's masker let go: masking it again, alone, could mask
        a word the whole stream's masking leaves as it is. Its label is masked here."""
        label = stamp.node_label
        if label:
            stamp = stamp._replace(node_label=self.redactor.mask_text(label))
        env = make_envelope(self.run_id, props, **stamp._asdict())
        return self._send(env, encode_event(env))

    def _end_streams(self, stage_id: str | None, session_id: str | None) -> None:
        """Let go the rest of the streams an event of this stage and session ends: its
        own, and every stream of its stage (a stage event) or of its session (an agent
        session's event). A run's own events end none."""
        for key in list(self._streams):
            stage, session = key[0], key[1]
            if (stage, session) == (stage_id, session_id) or (
                (stage_id is not None and stage == stage_id and session_id is None)
                or (session_id is not None and session == session_id and stage_id is None)
            ):
                self._end_stream(key)

    def _end_stream(self, key: tuple[str | None, str | None, str]) -> None:
        stream = self._streams.pop(key)
        piece = stream.take(stream.masker.flush())
        if piece:
            self._emit_masked(stream.kind(delta=piece), stream.stamp)

    def end_streams(self) -> None:
        """Let go the rest of every open stream (the run is over)."""
        for key in list(self._streams):
            self._end_stream(key)

    def _send(self, env: Envelope, line: bytes) -> Envelope:
        self._pending.append(line)
        self.last_event_id = env.id
        for sink in list(self._sinks):
            sink.handle(env, line)
        return env

    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        """Detach `sink` (it is not closed; its owner decides)."""
        self._sinks.remove(sink)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def take_segment(self) -> bytes:
        """Every line emitted (or restored) since the last call, `\\n`-terminated.

        Returns `b""` when nothing happened, so callers can skip writing a segment.
        """
        if not self._pending:
            return b""
        data = b"".join(line + b"\n" for line in self._pending)
        self._pending.clear()
        return data

    def restore_pending(self, data: bytes) -> int:
        """Re-queue tail lines that no snapshot holds yet, ahead of anything new.

        Fragments (a line cut short by a crash) and blank lines are dropped. Returns the
        number of events restored.
        """
        data = self.redactor.mask_bytes(data)
        restored = [line for line in iter_complete_lines(data) if _id_of(line)]
        self._pending[:0] = restored
        return len(restored)

    def close(self) -> None:
        """Let go the rest of every stream, then close every sink. Pending lines stay
        queued for a final `take_segment`."""
        self.end_streams()
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()


class _Stamp(NamedTuple):
    """An event's envelope fields other than its id and time."""

    node_id: str | None
    node_label: str | None
    stage_id: str | None
    session_id: str | None
    parent_session_id: str | None
    actor: Actor | None


class _Stream:
    """One open stream: its kind of piece, its masker, what is left of its limit, and
    the envelope fields of its last piece (its rest goes out with them)."""

    def __init__(
        self, kind: type[EventProps], masker: redact.StreamMasker[str], stamp: _Stamp
    ) -> None:
        self.kind = kind
        self.masker = masker
        self.left = kind.STREAM_LIMIT
        self.stamp = stamp

    def take(self, piece: str) -> str:
        """`piece`, cut where the stream's limit runs out. The cut falls in masked
        text, so it leaves no part of a secret."""
        if self.left is None:
            return piece
        piece = piece[: max(self.left, 0)]
        self.left -= len(piece)
        return piece


def _redacted(env: Envelope, redactor: redact.Redactor) -> tuple[Envelope, bytes]:
    """`env` with its secrets masked, and its line.

    The properties are masked field by field, so the renderer gets a well-formed event;
    the line is then masked as bytes too, for a secret in some other field.
    """
    props = env.properties
    try:
        masked = msgspec.convert(redactor.mask_value(msgspec.to_builtins(props)), type(props))
    except msgspec.ValidationError:  # a masked value no longer fits its field's type
        return env, redactor.mask_bytes(encode_event(env))
    label = redactor.mask_text(env.node_label) if env.node_label else env.node_label
    env = msgspec.structs.replace(env, properties=masked, node_label=label)
    return env, redactor.mask_bytes(encode_event(env))


def tail_after(data: bytes, last_event_id: str | None) -> bytes:
    """The complete event lines of a live tail that come after `last_event_id`.

    `last_event_id` is the id of the last event the latest snapshot holds (None: no
    snapshot has any, so everything counts). If that id is not in the tail (the scratch
    dir was recreated), lines whose UUID v7 id sorts after it are taken instead.
    """
    lines = lines_after(lambda: iter_complete_lines(data), last_event_id)
    return b"".join(line + b"\n" for line in lines)


def lines_after(lines: Callable[[], Iterable[bytes]], last_event_id: str | None) -> Iterator[bytes]:
    """`tail_after` for lines read afresh each time `lines()` is called (a tail file's, a
    block at a time): the event lines after `last_event_id`, without their newlines.
    With an id, the lines are read twice: once to find it, once for what follows."""

    def events() -> Iterator[tuple[bytes, str]]:
        return ((line, found) for line in lines() if (found := _id_of(line)))

    if last_event_id is not None and not any(found == last_event_id for _, found in events()):
        yield from (line for line, found in events() if found > last_event_id)
        return
    seen = last_event_id is None
    for line, found in events():
        if seen:
            yield line
        seen = seen or found == last_event_id


class _IdOnly(msgspec.Struct):
    id: str


_id_decoder = msgspec.json.Decoder(_IdOnly)


def last_event_id(data: bytes) -> str | None:
    """The id of the last complete event line in `data` (a segment or a tail), looked
    for from its end a line at a time, with no copy of the rest."""
    end = len(data)
    while end >= 0:
        start = data.rfind(b"\n", 0, end) + 1
        found = _id_of(data[start:end])
        if found:
            return found
        end = start - 1
    return None


def _id_of(line: bytes) -> str | None:
    """The event id of a JSONL line, or None for a fragment or a non-event line."""
    try:
        return _id_decoder.decode(line).id
    except msgspec.DecodeError:  # ValidationError is a subclass
        return None


class TailFileSink:
    """Appends each event as one line to the run's live tail (`events.jsonl`).

    One unbuffered `O_APPEND` write per event, so a reader never sees half a line unless
    the writer died mid-write; reopening after such a crash first ends the fragment
    with a newline, so the next event starts on a line of its own.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        make_private_dir(self.path.parent)
        self._fd: int | None = open_private(self.path, os.O_RDWR | os.O_APPEND)
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            self._write(b"\n")

    def handle(self, env: Envelope, line: bytes) -> None:
        self._write(line + b"\n")

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"event tail {self.path} is closed")
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view)
            except OSError as exc:
                # `os.write` names no file; the message should (a full disk, above all).
                raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            view = view[written:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class MemorySink:
    """Keeps every envelope and line in memory, for tests and for the engine's own use."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self.lines: list[bytes] = []
        self.closed = False

    def handle(self, env: Envelope, line: bytes) -> None:
        self.envelopes.append(env)
        self.lines.append(line)

    def close(self) -> None:
        self.closed = True

    @property
    def names(self) -> list[str]:
        return [env.event for env in self.envelopes]

    def of(self, event: str | type[EventProps]) -> list[Envelope]:
        """The envelopes of one event, given by name or by its Struct class."""
        name = event if isinstance(event, str) else event.NAME
        return [env for env in self.envelopes if env.event == name]
