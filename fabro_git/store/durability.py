"""Which of our writes are flushed to disk: the ones git itself would flush.

git decides what to `fsync` from `core.fsync`, a comma-separated list of components.
Its default flushes packs and their metadata only: neither loose objects nor ref
updates, so a commit made by `git commit` can be lost (never corrupted: the file is
renamed into place whole) in an unclean system shutdown. The store writes the same
kinds of files git does, so it asks the same question of the same setting, read once
per process with `git config`, and pays for a flush only where the user asked git to.

How a value is read, as git 2.36+ reads it: the set starts from the platform default;
`none` empties it; a name adds its components and `-name` removes them, additions
winning over removals wherever the two overlap (`committed,-reference` still flushes
refs); an unknown name is ignored (git warns); an empty value is the default. The
deprecated `core.fsyncObjectFiles = true` also flushes loose objects, as git does.
`core.fsyncMethod` is not read: a flush here is always a full `fsync`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from fabro_git.store._gitcli import config_entries, start_git

LOOSE_OBJECT = "loose-object"
PACK = "pack"
PACK_METADATA = "pack-metadata"
COMMIT_GRAPH = "commit-graph"
INDEX = "index"
REFERENCE = "reference"

_OBJECTS = frozenset({LOOSE_OBJECT, PACK})
_DERIVED = frozenset({PACK_METADATA, COMMIT_GRAPH})
_COMMITTED = _OBJECTS | {REFERENCE}
_ADDED = _COMMITTED | {INDEX}
_ALL = _OBJECTS | _DERIVED | {INDEX, REFERENCE}
# git's FSYNC_COMPONENTS_DEFAULT: objects and derived metadata, less loose objects.
DEFAULT = (_OBJECTS | _DERIVED) - {LOOSE_OBJECT}

_NAMES: dict[str, frozenset[str]] = {
    LOOSE_OBJECT: frozenset({LOOSE_OBJECT}),
    PACK: frozenset({PACK}),
    PACK_METADATA: frozenset({PACK_METADATA}),
    COMMIT_GRAPH: frozenset({COMMIT_GRAPH}),
    INDEX: frozenset({INDEX}),
    REFERENCE: frozenset({REFERENCE}),
    "objects": _OBJECTS,
    "derived-metadata": _DERIVED,
    "committed": _COMMITTED,
    "added": _ADDED,
    "all": _ALL,
}
_TRUE = {"true", "yes", "on", "1", ""}


def parse_fsync(value: str | None) -> frozenset[str]:
    """The components a `core.fsync` value flushes (None: the setting is absent)."""
    if value is None or not value.strip():
        return DEFAULT
    current: frozenset[str] = DEFAULT
    added: set[str] = set()
    removed: set[str] = set()
    for raw in value.split(","):
        word = raw.strip()
        if word == "none":
            current = frozenset()
            continue
        negate = word.startswith("-")
        components = _NAMES.get(word[1:] if negate else word)
        if components is None:
            continue
        (removed if negate else added).update(components)
    return frozenset((current - removed) | added)


class Durability(msgspec.Struct, frozen=True):
    """What the store flushes before renaming a file into place."""

    refs: bool
    loose_objects: bool
    index: bool

    @classmethod
    def from_config(cls, fsync: str | None, fsync_object_files: str | None) -> Durability:
        components = parse_fsync(fsync)
        legacy = fsync_object_files is not None and fsync_object_files.strip().lower() in _TRUE
        return cls(
            refs=REFERENCE in components,
            loose_objects=LOOSE_OBJECT in components or legacy,
            index=INDEX in components,
        )


def prefetch(root: Path, settings: Callable[[], Mapping[str, str]] | None = None) -> None:
    """Start reading the repository's setting now (a git process that runs while the
    caller works), for `durability` to collect when it is first asked. `settings`: the
    repository's whole configuration, read already for other questions too
    (`GitRepo.settings_later`), answers instead of a git process of its own."""
    if root not in _pending and root not in _known:
        _pending[root] = settings if settings is not None else _read_later(root)


def durability(root: Path) -> Durability:
    """The repository's setting, from one `git config` call per process."""
    known = _known.get(root)
    if known is not None:
        return known
    waiter = _pending.pop(root, None) or _read_later(root)
    values = waiter()
    found = Durability.from_config(values.get("core.fsync"), values.get("core.fsyncobjectfiles"))
    _known[root] = found
    return found


def _read_later(root: Path) -> Callable[[], Mapping[str, str]]:
    wait = start_git(_ARGS, cwd=root)
    return lambda: config_entries(wait())


_ARGS = ("config", "--null", "--get-regexp", r"^core\.fsync(objectfiles)?$")
_known: dict[Path, Durability] = {}
_pending: dict[Path, Callable[[], Mapping[str, str]]] = {}
