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


def texts(value: JsonValue) -> list[str] | None:
    """The strings of a JSON list (a command's argv, a list of globs), None when
    `value` is not a list."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else None


def text_map(value: JsonValue) -> dict[str, str]:
    """The string values of a JSON object (an environment table), {} when `value` is
    not an object."""
    if not isinstance(value, dict):
        return {}
    return {key: item for key, item in value.items() if isinstance(item, str)}


def text(value: JsonValue) -> str | None:
    """`value` when it is a string, else None."""
    return value if isinstance(value, str) else None
