"""A checkpoint's copy of the context is the whole context, copied anew only where it changed."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fabro_git.engine.context import CheckpointCopy, Context, plain

KEYS = st.sampled_from(["a", "b", "c", "internal.retry_count.s1", "response.x"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
OPS = st.one_of(
    st.tuples(st.just("set"), KEYS, VALUES),
    st.tuples(st.just("update"), st.dictionaries(KEYS, VALUES, max_size=3)),
    st.tuples(st.just("remove"), KEYS),
)


def _apply(context: Context, op: tuple[Any, ...]) -> None:
    if op[0] == "set":
        context.set(op[1], op[2])
    elif op[0] == "update":
        context.update(op[1])
    else:
        context.remove(op[1])


@given(
    start=st.dictionaries(KEYS, VALUES, max_size=4),
    stages=st.lists(st.lists(OPS, max_size=4), min_size=1, max_size=6),
)
def test_each_copy_is_the_whole_context_and_untouched_keys_keep_their_objects(
    start: dict[str, Any], stages: list[list[tuple[Any, ...]]]
) -> None:
    context = Context(start)
    copies = CheckpointCopy()
    held = copies.of(context, {})
    assert held == plain(dict(start))
    for ops in stages:
        touched = set()
        for op in ops:
            _apply(context, op)
            touched |= set(op[1]) if op[0] == "update" else {op[1]}
        before = dict(held)
        held = copies.of(context, held)
        assert held == plain(context.shared())
        for key in before.keys() - touched:
            assert held[key] is before[key]


def test_a_copy_not_held_any_more_is_made_whole_again() -> None:
    context = Context({"a": [1], "b": 2})
    copies = CheckpointCopy()
    held = copies.of(context, {})
    context.set("b", 3)
    # Something else replaced the checkpoint's dict (a resume, a rollback): copy all.
    replaced = {"a": "stale"}
    fresh = copies.of(context, replaced)
    assert fresh == {"a": [1], "b": 3}
    assert fresh is not replaced and fresh is not held


def test_another_context_is_copied_whole() -> None:
    first, second = Context({"a": 1}), Context({"a": 1, "z": "only here"})
    copies = CheckpointCopy()
    held = copies.of(first, {})
    second.take_changes()  # as if it had been copied before
    assert copies.of(second, held) == {"a": 1, "z": "only here"}
