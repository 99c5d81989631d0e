"""The artifact store on its own: what it offloads, names, reads, repoints and removes."""

from __future__ import annotations

import json
from pathlib import Path

from fabro_git.outputs.artifacts import (
    OFFLOAD_THRESHOLD,
    ArtifactStore,
    artifact_name,
    pointer_name,
    referenced_names,
)


def test_only_values_over_the_threshold_are_offloaded(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    big = "x" * OFFLOAD_THRESHOLD  # its JSON form has two quotes more: over the limit
    edge = "y" * (OFFLOAD_THRESHOLD - 2)  # exactly at the limit: stays
    kept, written = store.offload({"big": big, "edge": edge, "n": 3})
    assert kept["edge"] == edge and kept["n"] == 3
    assert kept["big"] == f"file://{tmp_path}/artifacts/values/big.json"
    assert set(written) == {"big"}
    assert json.loads(written["big"]) == big
    assert store.read(kept["big"]) == big
    assert store.names() == {"big"}


def test_an_unchanged_value_is_not_written_again(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    value = {"rows": ["r" * 1000] * 200}
    _, first = store.offload({"table": value})
    _, again = store.offload({"table": value})
    assert set(first) == {"table"} and again == {}
    _, changed = store.offload({"table": {"rows": ["s" * 1000] * 200}})
    assert set(changed) == {"table"}


def test_names_are_safe_file_names(tmp_path: Path) -> None:
    assert artifact_name("response.plan") == "response.plan"
    assert artifact_name("../../etc/passwd") == "%2E.%2F..%2Fetc%2Fpasswd"
    assert artifact_name("command.output", "fan/0") == "command.output@fan%2F0"
    store = ArtifactStore(tmp_path)
    kept, _ = store.offload({"a/../b": "z" * (OFFLOAD_THRESHOLD + 1)})
    path = Path(kept["a/../b"].removeprefix("file://"))
    assert path.parent == tmp_path / "artifacts" / "values" and path.is_file()


def test_pointers_from_another_scratch_dir_are_recognised_and_repointed(tmp_path: Path) -> None:
    here = ArtifactStore(tmp_path / "b")
    elsewhere = "file:///somewhere/else/artifacts/values/response.plan.json"
    assert pointer_name(elsewhere) == "response.plan"
    assert pointer_name("file:///etc/passwd") is None
    assert pointer_name("plain text") is None
    values = {"response.plan": elsewhere, "other": "file:///tmp/x.json", "n": 1}
    here.repoint(values)
    assert values == {
        "response.plan": f"file://{tmp_path}/b/artifacts/values/response.plan.json",
        "other": "file:///tmp/x.json",
        "n": 1,
    }


def test_materialise_makes_the_store_hold_exactly_the_given_files(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.offload({"stale": "s" * (OFFLOAD_THRESHOLD + 1)})
    store.materialise({"kept": b'"value"'})
    assert store.names() == {"kept"}
    assert store.path("kept").read_bytes() == b'"value"'


def test_prune_removes_what_nothing_points_to(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    kept, _ = store.offload({k: k * (OFFLOAD_THRESHOLD + 1) for k in ("a", "b", "c")})
    context = {"a": kept["a"], "x": 1}
    records = [{"context_updates": {"b": kept["b"]}}, {"status": "succeeded"}]
    keep = referenced_names(context, records)
    assert keep == {"a", "b"}
    assert store.prune(keep) == ["c"]
    assert store.names() == {"a", "b"}
    assert not store.path("c").exists()


def test_nested_pointers_are_kept_and_repointed(tmp_path: Path) -> None:
    """A fan-in's `parallel.results` holds its branches' context updates, pointers and all."""
    store = ArtifactStore(tmp_path / "new")
    old = "file:///old/artifacts/values/command.output@fan-1%2F0.json"
    results = [{"id": "a", "context_updates": {"command.output": old}}]
    keep = referenced_names({"parallel.results": results}, [])
    assert keep == {"command.output@fan-1%2F0"}
    values = {"parallel.results": results}
    store.repoint(values)
    assert values["parallel.results"][0]["context_updates"]["command.output"] == store.pointer(
        "command.output@fan-1%2F0"
    )


def test_artifacts_are_private(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.offload({"secret": "s" * (OFFLOAD_THRESHOLD + 1)})
    assert store.path("secret").stat().st_mode & 0o777 == 0o600
    assert store.root.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "artifacts").stat().st_mode & 0o777 == 0o700
