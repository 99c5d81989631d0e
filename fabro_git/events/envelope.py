"""The event envelope, event ids and timestamps, and the JSON line encoding.

Every event we write, to the live tail, to the terminal or into the metadata ref, is one
`Envelope` encoded as one JSON line. The envelope's fields and their order are the
seed's, plus two the seed names only in prose: `stage_id` (stage-scoped events such as
checkpoint metadata snapshots and agent activity carry `"<node_id>@<visit>"`) and
`actor` (who asked for a control operation such as `run.interrupt`). Optional fields are
omitted when unset, never written as `null`.

Ids are UUID v7, written here because Python 3.11's `uuid` module has no `uuid7()`. They
are monotonic within a process (RFC 9562 §6.2, method 1: a 12-bit counter in `rand_a`
seeded randomly each millisecond), so sorting ids sorts events, even several in one
millisecond. `ts` is taken from the same millisecond clock reading as the id.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from datetime import UTC, datetime
from typing import ClassVar

import msgspec

from fabro_git.jsondata import JsonObject


class EventProps(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Base of every event's properties Struct. `NAME` is the seed's event name.

    An event with `STREAMED` set is one piece of a stream (its `delta`): the bus masks
    the stream as a whole, and the stream's pieces carry at most `STREAM_LIMIT`
    characters between them (None: no limit)."""

    NAME: ClassVar[str] = ""
    STREAMED: ClassVar[bool] = False
    STREAM_LIMIT: ClassVar[int | None] = None


class Actor(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Who requested a control operation (`run.interrupt`, `run.steer`)."""

    kind: str
    login: str | None = None
    auth_method: str | None = None
    identity: JsonObject | None = None


class Envelope(msgspec.Struct, omit_defaults=True, kw_only=True):
    id: str
    ts: str
    run_id: str
    event: str
    session_id: str | None = None
    parent_session_id: str | None = None
    node_id: str | None = None
    node_label: str | None = None
    stage_id: str | None = None
    actor: Actor | None = None
    properties: EventProps


_uuid_lock = threading.Lock()
_last_ms = -1
_counter = 0


def _next_id_parts() -> tuple[int, int]:
    """(unix_ms, 12-bit counter), strictly increasing across calls in this process."""
    global _last_ms, _counter
    with _uuid_lock:
        now = time.time_ns() // 1_000_000
        if now > _last_ms:
            _last_ms = now
            # Start low in the counter space so a burst has room before overflowing.
            _counter = int.from_bytes(os.urandom(2)) & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:
                # Counter exhausted (or the clock stepped back): borrow the next ms.
                _last_ms += 1
                _counter = int.from_bytes(os.urandom(2)) & 0x7FF
        return _last_ms, _counter


def _format_uuid7(unix_ms: int, counter: int) -> str:
    rand_b = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    value = (
        (unix_ms & ((1 << 48) - 1)) << 80
        | 0x7 << 76
        | (counter & 0xFFF) << 64
        | 0b10 << 62
        | rand_b
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid7() -> str:
    """A new UUID v7 string, time-ordered and monotonic within this process."""
    return _format_uuid7(*_next_id_parts())


def format_ts(unix_ms: int) -> str:
    """RFC 3339 UTC with milliseconds: `2026-04-01T12:00:00.123Z`."""
    return f"{_second(unix_ms // 1000)}.{unix_ms % 1000:03d}Z"


@functools.lru_cache(maxsize=4)
def _second(unix_s: int) -> str:
    """The timestamp's whole second, formatted once: a walk stamps many events a
    second, and formatting a date costs ten times the rest of the stamp."""
    return f"{datetime.fromtimestamp(unix_s, UTC):%Y-%m-%dT%H:%M:%S}"


def new_id_and_ts() -> tuple[str, str]:
    """A fresh event id and the timestamp of the same clock reading."""
    ms, counter = _next_id_parts()
    return _format_uuid7(ms, counter), format_ts(ms)


def now_ts() -> str:
    return format_ts(time.time_ns() // 1_000_000)


def make_envelope(
    run_id: str,
    props: EventProps,
    *,
    node_id: str | None = None,
    node_label: str | None = None,
    stage_id: str | None = None,
    session_id: str | None = None,
    parent_session_id: str | None = None,
    actor: Actor | None = None,
) -> Envelope:
    """Wrap `props` in a fresh envelope. `node_label` defaults to `node_id` (seed)."""
    if not props.NAME:
        raise TypeError(f"{type(props).__name__} is not a catalogued event (no NAME)")
    event_id, ts = new_id_and_ts()
    return Envelope(
        id=event_id,
        ts=ts,
        run_id=run_id,
        event=props.NAME,
        session_id=session_id,
        parent_session_id=parent_session_id,
        node_id=node_id,
        node_label=node_label if node_label is not None else node_id,
        stage_id=stage_id,
        actor=actor,
        properties=props,
    )


def stage_id_for(node_id: str, visit: int) -> str:
    """The seed's stage scope id: `"<node_id>@<visit>"`."""
    return f"{node_id}@{visit}"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(JsonObject)


def encode_event(env: Envelope) -> bytes:
    """One compact JSON object, without a trailing newline (sinks add the `\\n`)."""
    return _encoder.encode(env)


def decode_event(line: bytes | str) -> JsonObject:
    """Parse one JSON line (a trailing newline is fine) into a plain dict.

    Raises `msgspec.DecodeError` for a line that is not a JSON object.
    """
    data = line.encode() if isinstance(line, str) else line
    return _decoder.decode(data.strip())


def iter_complete_lines(data: bytes) -> list[bytes]:
    """The complete, non-blank lines of a JSONL buffer, without newlines.

    A writer killed mid-line leaves a fragment with no trailing newline; it is dropped,
    because it is not an event.
    """
    complete, _, _fragment = data.rpartition(b"\n")
    return [line for line in complete.split(b"\n") if line.strip()]
