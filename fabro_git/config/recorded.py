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
    """The `[run]` table a run's manifest records. It was checked when the run was
    made, but the manifest may be another version's or a hostile fetched run's: a key
    this version does not know is ignored, and a value that does not fit is left out
    (a key of `[run]` whole, an entry of a list such as `hooks` on its own) and named
    in `unreadable`. Nothing here raises."""
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
        if problem is not None and isinstance(value, list):
            entries: list[JsonValue] = []
            for index, entry in enumerate(value):
                problem = _misfit({key: [entry]})
                if problem is None:
                    entries.append(entry)
                else:
                    keys, message = problem
                    unreadable.append(f"run.{key_path([key, f'[{index}]', *keys[2:]])}: {message}")
            kept[key] = entries
        elif problem is not None:
            unreadable.append(f"run.{key_path(problem[0])}: {problem[1]}")
        else:
            kept[key] = value
    return RecordedConfig(msgspec.convert(kept, RunSection), tuple(unreadable))


def _misfit(table: JsonObject) -> tuple[list[str], str] | None:
    """Where and how `table` does not fit `RunSection`, None when it does."""
    try:
        msgspec.convert(table, RunSection)
    except msgspec.ValidationError as exc:
        return described(str(exc), table)
    return None
