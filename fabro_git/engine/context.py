"""The run context: the key-value store that carries data between stages.

Values are JSON-shaped. Parallel branches get a deep copy, so they cannot see or disturb
each other; only a stage's declared `context_updates` ever flow back.

A value is not changed in place once set: it is set again. The context notes which keys
were set or removed, so a checkpoint copies those alone, not a context that holds a key
for every node of the run.
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from fabro_git.engine.checkpoint import TrackedMap

# The one list of context keys by who reads them (prefixes, for `str.startswith`).
# The engine's own records of the walk (`failure_signature`, `failure_class`, ...).
ENGINE_KEYS = ("internal.", "current_node", "failure_")
# Set on every stage: never part of what a branch or child "produced".
_BOOKKEEPING = (*ENGINE_KEYS, "outcome", "preferred_label")
# Left out of a model's preamble: the engine's records, the graph's attributes, and
# stage outputs the preamble gives in words under each stage.
HIDDEN_FROM_PROMPT = (*ENGINE_KEYS, "graph.", "response.", "command.", "human.gate")


def context_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a parallel branch or a child workflow set or changed, bookkeeping aside."""
    return {
        k: v
        for k, v in after.items()
        if not k.startswith(_BOOKKEEPING) and (k not in before or before[k] != v)
    }


class Context(Mapping[str, Any]):
    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})
        # Keys set or removed since `take_changes`; None: every key, as nothing was taken.
        self._changed: set[str] | None = None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value
        if self._changed is not None:
            self._changed.add(key)

    def update(self, updates: Mapping[str, Any]) -> None:
        self._values.update(updates)
        if self._changed is not None:
            self._changed.update(updates.keys())

    def remove(self, key: str) -> None:
        self._values.pop(key, None)
        if self._changed is not None:
            self._changed.add(key)

    def take_changes(self) -> builtins.set[str] | None:
        """The keys set or removed since the last call (None at the first: all of them)."""
        changed, self._changed = self._changed, set()
        return changed

    def fork(self) -> Context:
        return Context(copy.deepcopy(self._values))

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self._values)

    def shared(self) -> dict[str, Any]:
        """A new dict holding the same value objects: for a caller that copies or
        serialises them itself and changes nothing."""
        return dict(self._values)


def plain(value: Any) -> Any:
    """`value` as plain JSON data, a fresh copy (anything else becomes its string form)."""
    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=str))


class CheckpointCopy:
    """The context as a run's checkpoints hold it: plain JSON data, a copy.

    Only the keys set or removed since the last checkpoint are copied again; the others
    stay the very objects the last checkpoint held, which also lets its delta tell them
    unchanged in C. The context holds a key for every node of the run, so copying it
    whole made every checkpoint cost O(run).
    """

    def __init__(self) -> None:
        self._last: tuple[Context, dict[str, Any]] | None = None

    def of(self, context: Context, held: dict[str, Any]) -> dict[str, Any]:
        """The copy of `context` for a checkpoint whose last one held `held`."""
        changes = context.take_changes()
        last = self._last
        if changes is None or last is None or last[0] is not context or last[1] is not held:
            values: dict[str, Any] = TrackedMap(plain(context.shared()))
        else:
            values = held
            for key in changes:
                if key in context:
                    values[key] = plain(context[key])
                else:
                    values.pop(key, None)
        self._last = (context, values)
        return values
