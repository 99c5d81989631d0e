"""What a stage produced: the record every handler returns and the engine routes on.

Statuses use the four public names (`succeeded`, `failed`, `partially_succeeded`,
`skipped`); `retry` is internal to the retry loop and never reaches an edge condition.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict, Unpack, cast

import msgspec

from fabro_git.events.catalogue import FailureClass, StageStatus
from fabro_git.jsondata import JsonObject

__all__ = ["StageRecord", "StageStatus", "UsageRecord"]

SUCCEEDED = "succeeded"
FAILED = "failed"
PARTIAL = "partially_succeeded"
SKIPPED = "skipped"
RETRY = "retry"

PUBLIC_STATUSES = (SUCCEEDED, FAILED, PARTIAL, SKIPPED)

_ALIASES = {
    "success": SUCCEEDED,
    "succeeded": SUCCEEDED,
    "ok": SUCCEEDED,
    "fail": FAILED,
    "failed": FAILED,
    "failure": FAILED,
    "partial_success": PARTIAL,
    "partially_succeeded": PARTIAL,
    "partial": PARTIAL,
    "skipped": SKIPPED,
    "skip": SKIPPED,
    "retry": RETRY,
}

# Failure classes.
TRANSIENT = "transient_infra"
DETERMINISTIC = "deterministic"
BUDGET = "budget_exhausted"
COMPILATION_LOOP = "compilation_loop"
CANCELED = "canceled"
STRUCTURAL = "structural"


def normalize_status(value: str) -> str | None:
    return _ALIASES.get(value.strip().lower())


class Usage(msgspec.Struct):
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    speed: str | None = None
    cost: float | None = None


class OutcomeDetails(TypedDict, total=False):
    """What `Outcome.success`, `failure` and `retry` take besides the status: the
    outcome's other fields, by name."""

    preferred_label: str | None
    suggested_next_ids: list[str]
    context_updates: JsonObject
    jump_to_node: str | None
    notes: str | None
    response: str | None
    files_touched: list[str]
    usage: Usage | None
    directive_given: bool | None


class Outcome(msgspec.Struct):
    status: str
    error: str | None = None
    failure_class: str | None = None
    preferred_label: str | None = None
    suggested_next_ids: list[str] = msgspec.field(default_factory=list)
    context_updates: JsonObject = msgspec.field(default_factory=dict)
    jump_to_node: str | None = None
    notes: str | None = None
    response: str | None = None
    files_touched: list[str] = msgspec.field(default_factory=list)
    usage: Usage | None = None
    # For a stage that replies (agent, prompt): whether its reply carried a routing
    # directive. None for stages that do not reply.
    directive_given: bool | None = None

    @property
    def ok(self) -> bool:
        return self.status in (SUCCEEDED, PARTIAL)

    @classmethod
    def success(cls, **kw: Unpack[OutcomeDetails]) -> Outcome:
        return cls(status=SUCCEEDED, **kw)

    @classmethod
    def failure(
        cls, error: str, failure_class: str = DETERMINISTIC, **kw: Unpack[OutcomeDetails]
    ) -> Outcome:
        return cls(status=FAILED, error=error, failure_class=failure_class, **kw)

    @classmethod
    def retry(
        cls, error: str, failure_class: str = TRANSIENT, **kw: Unpack[OutcomeDetails]
    ) -> Outcome:
        return cls(status=RETRY, error=error, failure_class=failure_class, **kw)

    def to_record(
        self,
        *,
        node_id: str,
        visit: int,
        attempt: int,
        started_at: str,
        duration_ms: int,
        failure_signature: str | None,
    ) -> StageRecord:
        """The record of the finished stage, stored in checkpoints and `status.json`."""
        record = StageRecord(status=event_status(self.status))
        if self.error is not None:
            record["error"] = self.error
        if self.failure_class is not None:
            record["failure_class"] = self.failure_class
        if self.preferred_label is not None:
            record["preferred_label"] = self.preferred_label
        if self.jump_to_node is not None:
            record["jump_to_node"] = self.jump_to_node
        if self.notes is not None:
            record["notes"] = self.notes
        record["suggested_next_ids"] = list(self.suggested_next_ids)
        record["context_updates"] = dict(self.context_updates)
        record["files_touched"] = list(self.files_touched)
        if self.usage is not None:
            record["usage"] = cast(
                "UsageRecord",
                {k: v for k, v in msgspec.structs.asdict(self.usage).items() if v is not None},
            )
        record["node_id"] = node_id
        record["visit"] = visit
        record["attempt"] = attempt
        record["started_at"] = started_at
        record["duration_ms"] = duration_ms
        if failure_signature:
            record["failure_signature"] = failure_signature
        return record


class UsageRecord(TypedDict, total=False):
    """A stage's model usage as its record keeps it: the counts it has (no nulls)."""

    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    speed: str
    cost: float


class StageRecord(TypedDict):
    """A finished stage as the checkpoint's `node_outcomes` and its `status.json` keep
    it. A dict, typed: its JSON is the stored format, keys in this order, and a key
    whose value would be null is left out (runs written before stay readable as they
    are). The engine replaces a record, never changes one in place (the checkpoint
    delta relies on it)."""

    # One of the `StageStatus` words when this engine writes it; read as any string,
    # so that a record an older version wrote still loads.
    status: str
    error: NotRequired[str]
    failure_class: NotRequired[str]
    preferred_label: NotRequired[str]
    jump_to_node: NotRequired[str]
    notes: NotRequired[str]
    suggested_next_ids: NotRequired[list[str]]
    context_updates: NotRequired[JsonObject]
    files_touched: NotRequired[list[str]]
    usage: NotRequired[UsageRecord]
    node_id: NotRequired[str]
    visit: NotRequired[int]
    attempt: NotRequired[int]
    started_at: NotRequired[str]
    duration_ms: NotRequired[int]
    failure_signature: NotRequired[str]


def event_status(status: str) -> StageStatus:
    """An outcome's status as the events type it (the statuses are the same four words)."""
    return cast(StageStatus, status)


def event_failure_class(failure_class: str) -> FailureClass:
    """A failure class as the events type it."""
    return cast(FailureClass, failure_class)
