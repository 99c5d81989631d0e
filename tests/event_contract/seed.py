"""Read the events catalogue straight from the user's seed page.

The seed (a scraped documentation page) is the contract for every event we emit. Rather
than transcribing it into code and letting the two drift apart, the contract checker and
the tests parse the page itself: change the seed and the tests say which Struct disagrees.

The page is loose text, so the parser is deliberately forgiving about layout and strict
about content:

- an event section starts at a line holding only a backticked dotted name
  (`` `stage.completed` ``); the same names reappear at the end of the page as a table of
  contents, and a header with no body is recognised as such and ignored;
- a ``Property\\tType\\tDescription`` table gives the properties; a ``?`` after the type
  means "may be absent or null", and dotted rows (``usage.model``) or array-item rows
  (``files[].path``) describe the fields of a nested object;
- a few array properties have no ``?`` but their description says they are "omitted
  when empty" or "Optional"; those may be absent (never null);
- a description that lists every allowed value as backticked JSON strings and does not
  end in "etc." closes the set of values;
- sections that say "No properties." / "Properties are empty." have none; sections that
  describe properties only in prose (the ``agent.session.*`` lifecycle events) get them
  from their example JSON, all optional. Every section's example properties are kept
  (`EventSpec.example`) so tests can feed the seed's own examples through our Structs.

This module only reads text; it knows nothing about our Structs.

The project carries the parsed catalogue as data of its own (`contract.json`: names,
properties, types, optionality and examples, without the page's prose), so the contract
holds in any clone. `python -m event_contract.seed SEED`, run in `tests/`, writes that file anew from the
page; a test compares the two whenever the page is at hand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import msgspec

from fabro_git.jsondata import JsonObject, JsonValue

Source = Literal["table", "example", "none"]

_HEADER = re.compile(r"^`([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)`\s*$")
_ROW = re.compile(r"^`([^`]+)`\t([^\t]+)\t(.*)$")
_TABLE_HEAD = re.compile(r"^(Property|Field)\tType\tDescription\s*$")
_ENUM_VALUE = re.compile(r'`"([^"`]+)"`')
_OMITTED_WHEN_EMPTY = re.compile(r"\bomitted\b[^.]*\bwhen empty\b", re.IGNORECASE)
_SAYS_OPTIONAL = re.compile(r"^optional\b", re.IGNORECASE)
_NO_PROPS = re.compile(r"\bNo properties\b|\bProperties are empty\b")

JSON_TYPES = ("string", "number", "boolean", "object", "array", "string[]", "any")


class PropSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One documented property.

    `type` is the seed's type without the `?` (one of `JSON_TYPES`). `optional` means the
    property may be absent; `nullable` means it may also be JSON null (only a `?` type
    grants that). `omit_when_empty` marks an array the seed says is left out rather than
    written empty. `enum` is the closed set of allowed string values, if the seed gives one.
    """

    name: str
    type: str
    optional: bool
    nullable: bool = False
    omit_when_empty: bool = False
    enum: tuple[str, ...] | None = None
    description: str = ""


class EventSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event section: top-level properties, plus the fields of nested objects.

    `nested` is keyed by the parent property; items of an array of objects are keyed
    with a `[]` suffix (`files[]`), plain nested objects by the bare name (`usage`).
    """

    name: str
    properties: dict[str, PropSpec]
    nested: dict[str, dict[str, PropSpec]] = msgspec.field(default_factory=dict)
    source: Source = "table"
    description: str = ""
    example: JsonObject | None = None


class Catalogue(dict[str, EventSpec]):
    """Event name → spec, carrying the envelope fields table alongside."""

    def __init__(self, events: dict[str, EventSpec], envelope: dict[str, PropSpec]) -> None:
        super().__init__(events)
        self.envelope = envelope


class SeedFormatError(ValueError):
    """The seed page no longer has the shape this parser understands."""


def load_catalogue(path: Path) -> Catalogue:
    """Parse the events seed at `path` into a `Catalogue`."""
    return parse_catalogue(Path(path).read_text(encoding="utf-8"))


CONTRACT_DATA = Path(__file__).with_name("contract.json")


class _CatalogueData(msgspec.Struct, frozen=True, kw_only=True):
    envelope: dict[str, PropSpec]
    events: dict[str, EventSpec]


def _without_prose(spec: PropSpec) -> PropSpec:
    return msgspec.structs.replace(spec, description="")


def catalogue_data(catalogue: Catalogue) -> bytes:
    """The facts of `catalogue` as stable JSON: every description left out."""
    events = {
        name: msgspec.structs.replace(
            spec,
            description="",
            properties={k: _without_prose(v) for k, v in spec.properties.items()},
            nested={
                parent: {k: _without_prose(v) for k, v in fields.items()}
                for parent, fields in spec.nested.items()
            },
        )
        for name, spec in catalogue.items()
    }
    envelope = {k: _without_prose(v) for k, v in catalogue.envelope.items()}
    data = _CatalogueData(envelope=envelope, events=events)
    return msgspec.json.format(msgspec.json.encode(data), indent=1) + b"\n"


def load_contract(path: Path = CONTRACT_DATA) -> Catalogue:
    """The catalogue the project carries (see the module docstring)."""
    data = msgspec.json.decode(path.read_bytes(), type=_CatalogueData)
    return Catalogue(data.events, data.envelope)


def parse_catalogue(text: str) -> Catalogue:
    lines = text.splitlines()
    envelope = _parse_envelope(lines)
    events: dict[str, EventSpec] = {}
    for name, body in _sections(lines):
        if not any(line.strip() for line in body):
            continue  # table-of-contents entry
        spec = _parse_section(name, body)
        if name in events:
            raise SeedFormatError(f"event {name!r} is documented twice in the seed")
        events[name] = spec
    if not events:
        raise SeedFormatError("no event sections found in the seed")
    return Catalogue(events, envelope)


def _sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        m = _HEADER.match(line)
        if m:
            sections.append((m.group(1), []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def _parse_envelope(lines: list[str]) -> dict[str, PropSpec]:
    for i, line in enumerate(lines):
        if line.strip() == "Envelope fields":
            rows = _table_after(lines, i + 1)
            if rows:
                return {row.name: row for row in rows}
    raise SeedFormatError("the seed has no 'Envelope fields' table")


def _table_after(lines: list[str], start: int) -> list[PropSpec]:
    """The rows of the first table at or after `start`, before any event header."""
    i = start
    while i < len(lines) and not _TABLE_HEAD.match(lines[i]):
        if _HEADER.match(lines[i]):
            return []
        i += 1
    rows: list[PropSpec] = []
    for line in lines[i + 1 :]:
        m = _ROW.match(line)
        if not m:
            break
        rows.append(_prop(m.group(1), m.group(2).strip(), m.group(3).strip()))
    return rows


def _prop(name: str, raw_type: str, description: str) -> PropSpec:
    nullable = raw_type.endswith("?")
    type_ = raw_type.rstrip("?")
    if type_ not in JSON_TYPES:
        raise SeedFormatError(f"property {name!r} has unknown type {raw_type!r}")
    is_array = type_ in ("array", "string[]")
    omit_when_empty = is_array and bool(_OMITTED_WHEN_EMPTY.search(description))
    optional = (
        nullable or omit_when_empty or (is_array and bool(_SAYS_OPTIONAL.search(description)))
    )
    values = tuple(_ENUM_VALUE.findall(description))
    enum = values if len(values) >= 2 and "etc." not in description else None
    return PropSpec(
        name=name,
        type=type_,
        optional=optional,
        nullable=nullable,
        omit_when_empty=omit_when_empty,
        enum=enum,
        description=description,
    )


def _parse_section(name: str, body: list[str]) -> EventSpec:
    description = _description(body)
    try:
        example: JsonObject | None = _example_properties(name, body)
    except SeedFormatError:
        example = None
    rows = _table_after(body, 0)
    if rows:
        props: dict[str, PropSpec] = {}
        nested: dict[str, dict[str, PropSpec]] = {}
        for row in rows:
            parent, _, child = row.name.rpartition(".")
            if parent:
                nested.setdefault(parent, {})[child] = msgspec.structs.replace(row, name=child)
            else:
                props[row.name] = row
        for parent in nested:
            top = parent.removesuffix("[]")
            if top not in props:
                raise SeedFormatError(f"{name}: nested rows under undocumented {top!r}")
        return EventSpec(
            name=name,
            properties=props,
            nested=nested,
            source="table",
            description=description,
            example=example,
        )
    if _NO_PROPS.search("\n".join(body)):
        return EventSpec(
            name=name, properties={}, source="none", description=description, example=example
        )
    if example is None:
        example = _example_properties(name, body)  # raises the parse error
    props = {
        key: PropSpec(
            name=key,
            type=_json_type(value),
            optional=True,
            nullable=True,
            description="(from the seed's example)",
        )
        for key, value in example.items()
    }
    return EventSpec(
        name=name, properties=props, source="example", description=description, example=example
    )


def _description(body: list[str]) -> str:
    """The prose of a section: its non-blank lines outside the example and the table."""
    out: list[str] = []
    depth = 0
    for line in body:
        if _TABLE_HEAD.match(line):
            break
        stripped = line.strip()
        if depth == 0 and stripped and not stripped.startswith("{"):
            out.append(stripped)
        depth += line.count("{") - line.count("}")
    return " ".join(out)


def _example_properties(name: str, body: list[str]) -> JsonObject:
    text = "\n".join(body)
    start = text.find("{")
    if start < 0:
        raise SeedFormatError(f"{name}: neither a property table nor an example")
    depth = 0
    for i, ch in enumerate(text[start:], start):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            snippet = text[start : i + 1]
            break
    else:
        raise SeedFormatError(f"{name}: unbalanced example JSON")
    snippet = re.sub(r"\{\s*\.\.\.\s*\}", "{}", snippet)
    try:
        example = json.loads(snippet)
    except json.JSONDecodeError as exc:
        raise SeedFormatError(f"{name}: example JSON does not parse: {exc}") from None
    props = example.get("properties")
    if not isinstance(props, dict):
        raise SeedFormatError(f"{name}: example has no properties object")
    return props


def _json_type(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "string[]" if value and all(isinstance(v, str) for v in value) else "array"
    return "any"


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit(
            "usage (in tests/): python -m event_contract.seed SEED_FILE > event_contract/contract.json"
        )
    sys.stdout.buffer.write(catalogue_data(load_catalogue(Path(sys.argv[1]))))
