"""Stage checkpoints go to git as deltas on a complete one, so a stage's checkpoint costs
the same at stage 110 as at stage 10, and reading any of them back gives exactly the
checkpoint the engine meant (resume depends on it)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import git, read_checkpoint, run_fabro, write_workflow
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fabro_git.engine.checkpoint import (
    FULL_EVERY,
    Checkpoint,
    DeltaWriter,
    decode_checkpoint,
    encode,
)
from fabro_git.engine.checkpoint import (
    read_checkpoint as engine_read_checkpoint,
)

# Values that are equal in Python but not in JSON (1 == 1.0 == True) must never be
# taken for unchanged.
_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, 1, 1.0, 0.0, "1", "", "x"]),
        st.text(max_size=5),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_keys = st.sampled_from(["a", "b", "internal.x"])
_maps = st.sampled_from(
    ["node_visits", "node_retries", "node_outcomes", "context_values", "loop_failure_signatures"]
)
_step = st.one_of(
    st.tuples(st.just("set"), _maps, _keys, _values),
    st.tuples(st.just("del"), _maps, _keys, st.none()),
    st.tuples(st.just("visit"), st.just(""), _keys, st.none()),
    st.tuples(st.just("back"), st.just(""), st.just(""), st.none()),
    st.tuples(st.just("status"), st.just(""), _keys, st.none()),
)


def _apply(cp: Checkpoint, step: tuple[str, str, str, Any]) -> None:
    kind, name, key, value = step
    if kind == "set":
        if name in ("node_visits", "node_retries", "loop_failure_signatures"):
            value = len(key) if not isinstance(value, int) or isinstance(value, bool) else value
            value = int(value)
        elif name == "node_outcomes":
            value = {"status": "succeeded", "value": value}
        getattr(cp, name)[key] = value
    elif kind == "del":
        getattr(cp, name).pop(key, None)
    elif kind == "visit":
        cp.completed_nodes.append(key)
        cp.current_node = key
    elif kind == "back":
        del cp.completed_nodes[-1:]  # a checkpoint git refused: the walk goes back
    else:
        cp.status = key


@settings(max_examples=200, deadline=None)
@example([[("set", "context_values", "a", 1)], [("set", "context_values", "a", True)]])
@example([[("set", "node_outcomes", "a", [1])], [("set", "node_outcomes", "a", [1.0])]])
@given(st.lists(st.lists(_step, max_size=4), min_size=1, max_size=12))
def test_every_checkpoint_reads_back_exactly_as_it_was_meant(stages: list[list[Any]]) -> None:
    files: dict[str, bytes] = {}
    writer = DeltaWriter(full_every=4)
    cp = Checkpoint(status="running")
    for number, steps in enumerate(stages):
        for step in steps:
            _apply(cp, step)
        delta = writer.delta(cp) if number else None
        sha = f"{number:040x}"
        files[sha] = encode(cp if delta is None else delta)
        writer.written(cp, sha, whole=delta is None)
        back = engine_read_checkpoint(lambda commit, path: files.get(commit), sha)
        assert back is not None
        assert encode(back) == encode(cp)


def test_a_delta_is_never_read_as_a_complete_checkpoint() -> None:
    files: dict[str, bytes] = {}
    writer = DeltaWriter()
    cp = Checkpoint(completed_nodes=["start"], node_visits={"start": 1})
    files["a" * 40] = encode(cp)
    writer.written(cp, "a" * 40, whole=True)
    cp.completed_nodes.append("work")
    delta = writer.delta(cp)
    assert delta is not None
    with pytest.raises(msgspec.DecodeError, match="delta"):
        decode_checkpoint(encode(delta))


def _pipeline(stages: int) -> str:
    lines = ["digraph Long {", "  start [shape=Mdiamond]", "  exit [shape=Msquare]"]
    prev = "start"
    for i in range(stages):
        lines.append(f'  s{i} [shape=parallelogram, script="echo {i} > out.txt"]')
        lines.append(f"  {prev} -> s{i}")
        prev = f"s{i}"
    lines += [f"  {prev} -> exit", "}"]
    return "\n".join(lines) + "\n"


def test_a_stage_checkpoint_stays_the_same_size_as_the_run_grows(repo: Path) -> None:
    stages = 120
    wf = write_workflow(repo, _pipeline(stages), "long.fabro")
    proc = run_fabro("run", str(wf), "--json", cwd=repo, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    meta = f"refs/fabro/meta/{run_id}"
    commits = git(repo, "log", "--format=%H %s", "--reverse", meta).splitlines()
    order = {line.split(" ", 1)[0]: n for n, line in enumerate(commits)}
    # By how many snapshots a delta is from its base: (stage, size of checkpoint.json).
    deltas: dict[int, list[tuple[int, int]]] = {}
    for line in commits:
        sha, subject = line.split(" ", 1)
        node = subject.removeprefix("checkpoint ").split("@")[0]
        if not (subject.startswith("checkpoint s") and node[1:].isdigit()):
            continue
        stage = int(node[1:])
        data = git(repo, "show", f"{sha}:checkpoint.json")
        base = json.loads(data).get("delta_of")
        if base is not None:
            deltas.setdefault(order[sha] - order[base], []).append((stage, len(data)))
        # Every checkpoint, delta or not, reads back complete: all stages up to this one.
        cp = read_checkpoint(repo, sha)
        assert cp["completed_nodes"] == ["start", *(f"s{i}" for i in range(stage + 1))]
        assert cp["node_outcomes"][f"s{stage}"]["status"] == "succeeded"
        assert len(cp["node_visits"]) == stage + 2
    # A delta holds what changed since its base, which is never far back: the same
    # distance from the base costs the same early and late in the run (node names a
    # digit longer aside), and no delta carries the run's whole history.
    compared = 0
    for sizes in deltas.values():
        (_, first), (last_stage, last) = min(sizes), max(sizes)
        if last_stage >= stages - 40:
            assert last <= first + 300, sizes
            compared += 1
    assert compared >= 5, deltas
    assert max(distance for distance in deltas) < 60

    # A finished run's checkpoint is complete, for anything that reads it with git alone.
    final = json.loads(git(repo, "show", f"{meta}:checkpoint.json"))
    assert "delta_of" not in final
    assert len(final["completed_nodes"]) == stages + 2
    # And `git fabro dump` writes every checkpoint complete.
    out = repo.parent / "dump"
    dumped = run_fabro("dump", run_id, "-o", str(out), cwd=repo)
    assert dumped.returncode == 0, dumped.stderr
    # s1, s10-s19 and s100-s119 (of 120 stages).
    paths = sorted((out / "checkpoints").glob("*-s1*@1.json"))
    assert len(paths) == 1 + 10 + 20, [p.name for p in paths]
    for path in paths:
        checkpoint = json.loads(path.read_text())
        stage = int(path.stem.split("-s", 1)[1].split("@")[0])
        assert "delta_of" not in checkpoint
        assert len(checkpoint["completed_nodes"]) == stage + 2


class _FixedInterval(DeltaWriter):
    """A complete checkpoint every `full_every` snapshots, however long the run."""

    def _interval(self, cp: Checkpoint) -> int:
        return self.full_every


def _written_sizes(writer: DeltaWriter, stages: int) -> tuple[list[int], list[int]]:
    """The size of each stage's `checkpoint.json` when every stage adds one record, and
    the stages written complete."""
    cp = Checkpoint(status="running")
    sizes, whole = [], []
    for number in range(stages):
        node = f"stage{number}"
        cp.completed_nodes.append(node)
        cp.node_visits[node] = 1
        cp.node_outcomes[node] = {"status": "succeeded", "notes": "x" * 300}
        delta = writer.delta(cp) if number else None
        sizes.append(len(encode(cp if delta is None else delta)))
        if delta is None:
            whole.append(number)
        writer.written(cp, f"{number:040x}", whole=delta is None)
    return sizes, whole


def test_complete_checkpoints_come_as_often_as_keeps_a_stages_share_least() -> None:
    # A run of 50 stages: a complete checkpoint every 8 to 10 stages, not deltas that
    # grow to the whole checkpoint; what a stage writes, on average, is a third of it.
    sizes, whole = _written_sizes(DeltaWriter(), 50)
    fixed, _ = _written_sizes(_FixedInterval(), 50)
    gaps = [b - a for a, b in itertools.pairwise(whole)]
    assert gaps and all(8 <= gap <= 10 for gap in gaps), whole
    assert sum(sizes) * 3 < sum(fixed), (sum(sizes), sum(fixed))
    # A long run: the interval grows with it, up to FULL_EVERY.
    writer = DeltaWriter()
    intervals = [
        writer._interval(Checkpoint(completed_nodes=[f"s{i}" for i in range(n)]))
        for n in (50, 200, 800, 1250, 5000)
    ]
    assert intervals == [10, 20, 40, FULL_EVERY, FULL_EVERY]
