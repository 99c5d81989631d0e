"""The seed parser reads the whole catalogue, the envelope, and optionality correctly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from event_contract.seed import Catalogue, SeedFormatError, parse_catalogue

HEADER = re.compile(r"^`([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)`$")


def toc_names(seed_path: Path) -> list[str]:
    """Backticked names after the last 'Raw Blame History' line: the page's ToC copy."""
    lines = seed_path.read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if "Raw Blame History" in line)
    return [m.group(1) for line in lines[last:] if (m := HEADER.match(line.strip()))]


def test_every_toc_name_is_parsed(seed_path: Path, catalogue: Catalogue) -> None:
    toc = toc_names(seed_path)
    assert len(toc) > 60
    missing = [name for name in toc if name not in catalogue]
    assert missing == []


def test_every_backticked_header_is_an_event(seed_path: Path, catalogue: Catalogue) -> None:
    headers = {
        m.group(1) for line in seed_path.read_text().splitlines() if (m := HEADER.match(line))
    }
    assert set(catalogue) == headers
    assert len(catalogue) == 94


def test_envelope_fields(catalogue: Catalogue) -> None:
    env = catalogue.envelope
    assert list(env) == [
        "id",
        "ts",
        "run_id",
        "event",
        "session_id",
        "parent_session_id",
        "node_id",
        "node_label",
        "properties",
    ]
    required = [f.name for f in env.values() if not f.optional]
    assert required == ["id", "ts", "run_id", "event", "properties"]
    assert env["properties"].type == "object"
    assert env["node_id"].nullable


def test_required_and_optional(catalogue: Catalogue) -> None:
    props = catalogue["stage.completed"].properties
    assert props["suggested_next_ids"].type == "string[]"
    assert not props["suggested_next_ids"].optional
    assert not props["files_touched"].optional
    assert props["usage"].optional and props["usage"].nullable
    assert props["preferred_label"].optional
    assert props["status"].enum == ("succeeded", "failed", "skipped", "partially_succeeded")
    usage = catalogue["stage.completed"].nested["usage"]
    assert not usage["model"].optional
    assert usage["cost"].optional and usage["cost"].type == "number"

    created = catalogue["run.created"].properties
    assert [n for n, p in created.items() if not p.optional] == [
        "settings",
        "graph",
        "labels",
        "run_dir",
        "provenance",
        "in_place",
    ]


def test_enums_only_when_closed(catalogue: Catalogue) -> None:
    assert catalogue["run.notice"].properties["level"].enum == ("info", "warn", "error")
    assert catalogue["metadata.snapshot.failed"].properties["failure_kind"].enum == (
        "load_state",
        "write",
        "push",
    )
    # "... etc." leaves the set open.
    assert catalogue["stage.started"].properties["handler_type"].enum is None
    assert catalogue["edge.selected"].properties["reason"].enum is None


def test_arrays_omitted_when_empty(catalogue: Catalogue) -> None:
    causes = catalogue["metadata.snapshot.failed"].properties["causes"]
    assert causes.optional and causes.omit_when_empty and not causes.nullable
    tools = catalogue["agent.mcp.ready"].properties["tools"]
    assert tools.optional and tools.omit_when_empty
    sandbox_causes = catalogue["sandbox.snapshot.failed"].properties["causes"]
    assert sandbox_causes.optional and not sandbox_causes.omit_when_empty
    # Documented as possibly empty, so always present.
    files = catalogue["agent.memory.loaded"].properties["files"]
    assert not files.optional


def test_array_item_rows(catalogue: Catalogue) -> None:
    spec = catalogue["agent.memory.loaded"]
    assert "files" in spec.properties
    assert set(spec.nested) == {"files[]"}
    assert list(spec.nested["files[]"]) == ["path", "byte_count", "loaded_bytes", "truncated"]


def test_events_without_a_table(catalogue: Catalogue) -> None:
    assert catalogue["run.interrupt"].properties == {}
    assert catalogue["run.interrupt"].source == "none"
    for name in ("agent.session.ended", "agent.processing.end", "agent.output.start"):
        assert catalogue[name].properties == {}, name
    started = catalogue["agent.session.started"]
    assert started.source == "example"
    assert set(started.properties) == {"provider", "model"}
    assert all(p.optional for p in started.properties.values())
    activated = catalogue["agent.session.activated"].properties
    assert list(activated) == ["thread_id", "provider", "model", "capabilities", "visit"]
    assert activated["capabilities"].type == "string[]"
    assert activated["visit"].type == "number"


def test_examples_are_parsed(catalogue: Catalogue) -> None:
    assert catalogue["edge.selected"].example is not None
    assert catalogue["edge.selected"].example["to_node"] == "review"
    assert catalogue["agent.error"].example == {"error": {}}  # `{ ... }` placeholder


MINI = """\
Envelope fields

Field\tType\tDescription
`id`\tstring\tId
`properties`\tobject\tProps

`demo.thing`

Emitted for tests.

{
  "event": "demo.thing",
  "properties": {"count": 1}
}

Property\tType\tDescription
`count`\tnumber\tHow many
`mode`\tstring?\t`"a"` or `"b"`
`obj`\tobject?\tNested
`obj.inner`\tboolean\tInner flag

`demo.empty`

No properties.

`demo.thing`

`demo.empty`
"""


def test_parse_minimal_page() -> None:
    cat = parse_catalogue(MINI)
    assert list(cat) == ["demo.thing", "demo.empty"]
    assert list(cat.envelope) == ["id", "properties"]
    thing = cat["demo.thing"]
    assert thing.description == "Emitted for tests."
    assert thing.properties["mode"].enum == ("a", "b")
    assert thing.nested["obj"]["inner"].type == "boolean"
    assert cat["demo.empty"].properties == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MINI.replace("number\tHow many", "integer\tHow many"), "unknown type"),
        (MINI.replace("`obj.inner`", "`other.inner`"), "undocumented 'other'"),
        (MINI.replace("Envelope fields", "Envelope"), "Envelope fields"),
        (MINI + "\n`demo.empty`\n\nNo properties.\n", "documented twice"),
    ],
)
def test_parse_rejects_a_changed_page(text: str, message: str) -> None:
    with pytest.raises(SeedFormatError, match=message):
        parse_catalogue(text)


def test_carried_contract_is_the_seed(seed_path: Path) -> None:
    """The catalogue the project carries says what the seed page says, prose aside."""
    from event_contract.seed import CONTRACT_DATA, catalogue_data, load_catalogue

    fresh = catalogue_data(load_catalogue(seed_path))
    assert fresh == CONTRACT_DATA.read_bytes(), (
        "tests/event_contract/contract.json is out of date; regenerate it with "
        f"`cd tests && python -m event_contract.seed {seed_path} > event_contract/contract.json`"
    )
