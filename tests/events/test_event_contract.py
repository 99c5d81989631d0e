"""check_event reports every way an event departs from the seed, precisely."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from event_contract.check import UNSCOPED_EVENTS, check_event, check_jsonl
from event_contract.seed import Catalogue

GOOD: dict[str, Any] = {
    "id": "019234ab-cdef-7890-abcd-ef1234567890",
    "ts": "2026-04-01T12:00:00.123Z",
    "run_id": "01JQXYZ",
    "event": "stage.completed",
    "node_id": "code",
    "node_label": "Write Code",
    "stage_id": "code@1",
    "properties": {
        "index": 1,
        "duration_ms": 8000,
        "status": "succeeded",
        "suggested_next_ids": ["review"],
        "usage": {"model": "m", "input_tokens": 5, "output_tokens": 2, "cost": 0.05},
        "files_touched": [],
        "attempt": 1,
        "max_attempts": 3,
    },
}


def changed(**edits: Any) -> dict[str, Any]:
    """GOOD with edits: `p_x` is properties.x, `u_x` is properties.usage.x; `...` deletes."""
    event = copy.deepcopy(GOOD)
    for key, value in edits.items():
        target = event
        if key.startswith("p_"):
            target, key = event["properties"], key[2:]
        if key.startswith("u_"):
            target, key = event["properties"]["usage"], key[2:]
        if value is ...:
            del target[key]
        else:
            target[key] = value
    return event


def test_a_good_event_passes(catalogue: Catalogue) -> None:
    assert check_event(GOOD, catalogue) == []


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (changed(event="stage.finished"), "stage.finished: unknown event name"),
        (changed(colour="red"), "envelope field 'colour' is not in the seed's envelope"),
        (changed(run_id=...), "required run_id is missing"),
        (changed(properties=...), "required properties is missing"),
        (changed(properties=[]), "properties should be object, got array"),
        (changed(node_label=None), None),  # `string?` allows null
        (changed(node_id=None, stage_id=...), "stage.completed: is node-scoped but has no node_id"),
        (changed(node_id=7), "node_id should be string, got number"),
        (changed(id="3b241101-e2bb-4255-8caf-4136c566a962"), "is not a lowercase UUID v7"),
        (changed(id="019234AB-CDEF-7890-ABCD-EF1234567890"), "is not a lowercase UUID v7"),
        (changed(ts="2026-04-01T12:00:00Z"), "is not RFC 3339 UTC with milliseconds"),
        (changed(ts="2026-04-01T12:00:00.123+00:00"), "is not RFC 3339 UTC with milliseconds"),
        (changed(stage_id="code"), "stage_id 'code' is not '<node_id>@<visit>'"),
        (changed(stage_id="code@0"), "is not '<node_id>@<visit>'"),
        (changed(stage_id="review@1"), "does not belong to node_id 'code'"),
        (changed(p_colour="red"), "property 'colour' is not documented for this event"),
        (changed(p_files_touched=...), "required properties.files_touched is missing"),
        (changed(p_suggested_next_ids=None), "suggested_next_ids is null but the seed"),
        (changed(p_duration_ms="8s"), "properties.duration_ms should be number, got string"),
        (changed(p_duration_ms=True), "properties.duration_ms should be number, got boolean"),
        (changed(p_files_touched=["a", 1]), "files_touched should be string[], got array"),
        (changed(p_status="success"), "properties.status is 'success'; the seed allows only"),
        (changed(p_failure_class="flaky"), "properties.failure_class is 'flaky'"),
        (changed(p_preferred_label=None), None),
        (changed(p_usage=None), None),
        (changed(p_usage="lots"), "properties.usage should be object, got string"),
        (changed(u_model=...), "required properties.usage.model is missing"),
        (changed(u_total_tokens=7), "properties.usage.total_tokens is not documented"),
        (changed(u_cost="5c"), "properties.usage.cost should be number, got string"),
    ],
)
def test_departures_are_reported(
    event: dict[str, Any], expected: str | None, catalogue: Catalogue
) -> None:
    problems = check_event(event, catalogue)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in p for p in problems), problems


def test_not_an_object(catalogue: Catalogue) -> None:
    assert check_event([1], catalogue) == ["event is a JSON array, not an object"]


def test_prose_envelope_fields_are_allowed(catalogue: Catalogue) -> None:
    event = {
        "id": GOOD["id"],
        "ts": GOOD["ts"],
        "run_id": "r",
        "event": "run.interrupt",
        "actor": {"kind": "user", "login": "octocat"},
        "properties": {},
    }
    assert check_event(event, catalogue) == []
    event["properties"] = {"reason": "because"}
    assert check_event(event, catalogue) == [
        "run.interrupt: property 'reason' is not documented for this event"
    ]
    event["properties"] = {}
    event["actor"] = "octocat"
    assert check_event(event, catalogue) == ["run.interrupt: actor should be object, got string"]


def _event(name: str, props: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    if name.startswith("agent.") and name not in UNSCOPED_EVENTS and not envelope:
        envelope = {"node_id": "code", "session_id": "ses_a", **envelope}
    return {
        "id": GOOD["id"],
        "ts": GOOD["ts"],
        "run_id": "r",
        "event": name,
        **envelope,
        "properties": props,
    }


def test_array_item_objects_are_checked(catalogue: Catalogue) -> None:
    props = {
        "provider_profile": "anthropic",
        "files": [{"path": "/r/AGENTS.md", "byte_count": 4, "loaded_bytes": 4, "truncated": False}],
        "total_loaded_bytes": 4,
        "budget_bytes": 32768,
        "visit": 1,
    }
    assert check_event(_event("agent.memory.loaded", props), catalogue) == []
    props["files"] = [{"path": "/r/AGENTS.md", "byte_count": 4, "loaded_bytes": 4}, "x"]
    problems = check_event(_event("agent.memory.loaded", props), catalogue)
    assert problems == [
        "agent.memory.loaded: required properties.files[0].truncated is missing",
        "agent.memory.loaded: properties.files[1] should be an object, got string",
    ]


def test_omitted_when_empty_is_enforced(catalogue: Catalogue) -> None:
    props = {
        "phase": "finalize",
        "branch": "refs/fabro/meta/r",
        "duration_ms": 3,
        "failure_kind": "write",
        "error": "boom",
    }
    assert check_event(_event("metadata.snapshot.failed", props), catalogue) == []
    problems = check_event(_event("metadata.snapshot.failed", {**props, "causes": []}), catalogue)
    assert problems == [
        "metadata.snapshot.failed: properties.causes is empty; the seed says it is omitted when empty"
    ]
    problems = check_event(_event("metadata.snapshot.failed", {**props, "causes": None}), catalogue)
    assert problems == [
        "metadata.snapshot.failed: properties.causes is null but the seed does not allow null"
    ]


def test_no_property_events_must_be_empty(catalogue: Catalogue) -> None:
    assert check_event(_event("agent.output.start", {}), catalogue) == []
    assert check_event(_event("agent.output.start", {"text": "x"}), catalogue) == [
        "agent.output.start: property 'text' is not documented for this event"
    ]


def test_example_derived_properties(catalogue: Catalogue) -> None:
    ok = _event("agent.session.activated", {"thread_id": "main", "capabilities": ["steer"]})
    assert check_event(ok, catalogue) == []
    bad = _event("agent.session.activated", {"visit": "1", "lease": True})
    assert check_event(bad, catalogue) == [
        "agent.session.activated: property 'lease' is not documented for this event",
        "agent.session.activated: properties.visit should be number, got string",
    ]


def test_legacy_events_still_check(catalogue: Catalogue) -> None:
    event = _event("cli.ensure.started", {"cli_name": "aider", "provider": "openai"})
    assert check_event(event, catalogue) == []


def test_check_jsonl_numbers_lines(catalogue: Catalogue) -> None:
    import json

    good = json.dumps(GOOD).encode()
    bad = json.dumps(changed(p_status="done")).encode()
    problems = check_jsonl(good + b"\n" + b"{nope\n" + bad + b"\n", catalogue)
    assert len(problems) == 2
    assert problems[0].startswith("line 2: not a JSON object")
    assert problems[1].startswith("line 3: stage.completed: properties.status is 'done'")


def test_check_event_needs_the_envelope_table(catalogue: Catalogue) -> None:
    with pytest.raises(TypeError, match="Catalogue"):
        check_event(GOOD, dict(catalogue))


def test_scope_rules_from_the_seed_prose(catalogue: Catalogue) -> None:
    started = _event("agent.session.started", {"provider": "openai"}, session_id="ses_a")
    assert check_event(started, catalogue) == []
    started["node_id"] = "code"
    assert check_event(started, catalogue) == [
        "agent.session.started: is not stage-scoped but carries node_id"
    ]
    text = _event("agent.text.delta", {"delta": "hi"}, session_id="ses_a")
    assert check_event(text, catalogue) == ["agent.text.delta: is node-scoped but has no node_id"]

    snap = {"phase": "checkpoint", "branch": "refs/fabro/meta/r"}
    scoped = {"node_id": "code", "node_label": "code", "stage_id": "code@2"}
    assert check_event(_event("metadata.snapshot.started", snap, **scoped), catalogue) == []
    assert check_event(
        _event("metadata.snapshot.started", snap, node_id="code", node_label="code"), catalogue
    ) == ["metadata.snapshot.started: a checkpoint snapshot is stage-scoped but has no stage_id"]
    init = {**snap, "phase": "init"}
    assert check_event(_event("metadata.snapshot.started", init), catalogue) == []
    assert check_event(_event("metadata.snapshot.started", init, **scoped), catalogue) == [
        "metadata.snapshot.started: is not stage-scoped but carries node_id",
        "metadata.snapshot.started: is not stage-scoped but carries node_label",
        "metadata.snapshot.started: is not stage-scoped but carries stage_id",
    ]
