"""The checkpoint: everything `resume` needs, stored as `checkpoint.json` on the meta ref.

It is rewritten at every snapshot (it is small); history lives in the event segments and
the per-node directories, which are only ever added.
"""

from __future__ import annotations

from typing import Any

import msgspec

FORMAT_VERSION = 1


class PendingCommit(msgspec.Struct, kw_only=True):
    """A run-branch commit the cycle had decided on but may not have made before a crash."""

    tree: str
    parent: str
    node_id: str
    status: str
    completed: int
    extra_parents: list[str] = msgspec.field(default_factory=list)


class TokenTotals(msgspec.Struct, kw_only=True):
    """The tokens a run's model calls used, summed over every stage (every scope)."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, usage: Any) -> None:
        """Add a stage's usage (`engine.outcome.Usage`: counts that may be None)."""
        self.input_tokens += usage.input_tokens or 0
        self.output_tokens += usage.output_tokens or 0
        self.reasoning_tokens += usage.reasoning_tokens or 0
        self.cache_read_tokens += usage.cache_read_tokens or 0
        self.cache_write_tokens += usage.cache_write_tokens or 0


class Checkpoint(msgspec.Struct, kw_only=True):
    format_version: int = FORMAT_VERSION
    status: str = "running"
    timestamp: str = ""
    current_node: str | None = None
    next_node_id: str | None = None
    completed_nodes: list[str] = msgspec.field(default_factory=list)
    node_visits: dict[str, int] = msgspec.field(default_factory=dict)
    node_retries: dict[str, int] = msgspec.field(default_factory=dict)
    node_outcomes: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    context_values: dict[str, Any] = msgspec.field(default_factory=dict)
    git_commit_sha: str | None = None
    pending_commit: PendingCommit | None = None
    loop_failure_signatures: dict[str, int] = msgspec.field(default_factory=dict)
    restart_failure_signatures: dict[str, int] = msgspec.field(default_factory=dict)
    stage_index: int = 0
    event_segments: int = 0
    last_event_id: str | None = None
    error: str | None = None
    started_at: str = ""
    finished_at: str | None = None
    active_ms: int = 0
    artifact_count: int = 0
    # What the run's model calls cost so far, by the catalogue's prices (every scope).
    total_cost: float = 0.0
    tokens: TokenTotals = msgspec.field(default_factory=TokenTotals)


class Manifest(msgspec.Struct, kw_only=True):
    format_version: int = FORMAT_VERSION
    run_id: str
    workflow_name: str
    workflow_slug: str
    workflow_path: str | None
    goal: str
    inputs: dict[str, str]
    labels: dict[str, str]
    base_sha: str
    base_branch: str | None
    run_branch: str | None
    meta_ref: str
    created_at: str
    source_directory: str
    origin_url: str | None
    in_place: bool
    settings: dict[str, Any]
    tool_version: str
    # The workflow file's path inside its root: `graphs/` keeps the files it names by
    # the same relative paths (None for runs recorded before `graphs/` existed).
    workflow_file: str | None = None
    # Set on a run made by `fork` or `rewind`: {run_id, node, visit, checkpoint} of the
    # checkpoint it started from.
    forked_from: dict[str, Any] | None = None
    # Set on a run that `rewind` replaced: the id of the run that carries on from it.
    superseded_by: str | None = None


_encoder = msgspec.json.Encoder(order="deterministic")


def encode(obj: Any) -> bytes:
    return msgspec.json.format(_encoder.encode(obj), indent=2) + b"\n"


def decode_checkpoint(data: bytes) -> Checkpoint:
    return msgspec.json.decode(data, type=Checkpoint)


def decode_manifest(data: bytes) -> Manifest:
    return msgspec.json.decode(data, type=Manifest)
