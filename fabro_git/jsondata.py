"""JSON-shaped data by type: the one `JsonValue` alias for a value that really is any
JSON (context values, a manifest's settings, an event's properties), and the helpers
that step into it where a reader expects an object.

Type checkers see the recursive union. At run time the alias is `Any`: msgspec on
Python 3.11 cannot resolve a recursive alias written with forward references, and a
field typed `Any` decodes exactly the JSON values the union names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    JsonValue: TypeAlias = (
        str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None
    )
else:
    JsonValue = Any

# A JSON object: a manifest's settings, a context snapshot, an event's properties.
JsonObject: TypeAlias = dict[str, JsonValue]

_EMPTY: Mapping[str, JsonValue] = {}


def section(value: Mapping[str, JsonValue] | None, key: str) -> Mapping[str, JsonValue]:
    """The object at `value[key]`, or an empty one where there is none (or `value` is
    None): for reading nested settings such as `config.git.author`."""
    found = value.get(key) if value is not None else None
    return found if isinstance(found, dict) else _EMPTY
