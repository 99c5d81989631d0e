"""Deltas of maps whose values are all ints or all strings (found by a set difference)
put back together into exactly the checkpoint that was meant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import git, read_checkpoint, run_fabro, write_workflow

from fabro_git.engine.checkpoint import Checkpoint, DeltaWriter, apply_delta, encode


def _base() -> Checkpoint:
    return Checkpoint(
        completed_nodes=["a", "b"],
        node_visits={"a": 1, "b": 2},
        node_retries={"a": 0},
        context_values={"x": "1", "y": "two"},
    )


def _round_trip(base: Checkpoint, edit: Any) -> tuple[Checkpoint, Checkpoint, Any]:
    writer = DeltaWriter()
    writer.written(base, "f" * 40, whole=True)
    cp = Checkpoint(**{n: getattr(base, n) for n in Checkpoint.__struct_fields__})
    for name in ("node_visits", "node_retries", "context_values", "completed_nodes"):
        setattr(cp, name, type(getattr(base, name))(getattr(base, name)))
    edit(cp)
    delta = writer.delta(cp)
    assert delta is not None
    return cp, apply_delta(base, delta), delta


def test_changed_added_removed_entries() -> None:
    def edit(cp: Checkpoint) -> None:
        cp.node_visits["b"] = 3
        cp.node_visits["c"] = 1
        del cp.node_retries["a"]
        cp.context_values["y"] = "three"
        cp.completed_nodes.append("c")

    cp, back, delta = _round_trip(_base(), edit)
    assert delta.node_visits == {"b": 3, "c": 1}
    assert delta.context_values == {"y": "three"}
    assert delta.removed == {"node_retries": ["a"]}
    assert encode(back) == encode(cp)


def test_equal_value_of_another_type_is_a_change() -> None:
    def edit(cp: Checkpoint) -> None:
        cp.node_visits["a"] = True  # == 1 in Python, not in JSON
        cp.context_values["x"] = 1

    cp, back, delta = _round_trip(_base(), edit)
    assert delta.node_visits == {"a": True}
    assert delta.context_values == {"x": 1}
    assert encode(back) == encode(cp)


def test_unchanged_maps_carry_nothing() -> None:
    cp, back, delta = _round_trip(_base(), lambda cp: None)
    assert delta.node_visits == {} and delta.context_values == {} and delta.removed == {}
    assert encode(back) == encode(cp)


def test_records_replaced_are_caught_and_the_ones_held_are_not_compared() -> None:
    base = _base()
    base.node_outcomes = {f"n{i}": {"status": "success", "visit": 1} for i in range(50)}
    writer = DeltaWriter()
    writer.written(base, "f" * 40, whole=True)
    outcomes = base.node_outcomes  # the same objects, as the engine keeps them
    outcomes["n3"] = {"status": "fail", "visit": 1}  # replaced
    outcomes["n7"] = {"status": "success", "visit": 1}  # a new object, equal
    outcomes["n9"] = {"status": "success", "visit": True}  # equal in Python only
    outcomes["n60"] = {"status": "success", "visit": 1}  # new key
    delta = writer.delta(base)
    assert delta is not None
    assert set(delta.node_outcomes) == {"n3", "n9", "n60"}
    assert encode(apply_delta(_decoded_base(writer, base), delta)) == encode(base)
    # A record held is taken as it was, unread: the engine replaces records, never
    # changes one in place (this change is outside that contract, so the delta keeps
    # the base's record).
    outcomes["n4"]["status"] = "fail"
    assert "n4" not in (writer.delta(base) or base).node_outcomes


def test_the_engine_never_changes_a_stage_record_in_place(repo: Path) -> None:
    """What lets the delta skip comparing the records it holds: a run's checkpoint, read
    back from git at every stage, is the engine's own, record for record."""
    wf = write_workflow(
        repo,
        """digraph W {
          start [shape=Mdiamond]
          exit [shape=Msquare]
          a [shape=parallelogram, script="echo a >> a.txt"]
          b [shape=parallelogram, script="if [ -f m ]; then exit 0; fi; touch m; exit 1"]
          start -> a -> b
          b -> a [condition="outcome=fail"]
          b -> exit [condition="outcome=success"]
        }""",
    )
    result = run_fabro("run", str(wf), "--json", cwd=repo)
    run_id = json.loads(result.stdout)["run_id"]
    assert json.loads(result.stdout)["status"] == "succeeded"
    ref = f"refs/fabro/meta/{run_id}"
    commits = git(repo, "rev-list", "--reverse", ref).split()
    seen = 0
    for commit in commits:
        if "checkpoint.json" not in git(repo, "ls-tree", "--name-only", commit):
            continue
        back = read_checkpoint(repo, commit)
        # Every record in a checkpoint is the one its stage's status.json holds.
        for node_id, record in back["node_outcomes"].items():
            visit = record.get("visit", 1)
            folder = node_id if visit == 1 else f"{node_id}-{visit}"
            status = json.loads(git(repo, "show", f"{commit}:nodes/{folder}/status.json"))
            assert status == record, (commit, node_id)
            seen += 1
    assert seen >= 10


def _decoded_base(writer: DeltaWriter, cp: Checkpoint) -> Checkpoint:
    """The base as git holds it: the copies taken when it was written."""
    import msgspec

    fields = {n: getattr(cp, n) for n in Checkpoint.__struct_fields__}
    fields["node_outcomes"] = {
        k: msgspec.json.decode(encode(v)) for k, v in writer._base_entries["node_outcomes"].items()
    }
    return Checkpoint(**fields)
