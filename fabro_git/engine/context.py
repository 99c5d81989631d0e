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

import msgspec

from fabro_git.engine.checkpoint import TrackedMap
from fabro_git.jsondata import JsonObject, JsonValue

# The one list of context keys by who reads them (prefixes, for `str.startswith`).
# The engine's own records of the walk (`failure_signature`, `failure_class`, ...).
ENGINE_KEYS = ("internal.", "current_node", "failure_")
# Set on every stage: never part of what a branch or child "produced".
_BOOKKEEPING = (*ENGINE_KEYS, "outcome", "preferred_label")
# Not a stage's own to set by what it says (a model's reply, a `status.json`): the
# engine's records of the walk (`current_node` is where a resume starts), its
# bookkeeping, the graph's attributes, the branch results a fan-in takes its files
# from, and the replies of stages.
NOT_SAID_BY_A_STAGE = (
    *_BOOKKEEPING,
    "graph.",
    "parallel.",
    "response.",
    "last_stage",
    "last_response",
)


# How long a key and how deep a value a stage's words may give: a key names a file when
# its value is offloaded, and the context is copied and walked recursively.
SAID_KEY_LIMIT = 200
SAID_DEPTH_LIMIT = 64


def said_by_a_stage(updates: Mapping[str, JsonValue]) -> tuple[JsonObject, list[str]]:
    """The `context_updates` a stage's words may set, and the keys left out (shown cut
    to their first 80 characters)."""
    kept = {
        k: v
        for k, v in updates.items()
        if not k.startswith(NOT_SAID_BY_A_STAGE)
        and len(k) <= SAID_KEY_LIMIT
        and _depth_within(v, SAID_DEPTH_LIMIT)
    }
    return kept, sorted(k[:80] for k in updates if k not in kept)


def _depth_within(value: JsonValue, limit: int) -> bool:
    """Whether `value` nests at most `limit` lists and objects deep (walked without
    recursion: the point is a value too deep for it)."""
    pending: list[tuple[JsonValue, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            if depth >= limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return True


# Left out of a model's preamble: the engine's records, the graph's attributes, and
# stage outputs the preamble gives in words under each stage.
HIDDEN_FROM_PROMPT = (*ENGINE_KEYS, "graph.", "response.", "command.", "human.gate")


def context_delta(before: Mapping[str, JsonValue], after: Mapping[str, JsonValue]) -> JsonObject:
    """The keys a parallel branch or a child workflow set or changed, bookkeeping aside."""
    return {
        k: v
        for k, v in after.items()
        if not k.startswith(_BOOKKEEPING) and (k not in before or before[k] != v)
    }


class Context(Mapping[str, JsonValue]):
    def __init__(self, values: Mapping[str, JsonValue] | None = None) -> None:
        self._values: JsonObject = dict(values or {})
        # Keys set or removed since `take_changes`; None: every key, as nothing was taken.
        self._changed: set[str] | None = None

    def __getitem__(self, key: str) -> JsonValue:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def text(self, key: str) -> str | None:
        """The value at `key` when it is a string (the engine's own keys, a label)."""
        value = self._values.get(key)
        return value if isinstance(value, str) else None

    def set(self, key: str, value: JsonValue) -> None:
        self._values[key] = value
        if self._changed is not None:
            self._changed.add(key)

    def update(self, updates: Mapping[str, JsonValue]) -> None:
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

    def snapshot(self) -> JsonObject:
        return copy.deepcopy(self._values)

    def shared(self) -> JsonObject:
        """A new dict holding the same value objects: for a caller that copies or
        serialises them itself and changes nothing."""
        return dict(self._values)


def plain(value: object) -> JsonValue:
    """`value` as plain JSON data, a fresh copy (anything else becomes its string form)."""
    decoded: JsonValue = msgspec.json.decode(msgspec.json.encode(value, enc_hook=str))
    return decoded


def plain_object(values: Mapping[str, object]) -> JsonObject:
    """`values` as a plain JSON object, a fresh copy (see `plain`)."""
    decoded: JsonObject = msgspec.json.decode(
        msgspec.json.encode(dict(values), enc_hook=str), type=dict[str, JsonValue]
    )
    return decoded


class CheckpointCopy:
    """The context as a run's checkpoints hold it: plain JSON data, a copy.

    Only the keys set or removed since the last checkpoint are copied again; the others
    stay the very objects the last checkpoint held, which also lets its delta tell them
    unchanged in C. The context holds a key for every node of the run, so copying it
    whole made every checkpoint cost O(run).
    """

    def __init__(self) -> None:
        self._last: tuple[Context, JsonObject] | None = None

    def of(self, context: Context, held: JsonObject) -> JsonObject:
        """The copy of `context` for a checkpoint whose last one held `held`."""
        changes = context.take_changes()
        last = self._last
        if changes is None or last is None or last[0] is not context or last[1] is not held:
            values: JsonObject = TrackedMap(plain_object(context.shared()))
        else:
            values = held
            for key in changes:
                if key in context:
                    values[key] = plain(context[key])
                else:
                    values.pop(key, None)
        self._last = (context, values)
        return values
