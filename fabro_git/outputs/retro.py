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

import msgspec

from fabro_git.jsondata import JsonObject, JsonValue

FORMAT_VERSION = 1

# Stages that only mark where a walk begins and ends: nothing to look back on.
_NOT_STAGES = frozenset({"start", "exit"})


class _Facts(msgspec.Struct):
    """The properties of a `stage.*` event that the retro reads, typed as the event
    catalogue writes them (`events.catalogue`); the rest are not decoded."""

    handler_type: str | None = None
    attempt: int | None = None
    will_retry: bool | None = None
    status: str | None = None
    duration_ms: int | None = None
    usage: JsonObject | None = None
    files_touched: list[str] | None = None
    error: str | None = None
    failure_class: str | None = None


class _Line(msgspec.Struct):
    event: str
    node_id: str | None = None
    node_label: str | None = None
    stage_id: str | None = None
    properties: _Facts = msgspec.field(default_factory=_Facts)


_decoder = msgspec.json.Decoder(_Line)
_encoder = msgspec.json.Encoder(order="deterministic")


class _AttemptFailure(msgspec.Struct):
    """Why an attempt that did not end its stage failed (retried, or cut off by a kill)."""

    attempt: int
    error: str | None
    failure_class: str | None


class _Stage(msgspec.Struct):
    stage_id: str
    node_id: str
    label: str | None
    handler_type: str
    attempts: int = 0
    status: str = "interrupted"
    duration_ms: int = 0
    usage: JsonObject | None = None
    files_touched: list[str] = msgspec.field(default_factory=list)
    failure_reason: str | None = None
    failure_class: str | None = None
    attempt_failures: list[_AttemptFailure] = msgspec.field(default_factory=list)

    @property
    def retries(self) -> int:
        return max(self.attempts - 1, 0)

    @property
    def cost(self) -> float | None:
        return _number(self.usage, "cost")

    def record(self) -> JsonObject:
        return {
            "stage_id": self.stage_id,
            "node_id": self.node_id,
            "label": self.label,
            "handler_type": self.handler_type,
            "visit": _visit(self.stage_id),
            "status": self.status,
            "duration_ms": self.duration_ms,
            "attempts": self.attempts,
            "retries": self.retries,
            "usage": self.usage,
            "cost": self.cost,
            "files_touched": list(self.files_touched),
            "failure_reason": self.failure_reason,
            "failure_class": self.failure_class,
            "attempt_failures": [
                {"attempt": f.attempt, "error": f.error, "failure_class": f.failure_class}
                for f in self.attempt_failures
            ],
        }


def _number(usage: JsonObject | None, key: str) -> float | None:
    """A number in a stage's usage (tokens, cost), None when it has none."""
    value = usage.get(key) if usage else None
    return value if isinstance(value, int | float) else None


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
) -> JsonObject:
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
                    handler_type=p.handler_type or "",
                )
            stage.attempts = max(stage.attempts, p.attempt or 1)
            stage.status = "interrupted"
        elif stage is None:
            continue
        elif line.event == "stage.failed" and (p.will_retry or p.failure_class == "canceled"):
            stage.attempt_failures.append(_AttemptFailure(stage.attempts, p.error, p.failure_class))
        elif line.event == "stage.completed":
            stage.status = p.status or "succeeded"
            stage.attempts = max(stage.attempts, p.attempt or 1)
            stage.duration_ms = p.duration_ms or 0
            stage.usage = p.usage or None
            stage.files_touched = sorted(set(p.files_touched or []))
            if stage.status == "failed":
                stage.failure_reason = p.error
                stage.failure_class = p.failure_class
    kept = [s for s in stages.values() if s.handler_type not in _NOT_STAGES]
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
        "stages": [s.record() for s in kept],
        "aggregate": _aggregate(kept),
    }


def _aggregate(stages: list[_Stage]) -> JsonObject:
    by_status: dict[str, int] = {}
    files: set[str] = set()
    tokens_in = tokens_out = 0
    cost = 0.0
    priced = False
    for stage in stages:
        by_status[stage.status] = by_status.get(stage.status, 0) + 1
        files.update(stage.files_touched)
        tokens_in += int(_number(stage.usage, "input_tokens") or 0)
        tokens_out += int(_number(stage.usage, "output_tokens") or 0)
        if stage.cost is not None:
            priced = True
            cost += stage.cost
    failures: list[JsonValue] = [
        {
            "stage_id": s.stage_id,
            "error": s.failure_reason,
            "failure_class": s.failure_class,
        }
        for s in stages
        if s.status == "failed"
    ]
    return {
        "stages": len(stages),
        "stages_completed": sum(n for s, n in by_status.items() if s != "interrupted"),
        "stages_failed": by_status.get("failed", 0),
        "by_status": dict(sorted(by_status.items())),
        "total_duration_ms": sum(s.duration_ms for s in stages),
        "total_retries": sum(s.retries for s in stages),
        "total_cost": round(cost, 6) if priced else None,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "files_touched": list(sorted(files)),
        "failures": failures,
    }


def encode(retro: Mapping[str, object]) -> bytes:
    return msgspec.json.format(_encoder.encode(retro), indent=2) + b"\n"


def decode(data: bytes) -> JsonObject:
    value = msgspec.json.decode(data)
    if not isinstance(value, dict):
        raise ValueError("retro.json is not a JSON object")
    return value
