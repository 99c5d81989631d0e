"""What a stage produced: the record every handler returns and the engine routes on.

Statuses use the four public names (`succeeded`, `failed`, `partially_succeeded`,
`skipped`); `retry` is internal to the retry loop and never reaches an edge condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import msgspec

if TYPE_CHECKING:
    from fabro_git.events.catalogue import FailureClass, StageStatus

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


class Outcome(msgspec.Struct):
    status: str
    error: str | None = None
    failure_class: str | None = None
    preferred_label: str | None = None
    suggested_next_ids: list[str] = msgspec.field(default_factory=list)
    context_updates: dict[str, Any] = msgspec.field(default_factory=dict)
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
    def success(cls, **kw: Any) -> Outcome:
        return cls(status=SUCCEEDED, **kw)

    @classmethod
    def failure(cls, error: str, failure_class: str = DETERMINISTIC, **kw: Any) -> Outcome:
        return cls(status=FAILED, error=error, failure_class=failure_class, **kw)

    @classmethod
    def retry(cls, error: str, failure_class: str = TRANSIENT, **kw: Any) -> Outcome:
        return cls(status=RETRY, error=error, failure_class=failure_class, **kw)

    def to_record(self) -> dict[str, Any]:
        """The JSON form stored in checkpoints and `status.json`."""
        record: dict[str, Any] = {"status": self.status}
        for key in ("error", "failure_class", "preferred_label", "jump_to_node", "notes"):
            value = getattr(self, key)
            if value is not None:
                record[key] = value
        record["suggested_next_ids"] = list(self.suggested_next_ids)
        record["context_updates"] = dict(self.context_updates)
        record["files_touched"] = list(self.files_touched)
        if self.usage is not None:
            record["usage"] = {
                k: v for k, v in msgspec.structs.asdict(self.usage).items() if v is not None
            }
        return record


def event_status(status: str) -> StageStatus:
    """An outcome's status as the events type it (the statuses are the same four words)."""
    return cast("StageStatus", status)


def event_failure_class(failure_class: str) -> FailureClass:
    """A failure class as the events type it."""
    return cast("FailureClass", failure_class)
