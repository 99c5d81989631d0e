"""A run's recorded configuration, read back: the `[run]` table a run's manifest keeps
(`settings["config"]`) as the typed `RunSection`, for the engine and the commands that
act on the run.

It is read with the same types that check a run config file, but not as strictly: the
manifest may have been written by a later version, with keys this one does not know
(ignored, as the types ignore them), or come from a fetched run whose author wrote it
by hand. A value that does not fit is left out and named, so the run goes on without
it and the user is told; nothing here raises.
"""

from __future__ import annotations

import msgspec

from fabro_git.config.run_config import RunSection
from fabro_git.config.toml_source import described, key_path
from fabro_git.jsondata import JsonObject, JsonValue


class RecordedConfig(msgspec.Struct, frozen=True):
    """A run's `[run]` table as its manifest records it (`settings["config"]`), read by
    this version: `run` is what it could read, `unreadable` names what it left out."""

    run: RunSection = msgspec.field(default_factory=RunSection)
    unreadable: tuple[str, ...] = ()


def read_recorded(raw: JsonValue) -> RecordedConfig:
    """`raw`, the `[run]` table a manifest records, as this version reads it. A value
    that does not fit is left out: a key of `[run]` whole, an entry of a list such as
    `hooks` on its own."""
    if raw is None:
        return RecordedConfig()
    if not isinstance(raw, dict):
        return RecordedConfig(unreadable=("run: expected a table",))
    try:
        return RecordedConfig(msgspec.convert(raw, RunSection))
    except msgspec.ValidationError:
        pass
    kept: JsonObject = {}
    unreadable: list[str] = []
    for key, value in raw.items():
        problem = _misfit({key: value})
        if problem is None:
            kept[key] = value
            continue
        where, message = problem
        if not (isinstance(value, list) and len(where) > 1 and where[1].startswith("[")):
            unreadable.append(_words(where, message))
            continue
        # A list of entries (hooks): each entry that fits is kept on its own.
        entries: list[JsonValue] = []
        for index, entry in enumerate(value):
            misfit = _misfit({key: [entry]})
            if misfit is None:
                entries.append(entry)
            else:
                unreadable.append(_words([key, f"[{index}]", *misfit[0][2:]], misfit[1]))
        kept[key] = entries
    try:
        return RecordedConfig(msgspec.convert(kept, RunSection), tuple(unreadable))
    except msgspec.ValidationError as exc:  # not expected: each key fitted on its own
        return RecordedConfig(unreadable=(*unreadable, f"run: {exc}"))


def _words(keys: list[str], message: str) -> str:
    return f"run.{key_path(keys)}: {message}"


def _misfit(table: JsonObject) -> tuple[list[str], str] | None:
    """Where and how `table` does not fit `RunSection`, None when it does."""
    try:
        msgspec.convert(table, RunSection)
    except msgspec.ValidationError as exc:
        return described(str(exc), table)
    return None
