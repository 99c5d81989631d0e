"""The retro: what a run did, stage by stage, derived from its durable events.

Every run end (succeeded, partially succeeded, failed, interrupted) writes `retro.json`
into the metadata tree, beside the checkpoint, so a clone reads it with `git fabro
inspect RUN --retro`. A resume rewrites it at its own end. It is derived only from the
run's event stream and checkpoint, never from the clock or the machine: the same
events give the same bytes. The events are the source, not the per-node `status.json`
files, because they hold every attempt (the failures a retry hid, a stage a kill cut
off) and every visit, even across a loop restart that reuses a node's directory.

The narrative layer (a model's reading of the run) is added only on request, by
`engine.retros`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

FORMAT_VERSION = 1

# Stages that only mark where a walk begins and ends: nothing to look back on.
_NOT_STAGES = frozenset({"start", "exit"})


class _Line(msgspec.Struct):
    event: str
    node_id: str | None = None
    node_label: str | None = None
    stage_id: str | None = None
    properties: dict[str, Any] = {}


_decoder = msgspec.json.Decoder(_Line)
_encoder = msgspec.json.Encoder(order="deterministic")


class _Stage(msgspec.Struct):
    stage_id: str
    node_id: str
    label: str | None
    handler_type: str
    attempts: int = 0
    status: str = "interrupted"
    duration_ms: int = 0
    usage: dict[str, Any] | None = None
    files_touched: list[str] = msgspec.field(default_factory=list)
    failure_reason: str | None = None
    failure_class: str | None = None
    # Why each attempt that did not end the stage failed (retried, or cut off by a kill).
    attempt_failures: list[dict[str, Any]] = msgspec.field(default_factory=list)

    def record(self) -> dict[str, Any]:
        cost = (self.usage or {}).get("cost")
        return {
            "stage_id": self.stage_id,
            "node_id": self.node_id,
            "label": self.label,
            "handler_type": self.handler_type,
            "visit": _visit(self.stage_id),
            "status": self.status,
            "duration_ms": self.duration_ms,
            "attempts": self.attempts,
            "retries": max(self.attempts - 1, 0),
            "usage": self.usage,
            "cost": cost,
            "files_touched": self.files_touched,
            "failure_reason": self.failure_reason,
            "failure_class": self.failure_class,
            "attempt_failures": self.attempt_failures,
        }


def _visit(stage_id: str) -> int:
    _, _, visit = stage_id.rpartition("@")
    return int(visit) if visit.isdigit() else 1


def stage_events(lines: bytes) -> Iterable[_Line]:
    """The `stage.*` events among a run's event lines (the rest are not decoded)."""
    for raw in lines.splitlines():
        if b'"event":"stage.' not in raw:
            continue
        try:
            line = _decoder.decode(raw)
        except msgspec.DecodeError:
            continue  # a fragment a crash cut short
        if line.event.startswith("stage.") and line.stage_id:
            yield line


def derive(
    events: bytes,
    *,
    run_id: str,
    workflow: str,
    goal: str,
    status: str,
    error: str | None,
    started_at: str,
    finished_at: str | None,
    duration_ms: int,
) -> dict[str, Any]:
    """The retro of a run from its event lines (segments and the live tail, in order)."""
    stages: dict[str, _Stage] = {}
    for line in stage_events(events):
        p = line.properties
        assert line.stage_id is not None
        stage = stages.get(line.stage_id)
        if line.event == "stage.started":
            if stage is None:
                stage = stages[line.stage_id] = _Stage(
                    stage_id=line.stage_id,
                    node_id=line.node_id or line.stage_id.rpartition("@")[0],
                    label=line.node_label,
                    handler_type=str(p.get("handler_type") or ""),
                )
            stage.attempts = max(stage.attempts, int(p.get("attempt") or 1))
            stage.status = "interrupted"
        elif stage is None:
            continue
        elif line.event == "stage.failed" and (
            p.get("will_retry") or p.get("failure_class") == "canceled"
        ):
            stage.attempt_failures.append(
                {
                    "attempt": stage.attempts,
                    "error": p.get("error"),
                    "failure_class": p.get("failure_class"),
                }
            )
        elif line.event == "stage.completed":
            stage.status = str(p.get("status") or "succeeded")
            stage.attempts = max(stage.attempts, int(p.get("attempt") or 1))
            stage.duration_ms = int(p.get("duration_ms") or 0)
            stage.usage = p.get("usage") or None
            stage.files_touched = sorted(set(p.get("files_touched") or []))
            if stage.status == "failed":
                stage.failure_reason = p.get("error")
                stage.failure_class = p.get("failure_class")
    records = [s.record() for s in stages.values() if s.handler_type not in _NOT_STAGES]
    return {
        "format_version": FORMAT_VERSION,
        "run_id": run_id,
        "workflow": workflow,
        "goal": goal,
        "status": status,
        "error": error,
        "started_at": started_at,
        "finished_at": finished_at,
        "duration_ms": duration_ms,
        "stages": records,
        "aggregate": _aggregate(records),
    }


def _aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_status: dict[str, int] = {}
    files: set[str] = set()
    tokens_in = tokens_out = 0
    cost = 0.0
    priced = False
    for record in records:
        by_status[record["status"]] = by_status.get(record["status"], 0) + 1
        files.update(record["files_touched"])
        usage = record["usage"] or {}
        tokens_in += int(usage.get("input_tokens") or 0)
        tokens_out += int(usage.get("output_tokens") or 0)
        if record["cost"] is not None:
            priced = True
            cost += float(record["cost"])
    failures = [
        {
            "stage_id": r["stage_id"],
            "error": r["failure_reason"],
            "failure_class": r["failure_class"],
        }
        for r in records
        if r["status"] == "failed"
    ]
    return {
        "stages": len(records),
        "stages_completed": sum(n for s, n in by_status.items() if s != "interrupted"),
        "stages_failed": by_status.get("failed", 0),
        "by_status": dict(sorted(by_status.items())),
        "total_duration_ms": sum(r["duration_ms"] for r in records),
        "total_retries": sum(r["retries"] for r in records),
        "total_cost": round(cost, 6) if priced else None,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "files_touched": sorted(files),
        "failures": failures,
    }


def encode(retro: Mapping[str, object]) -> bytes:
    return msgspec.json.format(_encoder.encode(retro), indent=2) + b"\n"


def decode(data: bytes) -> dict[str, Any]:
    value = msgspec.json.decode(data)
    if not isinstance(value, dict):
        raise ValueError("retro.json is not a JSON object")
    return value
