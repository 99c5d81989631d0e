"""The web view's stages from a run's events (in process): the stage in flight, how
each ended, a node's visits, the checkpoint's diff given to the node's latest stage."""

from __future__ import annotations

from typing import Any

from fabro_git.web.stages import run_stages, stage_details


def _event(name: str, node: str | None = None, stage: str | None = None, **props: Any) -> dict:
    event: dict[str, Any] = {"id": name, "ts": "2026-01-01T00:00:00.000Z", "event": name}
    if node is not None:
        event["node_id"] = node
        event["node_label"] = node.title()
    if stage is not None:
        event["stage_id"] = stage
    event["properties"] = props
    return event


EVENTS = [
    _event("run.started"),
    _event("stage.started", "fix", "fix@1", handler_type="agent", attempt=1),
    _event("stage.prompt", "fix", "fix@1", text="Fix the bug"),
    _event(
        "agent.message", "fix", "fix@1", text="Done", usage={"input_tokens": 10, "output_tokens": 5}
    ),
    _event(
        "stage.completed", "fix", "fix@1", status="failed", duration_ms=40, files_touched=["a.py"]
    ),
    _event("checkpoint.completed", "fix", None, git_commit_sha="abc", diff="+x\n"),
    _event("stage.started", "fix", "fix@2", handler_type="agent", attempt=1),
    _event("stage.completed", "fix", "fix@2", status="succeeded", duration_ms=30),
    _event("checkpoint.completed", "fix", None, git_commit_sha="def", diff="+y\n"),
    _event("stage.started", "test", "test@3", handler_type="command", attempt=1),
    _event("metadata.snapshot.started", "test", "test@3"),
]


def test_stages_as_the_events_tell_them() -> None:
    rows, nodes = run_stages(iter(EVENTS))  # one pass: the events as they are read
    assert [(r["stage_id"], r["status"]) for r in rows] == [
        ("fix@1", "failed"),
        ("fix@2", "succeeded"),
        ("test@3", "running"),  # in flight: no checkpoint has it yet
    ]
    assert rows[0]["files_touched"] == ["a.py"]
    assert rows[0]["usage"] == {"input_tokens": 10, "output_tokens": 5}
    assert nodes == {
        "fix": {"status": "succeeded", "visits": 2},
        "test": {"status": "running", "visits": 1},
    }


def test_a_stage_has_its_prompt_reply_and_its_own_checkpoints_diff() -> None:
    first = stage_details(iter(EVENTS), "fix@1")
    assert first is not None
    assert (first["prompt"], first["reply"], first["diff"], first["commit"]) == (
        "Fix the bug",
        "Done",
        "+x\n",
        "abc",
    )
    second = stage_details(EVENTS, "fix@2")
    assert second is not None and second["diff"] == "+y\n"
    assert stage_details(EVENTS, "nope@1") is None
    # Events of a stage whose start was never seen are not a stage.
    assert run_stages([_event("stage.completed", "x", "x@1", status="succeeded")]).rows == []
