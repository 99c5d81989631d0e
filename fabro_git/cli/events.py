"""`git fabro events`: the event envelopes of one run, several, or every run, as NDJSON.

Each line is exactly what `git fabro logs` prints for that envelope, so a tool written
against one reads the other. Several runs' backlogs are merged in time order (by `ts`,
then by id: ids are UUID v7); with `--follow`, lines come as the runs write them, and
the command ends when the runs named have ended, or, with no run named, keeps
following the repository, runs started meanwhile included, until interrupted.
"""

from __future__ import annotations

import sys
from fnmatch import fnmatchcase
from pathlib import Path

from fabro_git.engine.reader import RunEvent
from fabro_git.errors import ConfigError

FILTER_KEYS = ("event", "node")


class EventFilter:
    """`--filter event=GLOB` and `--filter node=ID` (any value of a key may match; every
    key given must), and `--since`."""

    def __init__(self, filters: list[str], since_ts: str | None) -> None:
        self.wanted: dict[str, list[str]] = {}
        for text in filters:
            key, sep, value = text.partition("=")
            if not sep or key not in FILTER_KEYS or not value:
                raise ConfigError(
                    f"--filter {text!r}: expected KEY=VALUE with KEY one of "
                    f"{', '.join(FILTER_KEYS)}",
                    hint="for example --filter event=stage.completed, --filter 'event=agent.*',"
                    " --filter node=plan",
                )
            self.wanted.setdefault(key, []).append(value)
        self.since_ts = since_ts

    def keep(self, event: RunEvent) -> bool:
        if self.since_ts is not None and event.ts < self.since_ts:
            return False
        names = self.wanted.get("event")
        if names is not None and not any(fnmatchcase(event.name, glob) for glob in names):
            return False
        nodes = self.wanted.get("node")
        return nodes is None or event.node_id in nodes


def run(runs: list[str], *, follow: bool, filters: list[str], since: str | None) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.cli.logs import since_timestamp
    from fabro_git.engine.reader import EventCursor, NewRuns, follow_all
    from fabro_git.store import runs as layout
    from fabro_git.store.repo import GitRepo

    keep = EventFilter(filters, since_timestamp(since))
    repo = GitRepo.discover(Path.cwd())
    run_ids = list(dict.fromkeys(resolve_run(repo, arg) for arg in runs))
    whole_repository = not run_ids
    if whole_repository:
        run_ids = layout.list_run_ids(repo)
    cursors = [EventCursor(repo, run_id) for run_id in run_ids]
    backlog = [event for cursor in cursors for event in cursor.read()]
    if len(cursors) > 1:
        backlog.sort(key=lambda event: (event.ts, event.id))
    _print(backlog, keep)
    if not follow:
        return 0
    new_runs = NewRuns(repo, known=run_ids) if whole_repository else None
    for batch in follow_all(cursors, new_runs=new_runs):
        _print(batch, keep)
    return 0


def _print(events: list[RunEvent], keep: EventFilter) -> None:
    out = sys.stdout
    for event in events:
        if keep.keep(event):
            out.write(event.json_text + "\n")
    out.flush()
