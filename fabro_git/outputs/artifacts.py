"""Large context values live in files: the context keeps a `file://` pointer to them.

A value whose JSON form is over OFFLOAD_THRESHOLD bytes would be copied into every
checkpoint that follows, every `stage.completed` event and every preamble; instead it is
written once to the run's artifact store and the context holds
`file://<scratch>/artifacts/values/<key>.json`. The scratch copy is the live one that
stages and people read; the durable copy is `artifacts/<key>.json` on the meta ref,
written by the checkpoint after the stage. A resume (in this clone or another) writes
the meta ref's copies back into its own scratch dir and points the context at them.

The store holds one file per key, its current value: a later stage that sets the same
key replaces the file, and a file no context value or stage record points to any more is
removed at the next checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec

# Bytes of a value's JSON form above which it is offloaded (decimal kilobytes, as the
# command output limits are).
OFFLOAD_THRESHOLD = 100_000

POINTER_PREFIX = "file://"
_VALUES = ("artifacts", "values")


def artifact_name(key: str, tag: str | None = None) -> str:
    """A file name for `key`, safe on every file system and in a git tree: characters
    other than letters, digits and `-_.` are %-escaped, and a leading dot too. `tag`
    tells apart the same key set by parallel branches."""
    name = quote(key, safe="-_.")
    if tag:
        name = f"{name}@{quote(tag, safe='-_.')}"
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


def encode_value(value: Any) -> bytes:
    """A context value's serialised JSON form (anything else becomes its string form)."""
    return msgspec.json.encode(value, enc_hook=str)


def pointer_name(value: Any) -> str | None:
    """The artifact name a `file://` pointer names, whichever scratch dir it points
    into; None for any other value."""
    if not isinstance(value, str) or not value.startswith(POINTER_PREFIX):
        return None
    path = Path(value[len(POINTER_PREFIX) :])
    if path.suffix != ".json" or path.parent.parts[-2:] != _VALUES:
        return None
    return path.stem


def pointer_path(value: Any) -> Path | None:
    """The file a `file://` pointer names; None for any other value."""
    if pointer_name(value) is None:
        return None
    return Path(str(value)[len(POINTER_PREFIX) :])


def resolved(value: Any) -> Any:
    """What a context value stands for: an offloaded value read back from the file its
    `file://` pointer names, any other value as it is. None when that file cannot be
    read (a pointer from another machine's scratch dir, say)."""
    path = pointer_path(value)
    if path is None:
        return value
    try:
        return msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None


class ArtifactStore:
    """One run's offloaded values in its scratch dir: writes, reads and clean-up."""

    def __init__(self, scratch: Path) -> None:
        self.root = scratch.joinpath(*_VALUES)

    def path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def pointer(self, name: str) -> str:
        return f"{POINTER_PREFIX}{self.path(name)}"

    def offload(
        self, updates: Mapping[str, Any], *, tag: str | None = None
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        """`updates` with every value over the threshold replaced by a pointer, and the
        files written for them, by name (a file whose bytes did not change is left alone
        and not returned)."""
        kept: dict[str, Any] = {}
        written: dict[str, bytes] = {}
        for key, value in updates.items():
            data = encode_value(value)
            if len(data) <= OFFLOAD_THRESHOLD:
                kept[key] = value
                continue
            name = artifact_name(key, tag)
            if self._write(name, data):
                written[name] = data
            kept[key] = self.pointer(name)
        return kept, written

    def read(self, pointer: str) -> Any:
        """The value a pointer stands for. FileNotFoundError when it is gone."""
        path = pointer_path(pointer)
        if path is None:
            raise ValueError(f"not an artifact pointer: {pointer[:80]!r}")
        return msgspec.json.decode(path.read_bytes())

    def names(self) -> set[str]:
        if not self.root.is_dir():
            return set()
        return {p.stem for p in self.root.glob("*.json")}

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def prune(self, keep: Iterable[str]) -> list[str]:
        """Remove the files not named in `keep`; returns the names removed."""
        gone = sorted(self.names() - set(keep))
        for name in gone:
            self.remove(name)
        return gone

    def materialise(self, files: Mapping[str, bytes]) -> None:
        """Make the store hold exactly `files` (name -> JSON bytes), the meta ref's copies
        on resume: what git holds is the truth, whatever a cut-off stage left here."""
        for name, data in files.items():
            self._write(name, data)
        self.prune(files)

    def repoint(self, values: dict[str, Any]) -> None:
        """Point every pointer in `values`, nested ones too, into this store (a resume in
        another clone, or another scratch dir, finds pointers into the old one)."""
        for key, value in values.items():
            values[key] = self._repointed(value)

    def _repointed(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self._repointed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._repointed(v) for v in value]
        name = pointer_name(value)
        return value if name is None else self.pointer(name)

    def _write(self, name: str, data: bytes) -> bool:
        path = self.path(name)
        try:
            if path.read_bytes() == data:
                return False
        except FileNotFoundError:
            pass
        from fabro_git.config.locations import make_private_dir, open_private

        make_private_dir(self.root)
        temp = path.with_name(f".{path.name}.tmp")
        fd = open_private(temp, os.O_WRONLY | os.O_TRUNC)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temp, path)
        return True


def referenced_names(
    context_values: Mapping[str, Any], records: Iterable[Mapping[str, Any]]
) -> set[str]:
    """The artifacts a checkpoint points to, from its context and its stage records,
    nested values included (a fan-in's `parallel.results` holds its branches' updates)."""
    names: set[str] = set()
    pending: list[Any] = [dict(context_values), *(r.get("context_updates") for r in records)]
    while pending:
        value = pending.pop()
        if isinstance(value, Mapping):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        else:
            name = pointer_name(value)
            if name is not None:
                names.add(name)
    return names
