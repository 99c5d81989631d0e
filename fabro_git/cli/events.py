"""`git fabro events`: the event envelopes of one run, several, or every run, as NDJSON.

Each line is exactly what `git fabro logs` prints for that envelope, so a tool written
against one reads the other. Several runs' backlogs are merged in time order (by `ts`,
then by id: ids are UUID v7); with `--follow`, lines come as the runs write them, and
the command ends when the runs named have ended, or, with no run named, keeps
following the repository, runs started meanwhile included, until interrupted.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path

from fabro_git.engine.reader import EventCursor, RunEvent
from fabro_git.errors import ConfigError, FabroError

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
    # A run named is read or refused; in the whole repository's events, a run that
    # cannot be read is skipped with the warning `ps` gives, so it hides no other.
    cursors, backlogs = _backlogs(
        [EventCursor(repo, run_id) for run_id in run_ids], skip=whole_repository
    )
    # Each run's backlog is read a segment at a time, the runs' merged as they come.
    _print(heapq.merge(*backlogs, key=lambda event: (event.ts, event.id)), keep)
    if not follow:
        return 0
    new_runs = None
    if whole_repository:
        appearing = NewRuns(repo, known=run_ids)

        def new_runs() -> list[EventCursor]:
            return [cursor for cursor in appearing() if _readable(cursor)]

    for batch in follow_all(cursors, new_runs=new_runs):
        _print(batch, keep)
    return 0


def _backlogs(
    cursors: list[EventCursor], *, skip: bool
) -> tuple[list[EventCursor], list[Iterator[RunEvent]]]:
    """The cursors read, and the events their runs have recorded so far, each run's as
    a stream (`EventCursor.backlog`); with `skip`, a run whose events cannot be read is
    left out, with a warning, before any event of any run is printed."""
    kept: list[EventCursor] = []
    backlogs: list[Iterator[RunEvent]] = []
    for cursor in cursors:
        try:
            backlogs.append(cursor.backlog())
        except FabroError as problem:
            if not skip:
                raise
            _skipped(cursor, problem)
            continue
        kept.append(cursor)
    return kept, backlogs


def _readable(cursor: EventCursor) -> bool:
    """Whether the events of a run that appeared while following can be read (the
    cursor's own first read then gives them, from the start): its segments are
    checked, not read."""
    from fabro_git.engine.reader import recorded_stream

    try:
        recorded_stream(cursor.repo, cursor.run_id)
    except FabroError as problem:
        _skipped(cursor, problem)
        return False
    return True


def _skipped(cursor: EventCursor, problem: FabroError) -> None:
    from fabro_git.cli._runs import warn_skipped
    from fabro_git.store import runs as layout

    warn_skipped(layout.meta_ref(cursor.run_id), problem)


def _print(events: Iterable[RunEvent], keep: EventFilter) -> None:
    out = sys.stdout
    for event in events:
        if keep.keep(event):
            out.write(event.json_text + "\n")
    out.flush()
