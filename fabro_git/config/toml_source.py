"""Where a mistake stands in a TOML file, and how it reads: tomllib tells a parse error's
position in its own words and msgspec a wrong value's key path, while a user wants the
file's line and plain words (`run.hooks[0].event: unknown key`). tomllib keeps no
lines, so a key's line is found by scanning the text for its table header and key.

A key the schema does not name is refused here, by `convert`, and not by the schema's
types: the same types read a run's recorded configuration, which a later version may
have written with keys this one does not know. A typo is a mistake of a file a person
wrote; a stored record from a newer version is not.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import msgspec

from fabro_git.errors import SourceError

_PATH_RE = re.compile(r"^(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_MISSING_RE = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")
_EXPECTED_RE = re.compile(r"^Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`$")


_T = TypeVar("_T")


def convert(data: Mapping[str, object], schema: type[_T], path: Path, text: str) -> _T:
    """`data` read from the TOML file `path` (its `text`) as `schema`, a key the schema
    does not name refused as a value that does not fit is."""
    unknown = unknown_key(data, msgspec.inspect.type_info(schema))
    if unknown is not None:
        raise _refuse(unknown, "unknown key", path, text, hint=_UNKNOWN_HINT)
    try:
        return msgspec.convert(data, schema)
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc), path, text, data) from None


def unknown_key(value: object, kind: msgspec.inspect.Type) -> list[str] | None:
    """The key path of the first key in `value` that `kind` does not name, in the
    file's order; None when there is none. A value of another shape than `kind` is
    left to `msgspec.convert` to refuse."""
    if isinstance(kind, msgspec.inspect.Metadata):
        return unknown_key(value, kind.type)
    if isinstance(kind, msgspec.inspect.UnionType):
        for member in kind.types:
            found = unknown_key(value, member)
            if found is not None:
                return found
        return None
    items: list[tuple[str, object, msgspec.inspect.Type]] = []
    if isinstance(kind, msgspec.inspect.StructType) and isinstance(value, dict):
        fields = {field.encode_name: field.type for field in kind.fields}
        for key, item in value.items():
            if key not in fields:
                return [str(key)]
            items.append((str(key), item, fields[key]))
    elif isinstance(kind, msgspec.inspect.DictType) and isinstance(value, dict):
        items = [(str(key), item, kind.value_type) for key, item in value.items()]
    elif isinstance(kind, msgspec.inspect.ListType) and isinstance(value, list):
        items = [(f"[{i}]", item, kind.item_type) for i, item in enumerate(value)]
    for key, item, item_kind in items:
        found = unknown_key(item, item_kind)
        if found is not None:
            return [key, *found]
    return None


def _name_dict_keys(keys: list[str], data: object) -> list[str]:
    """msgspec writes a table's value as `[...]`; name the key whose value is not a
    string (every free-form table of the schema maps names to strings)."""
    out: list[str] = []
    node = data
    for key in keys:
        if key == "[...]" and isinstance(node, dict):
            bad = [k for k, v in node.items() if not isinstance(v, str)]
            if not bad:
                return out
            key = str(bad[0])
        out.append(key)
        if key.startswith("[") and isinstance(node, list):
            index = int(key[1:-1])
            node = node[index] if index < len(node) else None
        elif isinstance(node, dict):
            node = node.get(key)
    return out


def validation_error(raw: str, path: Path, text: str, data: object) -> SourceError:
    keys, message = described(raw, data)
    return _refuse(keys, message, path, text, hint=None)


def described(raw: str, data: object) -> tuple[list[str], str]:
    """msgspec's message `raw` about `data` in a user's words: the key path of the
    value that does not fit, and what is wrong with it."""
    match = _PATH_RE.match(raw)
    what, where = (match["what"], match["path"]) if match else (raw, "")
    keys = _name_dict_keys([k for k in re.split(r"\.(?![^\[]*\])|(?=\[)", where) if k], data)
    missing = _MISSING_RE.match(what)
    expected = _EXPECTED_RE.match(what)
    if missing:
        keys.append(missing["key"])
        message = "required key is missing"
    elif expected:
        message = f"expected {_type_words(expected['want'])}, got {_type_words(expected['got'])}"
    else:
        message = what[:1].lower() + what[1:]
    return keys, message


_UNKNOWN_HINT = "see `man git-fabro` (RUN CONFIGURATION) for the keys a run config takes"


def _refuse(
    keys: list[str], message: str, path: Path, text: str, *, hint: str | None
) -> SourceError:
    where = key_path(keys) or "(top level)"
    return SourceError(f"{where}: {message}", path=path, line=find_line(text, keys), hint=hint)


def key_path(keys: list[str]) -> str:
    """run.hooks[0].event from ["run", "hooks", "[0]", "event"]."""
    return "".join(k if k.startswith("[") or i == 0 else "." + k for i, k in enumerate(keys))


_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "array": "a list",
    "object": "a table",
    "null": "nothing",
}


def _type_words(name: str) -> str:
    parts = [p.strip() for p in name.split("|")]
    words = [_TYPE_WORDS.get(p, p) for p in parts if p != "null"] or ["nothing"]
    return " or ".join(words)


def toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> SourceError:
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match is None:
        match = re.search(r"\s*\(at end of document\)$", message)
        line = column = None
        if match is not None:
            text = path.read_text(encoding="utf-8", errors="replace")
            line = text.count("\n") + 1
    else:
        line, column = int(match[1]), int(match[2])
    detail = message[: match.start()] if match else message
    return SourceError(f"invalid TOML: {detail}", path=path, line=line, column=column)


def line_of(path: Path, keys: list[str]) -> int | None:
    """The line of `path` that sets the key path `keys`, for a message about it."""
    try:
        return find_line(path.read_text(encoding="utf-8"), keys)
    except (OSError, UnicodeDecodeError):
        return None


def find_line(text: str, keys: list[str]) -> int | None:
    """The line that sets `keys` (a key path such as run.hooks[1].event), found by
    scanning for its table header and then the key; None when it cannot be told."""
    # A key inside an inline table or array is not on a line of its own: fall back to
    # the line of the nearest enclosing key that is.
    for end in range(len(keys), 0, -1):
        found = _scan_for(text, keys[:end])
        if found is None and any(k.startswith("[") for k in keys[:end]):
            found = _scan_for(text, [k for k in keys[:end] if not k.startswith("[")], indexed=False)
        if found is not None:
            return found
    return None


_HEADER_RE = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_.\-\"' ]+?)\s*=")


def _scan_for(text: str, keys: list[str], *, indexed: bool = True) -> int | None:
    if not keys:
        return None
    current: list[str] = []
    seen: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER_RE.match(line)
        if header is not None:
            current = [part.strip().strip("\"'") for part in header[2].split(".")]
            if header[1] == "[[" and indexed:
                index = seen.get(tuple(current), -1) + 1
                seen[tuple(current)] = index
                current = [*current, f"[{index}]"]
            if current == keys:
                return number
            continue
        key = _KEY_RE.match(line)
        if key is None:
            continue
        full = current + [part.strip().strip("\"'") for part in key[1].split(".")]
        if full[: len(keys)] == keys:
            return number
    return None
