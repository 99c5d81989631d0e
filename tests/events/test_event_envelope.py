"""Envelope encoding, UUID v7 ids and timestamps; every event round-trips cleanly."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import msgspec
import pytest
from event_contract.check import UNSCOPED_EVENTS, check_event
from event_contract.seed import Catalogue, EventSpec

from fabro_git.events import envelope as envelope_module
from fabro_git.events.catalogue import (
    CATALOGUE,
    MetadataSnapshotFailed,
    RunCreated,
    RunInterrupt,
    RunNotice,
    StageCompleted,
    StageUsage,
)
from fabro_git.events.envelope import (
    Actor,
    EventProps,
    decode_event,
    encode_event,
    format_ts,
    iter_complete_lines,
    make_envelope,
    stage_id_for,
    uuid7,
)

TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
RUN = "01JQXYZABCDEFGHJKMNPQRSTVW"


def test_uuid7_version_variant_and_time() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    parsed = uuid.UUID(value)
    assert str(parsed) == value
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert before <= parsed.int >> 80 <= after


def test_uuid7_is_strictly_increasing() -> None:
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_uuid7_stays_ordered_when_the_clock_stalls_or_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([2_000_000_000_000_000_000] * 6000 + [1_000_000_000_000_000_000] * 100)
    monkeypatch.setattr(envelope_module.time, "time_ns", lambda: next(clock))
    # The generator's memory of the last millisecond is restored afterwards, so the
    # fake far-future clock does not leak into later ids.
    monkeypatch.setattr(envelope_module, "_last_ms", -1)
    monkeypatch.setattr(envelope_module, "_counter", 0)
    ids = [uuid7() for _ in range(6100)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(uuid.UUID(i).version == 7 for i in ids)


def test_ts_format() -> None:
    assert format_ts(0) == "1970-01-01T00:00:00.000Z"
    assert format_ts(1_775_044_800_123) == "2026-04-01T12:00:00.123Z"
    env = make_envelope(RUN, RunInterrupt())
    assert TS_RE.match(env.ts)


def test_id_and_ts_share_a_clock_reading() -> None:
    env = make_envelope(RUN, RunInterrupt())
    ms = uuid.UUID(env.id).int >> 80
    assert format_ts(ms) == env.ts


def test_optional_envelope_fields_are_omitted() -> None:
    line = encode_event(make_envelope(RUN, RunNotice(level="info", code="c", message="m")))
    assert b"null" not in line
    assert list(decode_event(line)) == ["id", "ts", "run_id", "event", "properties"]
    assert not line.endswith(b"\n")


def test_scoped_envelope_field_order_and_label_default() -> None:
    env = make_envelope(
        RUN,
        RunNotice(level="warn", code="c", message="m"),
        node_id="code",
        stage_id=stage_id_for("code", 2),
        session_id="ses_a",
    )
    data = decode_event(encode_event(env))
    assert list(data) == [
        "id",
        "ts",
        "run_id",
        "event",
        "session_id",
        "node_id",
        "node_label",
        "stage_id",
        "properties",
    ]
    assert data["node_label"] == "code"
    assert data["stage_id"] == "code@2"


def test_actor_is_an_envelope_field() -> None:
    env = make_envelope(RUN, RunInterrupt(), actor=Actor(kind="user", login="octocat"))
    data = decode_event(encode_event(env))
    assert data["actor"] == {"kind": "user", "login": "octocat"}
    assert data["properties"] == {}


def test_required_empty_values_are_written() -> None:
    props = StageCompleted(
        index=1,
        duration_ms=5,
        status="succeeded",
        suggested_next_ids=[],
        files_touched=[],
        attempt=1,
        max_attempts=1,
    )
    data = decode_event(encode_event(make_envelope(RUN, props, node_id="code")))["properties"]
    assert data == {
        "index": 1,
        "duration_ms": 5,
        "status": "succeeded",
        "suggested_next_ids": [],
        "files_touched": [],
        "attempt": 1,
        "max_attempts": 1,
    }
    created = RunCreated(
        settings={}, graph={}, labels={}, run_dir="/tmp/r", provenance={}, in_place=False
    )
    data = decode_event(encode_event(make_envelope(RUN, created)))["properties"]
    assert data == {
        "settings": {},
        "graph": {},
        "labels": {},
        "run_dir": "/tmp/r",
        "provenance": {},
        "in_place": False,
    }


def test_nested_optionals_are_omitted() -> None:
    props = StageCompleted(
        index=1,
        duration_ms=5,
        status="succeeded",
        suggested_next_ids=["b"],
        usage=StageUsage(model="m", input_tokens=1, output_tokens=2),
        files_touched=[],
        attempt=1,
        max_attempts=1,
    )
    data = decode_event(encode_event(make_envelope(RUN, props)))
    assert data["properties"]["usage"] == {"model": "m", "input_tokens": 1, "output_tokens": 2}


def test_causes_omitted_when_empty() -> None:
    props = MetadataSnapshotFailed(
        phase="init", branch="refs/fabro/meta/x", duration_ms=1, failure_kind="write", error="e"
    )
    assert "causes" not in decode_event(encode_event(make_envelope(RUN, props)))["properties"]
    props.causes.append("disk full")
    assert decode_event(encode_event(make_envelope(RUN, props)))["properties"]["causes"] == [
        "disk full"
    ]


def test_an_uncatalogued_struct_is_refused() -> None:
    class Stray(EventProps):
        pass

    with pytest.raises(TypeError, match="Stray"):
        make_envelope(RUN, Stray())


def test_decode_event() -> None:
    line = encode_event(make_envelope(RUN, RunInterrupt()))
    assert decode_event(line + b"\n") == decode_event(line.decode())
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"[1, 2]")
    with pytest.raises(msgspec.DecodeError):
        decode_event(b'{"id": "x"')


def test_iter_complete_lines_drops_a_torn_tail() -> None:
    assert iter_complete_lines(b'{"a":1}\n\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert iter_complete_lines(b"") == []


# ----------------------------------------------------------------- round trip via the seed


def _sample(spec_type: str) -> Any:
    return {
        "string": "x",
        "number": 1,
        "boolean": True,
        "object": {},
        "array": [],
        "string[]": [],
        "any": "x",
    }[spec_type]


def sample_properties(spec: EventSpec) -> dict[str, Any]:
    """The seed's own example, with any required property it leaves out filled in."""
    props = {k: v for k, v in (spec.example or {}).items() if v is not None}
    for name, prop in spec.properties.items():
        if name not in props and not prop.optional:
            props[name] = prop.enum[0] if prop.enum else _sample(prop.type)
    return props


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_seed_example_round_trips_and_passes_the_contract(name: str, catalogue: Catalogue) -> None:
    spec = catalogue[name]
    cls = CATALOGUE[name]
    example = sample_properties(spec)
    props = msgspec.convert(example, cls, strict=True)
    assert msgspec.to_builtins(props) == example, "the Struct dropped or changed a field"
    scoped = name not in UNSCOPED_EVENTS
    env = make_envelope(
        RUN,
        props,
        node_id="code" if scoped else None,
        stage_id="code@1" if scoped else None,
        session_id="ses_abc" if name.startswith("agent.") else None,
    )
    data = decode_event(encode_event(env))
    assert data["properties"] == example
    assert check_event(data, catalogue) == []
