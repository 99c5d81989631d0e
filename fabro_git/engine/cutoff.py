"""Stages a crash cut off, and how resume closes them in the event log.

A kill -9 (or a Ctrl-C) can leave a stage's attempt with a `stage.started` and no
terminal event. Resume runs that stage again under the same `stage_id`; without more,
the log would show one attempt that started once and finished twice. So resume first
closes every open attempt with a `stage.failed` of class `canceled` saying the run was
interrupted, and the rerun counts on from the highest attempt the log already holds.

Stages that completed after the last checkpoint (inside a fan-out's branches or a child
workflow, which checkpoint with their parent stage) keep their `stage_id`s: resume counts
each node's serials on from them, so what runs again gets ids of its own.

Only the events after the last checkpoint can belong to a stage that runs again: the
last durable segment (a Ctrl-C's `finalize` snapshot holds the stage it stopped) and the
live tail's lines that no snapshot holds yet.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import msgspec

from fabro_git.engine.checkpoint import Checkpoint
from fabro_git.engine.emit import Emit
from fabro_git.engine.outcome import CANCELED, event_failure_class
from fabro_git.events.bus import tail_after
from fabro_git.events.catalogue import StageFailed
from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.store import runs as runrefs
from fabro_git.store.repo import GitRepo

INTERRUPTED = "interrupted: the run stopped before this attempt finished"


class OpenAttempt(msgspec.Struct):
    stage_id: str
    node_id: str | None
    node_label: str | None
    index: int
    attempt: int


class CutOff(msgspec.Struct):
    """Open attempts, oldest first, the highest attempt started per `stage_id`, and the
    highest serial per qualified node among the stages that completed after the
    checkpoint (in a branch or a child workflow the checkpoint does not count)."""

    open: list[OpenAttempt] = msgspec.field(default_factory=list)
    attempts: dict[str, int] = msgspec.field(default_factory=dict)
    serials: dict[str, int] = msgspec.field(default_factory=dict)


class _Line(msgspec.Struct):
    event: str
    stage_id: str | None = None
    node_id: str | None = None
    node_label: str | None = None
    properties: JsonObject = {}


_decoder = msgspec.json.Decoder(_Line)


def _whole(value: JsonValue, default: int) -> int:
    """A count an event gives (a number, or its digits), else `default`."""
    return int(value) if isinstance(value, str | int | float) and value else default


def find_cut_off(lines: bytes) -> CutOff:
    """Scan event lines (JSONL, in order) for stage attempts that never ended."""
    open_by_stage: dict[str, OpenAttempt] = {}
    attempts: dict[str, int] = {}
    serials: dict[str, int] = {}
    for raw in lines.splitlines():
        with contextlib.suppress(msgspec.DecodeError):
            line = _decoder.decode(raw)
            if line.stage_id is None or not line.event.startswith("stage."):
                continue
            props = line.properties
            if line.event == "stage.started":
                attempt = _whole(props.get("attempt"), 1)
                attempts[line.stage_id] = max(attempts.get(line.stage_id, 0), attempt)
                open_by_stage[line.stage_id] = OpenAttempt(
                    line.stage_id,
                    line.node_id,
                    line.node_label,
                    _whole(props.get("index"), 0),
                    attempt,
                )
            elif line.event in ("stage.completed", "stage.failed"):
                open_by_stage.pop(line.stage_id, None)
            if line.event == "stage.completed":
                node, _, serial = line.stage_id.rpartition("@")
                if serial.isdigit():
                    serials[node] = max(serials.get(node, 0), int(serial))
    return CutOff(list(open_by_stage.values()), attempts, serials)


def count_serials_on(cut_off: CutOff, serials: dict[str, int]) -> None:
    """Set each node's stage serial where resume goes on from: past the stages that
    completed after the checkpoint, and just before an open attempt's own serial, so
    its rerun carries its stage_id (a Ctrl-C's final checkpoint counted it already)."""
    for node, highest in cut_off.serials.items():
        if highest > serials.get(node, 0):
            serials[node] = highest
    for stage in cut_off.open:
        node, _, serial = stage.stage_id.rpartition("@")
        if serial.isdigit():
            serials[node] = int(serial) - 1


def close_cut_off(cut_off: CutOff, emit: Emit) -> None:
    """Give each open attempt its terminal event, innermost (latest started) first."""
    for stage in reversed(cut_off.open):
        emit(
            StageFailed(
                index=stage.index,
                error=INTERRUPTED,
                failure_class=event_failure_class(CANCELED),
                will_retry=True,
            ),
            node_id=stage.node_id,
            node_label=stage.node_label,
            stage_id=stage.stage_id,
        )


def since_checkpoint(repo: GitRepo | None, meta: str | None, cp: Checkpoint, tail: Path) -> bytes:
    """The last durable event segment, then the live tail's lines no snapshot holds."""
    durable = b""
    if repo is not None and meta is not None and cp.event_segments:
        durable = runrefs.read_segment(repo, meta, cp.event_segments) or b""
        if durable and not durable.endswith(b"\n"):
            durable += b"\n"
    pending = tail_after(tail.read_bytes(), cp.last_event_id) if tail.exists() else b""
    return durable + pending
