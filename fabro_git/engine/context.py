"""The run context: the key-value store that carries data between stages.

Values are JSON-shaped. Parallel branches get a deep copy, so they cannot see or disturb
each other; only a stage's declared `context_updates` ever flow back.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

# Keys the engine sets on every stage: never part of what a branch or child "produced".
_BOOKKEEPING = ("internal.", "current_node", "outcome", "preferred_label", "failure_")


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

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value

    def update(self, updates: Mapping[str, Any]) -> None:
        self._values.update(updates)

    def remove(self, key: str) -> None:
        self._values.pop(key, None)

    def fork(self) -> Context:
        return Context(copy.deepcopy(self._values))

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self._values)

    def shared(self) -> dict[str, Any]:
        """A new dict holding the same value objects: for a caller that copies or
        serialises them itself and changes nothing."""
        return dict(self._values)
