"""The artifact store's per-visit files, on their own: names, pointers, pruning and
restoring, and the context view that reads pointers as values."""

from __future__ import annotations

import json
from pathlib import Path

from fabro_git.outputs.artifacts import (
    OFFLOAD_THRESHOLD,
    ArtifactStore,
    ResolvedContext,
    pointer_name,
)

BIG = "v" * (OFFLOAD_THRESHOLD + 1)


def test_a_visit_file_and_the_current_value_hold_the_same_bytes(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    first = store.offload_stage({"command.output": BIG, "n": 1}, "build")
    assert first.record["n"] == first.context["n"] == 1
    visit = first.record["command.output"]
    current = first.context["command.output"]
    assert visit == f"file://{tmp_path}/artifacts/values/build/command.output.json"
    assert current == f"file://{tmp_path}/artifacts/values/command.output.json"
    assert set(first.written) == {"build/command.output", "command.output"}
    assert store.read(visit) == store.read(current) == BIG
    second = store.offload_stage({"command.output": BIG + "2"}, "test-2")
    assert store.read(visit) == BIG  # the earlier visit's value stays
    assert store.read(second.context["command.output"]) == BIG + "2"
    assert store.names() == {"build/command.output", "test-2/command.output", "command.output"}


def test_pointers_name_visit_files_from_any_scratch_dir() -> None:
    assert pointer_name("file:///x/artifacts/values/fix-2/response.fix.json") == (
        "fix-2/response.fix"
    )
    assert pointer_name("file:///x/artifacts/values/response.fix.json") == "response.fix"
    assert pointer_name("file:///x/artifacts/other/fix/a.json") is None
    assert pointer_name("file:///x/values/fix/deeper/a.json") is None


def test_prune_keeps_every_visit_file_and_materialise_restores_exactly(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.offload_stage({"k": BIG}, "a")
    assert store.prune(set()) == ["k"]
    assert store.names() == {"a/k"}
    store.materialise({"b/k": b'"x"', "k": b'"x"'})
    assert store.names() == {"b/k", "k"}


def test_the_resolved_context_reads_pointers_as_values(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    offloaded = store.offload_stage({"table": {"rows": ["r" * 1000] * 200}}, "s")
    view = ResolvedContext({**offloaded.context, "plain": "p", "gone": store.pointer("nope")})
    assert view["table"] == {"rows": ["r" * 1000] * 200}
    assert view["plain"] == "p"
    assert view["gone"] == store.pointer("nope")  # a missing file: the pointer itself
    assert json.loads(store.path("s/table").read_text())["rows"][0] == "r" * 1000
