"""A stage's delta looks only at the keys set or removed since its base (`TrackedMap`),
and is still exactly the delta a whole comparison gives: whatever dict method changed
the map, and whoever replaced it."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabro_git.engine.checkpoint import (
    DELTA_MAPS,
    Checkpoint,
    DeltaWriter,
    TrackedMap,
    decode_checkpoint,
    encode,
    read_checkpoint,
)


def test_a_tracked_map_encodes_copies_and_decodes_as_a_dict() -> None:
    tracked = TrackedMap({"b": 1, "a": [1.0, True], "c": {"z": None}})
    plain = dict(tracked)
    assert msgspec.json.encode(tracked) == msgspec.json.encode(plain)
    assert encode(tracked) == encode(plain)
    assert msgspec.msgpack.encode(tracked) == msgspec.msgpack.encode(plain)
    assert encode(Checkpoint(context_values=tracked)) == encode(Checkpoint(context_values=plain))
    for again in (copy.deepcopy(tracked), pickle.loads(pickle.dumps(tracked))):
        assert type(again) is TrackedMap and again == tracked
        again["d"] = 1  # still notes its keys
    # Every way a checkpoint is made gives TrackedMaps, and a TrackedMap given is kept.
    decoded = decode_checkpoint(encode(Checkpoint(node_visits={"a": 1})))
    for checkpoint in (Checkpoint(), Checkpoint(node_visits={"a": 1}), decoded):
        assert all(type(getattr(checkpoint, name)) is TrackedMap for name in DELTA_MAPS)
    assert Checkpoint(context_values=tracked).context_values is tracked


_INT_MAPS = (
    "node_visits",
    "node_retries",
    "loop_failure_signatures",
    "restart_failure_signatures",
    "stage_serials",
)
_keys = st.sampled_from(["a", "b", "c", "internal.x"])
# Values equal in Python but not in JSON (1 == 1.0 == True) must never pass for unchanged.
_any = st.sampled_from([0, 1, 1.0, True, False, "1", "x", None, [1], [1.0], {"k": 1}])
_maps = st.sampled_from(DELTA_MAPS)
_entries = st.lists(st.tuples(_keys, _any), max_size=3)
_change = st.one_of(
    st.tuples(st.just("set"), _maps, _keys, _any),
    st.tuples(st.just("del"), _maps, _keys, st.none()),
    st.tuples(st.just("pop"), _maps, _keys, st.none()),
    st.tuples(st.just("pop_default"), _maps, _keys, st.none()),
    st.tuples(st.just("popitem"), _maps, st.just(""), st.none()),
    st.tuples(st.just("setdefault"), _maps, _keys, _any),
    st.tuples(st.just("update"), _maps, st.just(""), _entries),
    st.tuples(st.just("update_pairs"), _maps, st.just(""), _entries),
    st.tuples(st.just("update_keywords"), _maps, st.just(""), _entries),
    st.tuples(st.just("ior"), _maps, st.just(""), _entries),
    st.tuples(st.just("clear"), _maps, st.just(""), st.none()),
    st.tuples(st.just("replace_plain"), _maps, st.just(""), _entries),
    st.tuples(st.just("replace_tracked"), _maps, st.just(""), _entries),
    st.tuples(st.just("track_elsewhere"), _maps, st.just(""), st.none()),
    st.tuples(st.just("visit"), st.just(""), _keys, st.none()),
    st.tuples(st.just("back"), st.just(""), st.just(""), st.none()),
)


def _value(name: str, value: Any) -> Any:
    """`value` as the map `name` may hold it (its checkpoint must decode)."""
    if name in _INT_MAPS:
        return value if type(value) is int else 2
    if name == "node_outcomes":
        return {"status": "succeeded", "value": value}
    return value


def _change_checkpoint(cp: Checkpoint, change: tuple[str, str, str, Any]) -> None:
    kind, name, key, value = change
    if kind == "visit":
        cp.completed_nodes.append(key)
        return
    if kind == "back":
        del cp.completed_nodes[-1:]  # a checkpoint git refused: the walk goes back
        return
    target: dict[str, Any] = getattr(cp, name)
    if kind in ("set", "setdefault"):
        value = _value(name, value)
    elif value is not None:
        value = [(k, _value(name, v)) for k, v in value]
    if kind == "set":
        target[key] = value
    elif kind == "del" and key in target:
        del target[key]
    elif kind == "pop" and key in target:
        target.pop(key)
    elif kind == "pop_default":
        target.pop(key, None)
    elif kind == "popitem" and target:
        target.popitem()
    elif kind == "setdefault":
        target.setdefault(key, value)
    elif kind == "update":
        target.update(dict(value))
    elif kind == "update_pairs":
        target.update(value)
    elif kind == "update_keywords":
        target.update(**{k.replace(".", "_"): v for k, v in value})
    elif kind == "ior":
        target |= dict(value)
    elif kind == "clear":
        target.clear()
    elif kind == "replace_plain":
        setattr(cp, name, {**target, **dict(value)})
    elif kind == "replace_tracked":
        setattr(cp, name, TrackedMap({**target, **dict(value)}))
    elif kind == "track_elsewhere" and isinstance(target, TrackedMap):
        target.track()  # someone else started noting its keys afresh


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_change, max_size=5), min_size=1, max_size=12))
def test_a_delta_from_the_keys_noted_is_the_delta_of_a_whole_comparison(
    stages: list[list[tuple[str, str, str, Any]]],
) -> None:
    compared_whole: list[str] = []
    compare_whole = DeltaWriter._compare_whole

    def counted(writer: DeltaWriter, name: str, current: dict[str, Any]) -> Any:
        compared_whole.append(name)
        return compare_whole(writer, name, current)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeltaWriter, "_compare_whole", counted)
        _check_stages(stages, compared_whole, compare_whole)


def _check_stages(
    stages: list[list[tuple[str, str, str, Any]]],
    compared_whole: list[str],
    compare_whole: Any,
) -> None:
    files: dict[str, bytes] = {}
    writer = DeltaWriter(full_every=5)
    cp = Checkpoint()
    # The map object of each field whose changes the writer knows (None: it must compare).
    known: dict[str, Any] = {}
    for number, changes in enumerate(stages):
        for change in changes:
            kind, name = change[0], change[1]
            if kind == "track_elsewhere" and getattr(cp, name) is known.get(name):
                known[name] = None
            _change_checkpoint(cp, change)
        compared_whole.clear()
        delta = writer.delta(cp) if number else None
        if delta is not None:
            # Only the maps the writer does not know were compared whole ...
            expected = [name for name in DELTA_MAPS if getattr(cp, name) is not known.get(name)]
            assert compared_whole == expected
            for name in expected:
                if isinstance(getattr(cp, name), TrackedMap):
                    known[name] = getattr(cp, name)
            # ... and every map's delta is what comparing it whole gives.
            for name in DELTA_MAPS:
                changed, gone = compare_whole(writer, name, getattr(cp, name))
                assert getattr(delta, name) == changed
                assert encode(getattr(delta, name)) == encode(changed)
                assert delta.removed.get(name, []) == sorted(gone)
        sha = f"{number:040x}"
        files[sha] = encode(cp if delta is None else delta)
        writer.written(cp, sha, whole=delta is None)
        if delta is None:
            known = {
                name: getattr(cp, name)
                for name in DELTA_MAPS
                if isinstance(getattr(cp, name), TrackedMap)
            }
        back = read_checkpoint(lambda commit, path: files.get(commit), sha)
        assert back is not None
        assert encode(back) == encode(cp)
