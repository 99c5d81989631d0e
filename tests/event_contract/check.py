"""Check emitted events against the seed's catalogue, field by field.

The Structs in `fabro_git.events.catalogue` make the right event easy to build; this
module proves that what actually reached the log is right. It works on decoded JSON,
not on our Structs, so it catches anything that bypassed them, and it reads its rules
from the parsed seed (`event_contract.seed`), not from our code.

It is strict on purpose: unknown names and fields, missing required fields, `null`
where the seed has no `?`, wrong JSON types, values outside an enumerated set, malformed
ids, timestamps and stage scopes are all reported. An empty list means the event is
exactly what the seed documents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from event_contract.seed import EventSpec, PropSpec
from fabro_git.events.envelope import decode_event, iter_complete_lines
from fabro_git.jsondata import JsonObject, JsonValue

# Envelope fields the seed names in prose rather than in its envelope table: stage-scoped
# events "carry node_id, node_label, stage_id, …" and control operations store "the actor
# … in the top-level actor envelope field".
PROSE_ENVELOPE_FIELDS: dict[str, PropSpec] = {
    "stage_id": PropSpec(name="stage_id", type="string", optional=True, nullable=True),
    "actor": PropSpec(name="actor", type="object", optional=True, nullable=True),
}

# Scope rules the seed states in prose. The envelope table: node_id is carried by "stage,
# checkpoint, agent, parallel branch, and other node-scoped events". The agent section:
# session lifecycle events "are not stage-scoped and intentionally omit node_id,
# node_label, stage_id". The metadata snapshot section: init and finalize snapshots are
# unscoped; checkpoint snapshots "include the checkpoint node_id, node_label, and stage_id".
NODE_SCOPED_PREFIXES = ("stage.", "checkpoint.", "parallel.branch.", "agent.")
SCOPE_FIELDS = ("node_id", "node_label", "stage_id")
# The agent events the seed names as not stage-scoped (kept here, not taken from the
# catalogue under test: `tests/events/test_event_catalogue.py` holds the two equal).
UNSCOPED_EVENTS = frozenset({"agent.session.started", "agent.session.ended"})

UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
TS_RE = re.compile(
    r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{3}Z$"
)
STAGE_ID_RE = re.compile(r"^(?P<node>.+)@(?P<visit>[1-9]\d*)$")


def envelope_spec(catalogue: Mapping[str, EventSpec]) -> dict[str, PropSpec]:
    """The seed's envelope table plus the prose-only fields."""
    table: dict[str, PropSpec] | None = getattr(catalogue, "envelope", None)
    if table is None:
        raise TypeError("check_event needs a Catalogue from event_contract.seed")
    return {**table, **PROSE_ENVELOPE_FIELDS}


def check_event(event: JsonValue, catalogue: Mapping[str, EventSpec]) -> list[str]:
    """Every way `event` (one decoded JSON line) departs from the seed; [] if none."""
    if not isinstance(event, dict):
        return [f"event is a JSON {_json_type_of(event)}, not an object"]
    name = event.get("event")
    where = name if isinstance(name, str) else "<no event name>"
    problems = _envelope_problems(where, event, catalogue)
    if isinstance(name, str):
        problems += _property_problems(where, catalogue.get(name), event)
    return problems


def _envelope_problems(
    where: str, event: JsonObject, catalogue: Mapping[str, EventSpec]
) -> list[str]:
    """The envelope's fields: known, typed, and the id, time and stage id well formed."""
    envelope = envelope_spec(catalogue)
    problems = [
        f"{where}: envelope field {key!r} is not in the seed's envelope"
        for key in event
        if key not in envelope
    ]
    problems += _check_fields(where, "", event, envelope)
    event_id = event.get("id")
    if isinstance(event_id, str) and not UUID7_RE.match(event_id):
        problems.append(f"{where}: id {event_id!r} is not a lowercase UUID v7")
    ts = event.get("ts")
    if isinstance(ts, str) and not TS_RE.match(ts):
        problems.append(f"{where}: ts {ts!r} is not RFC 3339 UTC with milliseconds")
    stage_id = event.get("stage_id")
    if isinstance(stage_id, str):
        m = STAGE_ID_RE.match(stage_id)
        if not m:
            problems.append(f"{where}: stage_id {stage_id!r} is not '<node_id>@<visit>'")
        elif isinstance(event.get("node_id"), str) and m["node"] != event["node_id"]:
            problems.append(
                f"{where}: stage_id {stage_id!r} does not belong to node_id {event['node_id']!r}"
            )
    return problems


def _property_problems(where: str, spec: EventSpec | None, event: JsonObject) -> list[str]:
    """The event's name known, its scope right, and its properties those documented."""
    if spec is None:
        return [f"{where}: unknown event name (not in the seed's catalogue)"]
    props = event.get("properties")
    if not isinstance(props, dict):
        return []  # already reported as a missing or mistyped envelope field
    problems = _scope_problems(where, event, props)
    for key in props:
        if key not in spec.properties:
            problems.append(f"{where}: property {key!r} is not documented for this event")
    problems += _check_fields(where, "properties.", props, spec.properties)
    for parent, fields in spec.nested.items():
        problems += _check_nested(where, parent, props, fields)
    return problems


def check_jsonl(data: bytes, catalogue: Mapping[str, EventSpec]) -> list[str]:
    """`check_event` over every line of a JSONL log, each problem prefixed `line N:`."""
    problems: list[str] = []
    for lineno, line in enumerate(iter_complete_lines(data + b"\n"), 1):
        try:
            event = decode_event(line)
        except msgspec.DecodeError as exc:
            problems.append(f"line {lineno}: not a JSON object: {exc}")
            continue
        problems += [f"line {lineno}: {p}" for p in check_event(event, catalogue)]
    return problems


def _scope_problems(where: str, event: JsonObject, props: JsonObject) -> list[str]:
    name = str(event["event"])
    present = [f for f in SCOPE_FIELDS if event.get(f) is not None]
    if name in UNSCOPED_EVENTS or (
        name.startswith("metadata.snapshot.") and props.get("phase") in ("init", "finalize")
    ):
        return [f"{where}: is not stage-scoped but carries {f}" for f in present]
    if name.startswith("metadata.snapshot.") and props.get("phase") == "checkpoint":
        return [
            f"{where}: a checkpoint snapshot is stage-scoped but has no {f}"
            for f in SCOPE_FIELDS
            if f not in present
        ]
    if name.startswith(NODE_SCOPED_PREFIXES) and "node_id" not in present:
        return [f"{where}: is node-scoped but has no node_id"]
    return []


def _check_nested(
    where: str, parent: str, props: JsonObject, fields: dict[str, PropSpec]
) -> list[str]:
    is_items = parent.endswith("[]")
    top = parent.removesuffix("[]")
    value = props.get(top)
    if value is None:
        return []  # absence / null is judged by the parent property's own spec
    objects: list[tuple[str, JsonValue]]
    if is_items:
        if not isinstance(value, list):
            return []
        objects = [(f"properties.{top}[{i}]", item) for i, item in enumerate(value)]
    else:
        objects = [(f"properties.{top}", value)]
    problems: list[str] = []
    for path, obj in objects:
        if not isinstance(obj, dict):
            problems.append(f"{where}: {path} should be an object, got {_json_type_of(obj)}")
            continue
        for key in obj:
            if key not in fields:
                problems.append(f"{where}: {path}.{key} is not documented for this event")
        problems += _check_fields(where, f"{path}.", obj, fields)
    return problems


def _check_fields(
    where: str, prefix: str, obj: JsonObject, fields: Mapping[str, PropSpec]
) -> list[str]:
    problems: list[str] = []
    for field in fields.values():
        label = f"{prefix}{field.name}"
        if field.name not in obj:
            if not field.optional:
                problems.append(f"{where}: required {label} is missing")
            continue
        value = obj[field.name]
        if value is None:
            if not field.nullable and field.type != "any":
                problems.append(f"{where}: {label} is null but the seed does not allow null")
            continue
        if not _has_type(value, field.type):
            problems.append(f"{where}: {label} should be {field.type}, got {_json_type_of(value)}")
            continue
        if field.omit_when_empty and value == []:
            problems.append(f"{where}: {label} is empty; the seed says it is omitted when empty")
        if field.enum is not None and value not in field.enum:
            allowed = ", ".join(field.enum)
            problems.append(f"{where}: {label} is {value!r}; the seed allows only {allowed}")
    return problems


def _has_type(value: JsonValue, type_: str) -> bool:
    match type_:
        case "string":
            return isinstance(value, str)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "boolean":
            return isinstance(value, bool)
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string[]":
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        case "any":
            return True
    raise ValueError(f"unknown seed type {type_!r}")


def _json_type_of(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array" if not value or not all(isinstance(v, str) for v in value) else "string[]"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
