"""A run's stages as its events tell them, for a page that follows the run live.

The run reader reads the stages a run has recorded; a page also needs the one in flight,
and its status the moment it changes. Every stage execution has a `stage_id`
(`<node>@<serial>`); its events say when it ran, how it ended, what it was asked and
answered, what its command printed and which files it touched (the checkpoint after it
carries the diff). The stage view adds the reader's files once the stage is recorded.

The events are taken as they come, once: a run's may be far bigger than memory holds
whole. What a stage was asked, answered, printed and changed is kept for the one stage
a page shows, never for all of a run's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from fabro_git.jsondata import JsonObject, JsonValue

# How a stage ends, by event.
_ENDS = {"stage.completed", "stage.failed"}


def _props(event: JsonObject) -> JsonObject:
    props = event.get("properties")
    return props if isinstance(props, dict) else {}


def _number(value: JsonValue) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


class _Stage:
    def __init__(self, stage_id: str, event: JsonObject, *, detailed: bool = False) -> None:
        props = _props(event)
        self.stage_id = stage_id
        self.detailed = detailed  # keeps its prompt, reply, command output and diff
        self.node_id = str(event.get("node_id") or "")
        self.label = str(event.get("node_label") or self.node_id)
        self.handler_type = str(props.get("handler_type") or "")
        self.attempt: JsonValue = props.get("attempt")
        self.started = str(event.get("ts") or "")
        self.status = "running"
        self.duration_ms: JsonValue = None
        self.error: str | None = None
        self.files_touched: list[str] = []
        self.prompt: str | None = None
        self.reply: str | None = None
        self.command_output: str | None = None
        self.command_stderr: str | None = None
        self.diff: str | None = None
        self.commit: str | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost = 0.0

    def take(self, event: JsonObject) -> None:
        name = str(event.get("event") or "")
        props = _props(event)
        if name == "stage.started":
            self.status = "running"
            self.attempt = props.get("attempt", self.attempt)
        elif name in _ENDS:
            self._ended(name, props)
        elif name == "stage.prompt" and self.detailed:
            self.prompt = str(props.get("text") or "")
        elif name == "agent.message":
            if self.detailed:
                self.reply = str(props.get("text") or "")
            usage = props.get("usage")
            if isinstance(usage, dict):
                self.input_tokens += int(_number(usage.get("input_tokens")))
                self.output_tokens += int(_number(usage.get("output_tokens")))
                self.cost += _number(usage.get("cost") or props.get("cost"))

    def _ended(self, name: str, props: JsonObject) -> None:
        self.status = str(props.get("status") or ("failed" if name == "stage.failed" else ""))
        self.duration_ms = props.get("duration_ms")
        if name == "stage.failed":
            self.error = str(props.get("error") or "")
        touched = props.get("files_touched")
        if isinstance(touched, list):
            self.files_touched = [str(path) for path in touched]
        updates = props.get("context_updates")
        if self.detailed and isinstance(updates, dict):
            if "command.output" in updates:
                self.command_output = str(updates["command.output"])
            if "command.stderr" in updates:
                self.command_stderr = str(updates["command.stderr"])

    def row(self) -> JsonObject:
        return {
            "stage_id": self.stage_id,
            "node_id": self.node_id,
            "label": self.label,
            "handler_type": self.handler_type,
            "attempt": self.attempt,
            "status": self.status,
            "started": self.started,
            "duration_ms": self.duration_ms,
            "error": self.error,
            "files_touched": list(self.files_touched),
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
            "cost": round(self.cost, 6) if self.cost else None,
        }

    def details(self) -> JsonObject:
        return {
            **self.row(),
            "prompt": self.prompt,
            "reply": self.reply,
            "command_output": self.command_output,
            "command_stderr": self.command_stderr,
            "commit": self.commit,
            "diff": self.diff,
        }


def _stages(events: Iterable[JsonObject], detailed: str | None = None) -> list[_Stage]:
    """The stages of one pass over `events`, the one of id `detailed` with its details."""
    stages: dict[str, _Stage] = {}
    last_of_node: dict[str, _Stage] = {}
    for event in events:
        name = str(event.get("event") or "")
        stage_id = event.get("stage_id")
        if name == "checkpoint.completed":
            # The checkpoint after a stage carries no stage id: it belongs to the node's
            # latest stage.
            stage = last_of_node.get(str(event.get("node_id") or ""))
            if stage is not None and stage.detailed:
                props = _props(event)
                stage.commit = str(props.get("git_commit_sha") or "") or None
                diff = props.get("diff")
                if isinstance(diff, str):
                    stage.diff = diff
            continue
        if not isinstance(stage_id, str) or not stage_id:
            continue
        stage = stages.get(stage_id)
        if stage is None:
            if name != "stage.started":
                continue
            stage = stages[stage_id] = _Stage(stage_id, event, detailed=stage_id == detailed)
            last_of_node[stage.node_id] = stage
        stage.take(event)
    return list(stages.values())


class RunStages(NamedTuple):
    """A run's stages as its page shows them."""

    rows: list[JsonObject]  # each stage, in the order they started
    nodes: dict[str, JsonObject]  # per node: its latest stage's status, and its visits


def run_stages(events: Iterable[JsonObject]) -> RunStages:
    """The run's stages and its nodes' states, from one pass over its events."""
    stages = _stages(events)
    latest: dict[str, str] = {}
    visits: dict[str, int] = {}
    for stage in stages:
        latest[stage.node_id] = stage.status
        visits[stage.node_id] = visits.get(stage.node_id, 0) + 1
    return RunStages(
        [stage.row() for stage in stages],
        {node: {"status": status, "visits": visits[node]} for node, status in latest.items()},
    )


def stage_details(events: Iterable[JsonObject], stage_id: str) -> JsonObject | None:
    """One stage with its prompt, reply, command output and diff."""
    for stage in _stages(events, detailed=stage_id):
        if stage.stage_id == stage_id:
            return stage.details()
    return None
