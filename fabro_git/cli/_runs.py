"""The run reader (`fabro_git.engine.reader`) as the commands use it: what they print
when a run is skipped or named by its workflow, and how its figures read in a table."""

from __future__ import annotations

import sys

from fabro_git.engine.reader import (
    RunSummary,
    effective_status,
    list_runs,
    missing_in_run,
    objects_of,
    run_summary,
    tail_path,
)
from fabro_git.engine.reader import resolve_run as _resolve_run
from fabro_git.errors import FabroError
from fabro_git.store.repo import GitRepo

# The names the commands have long used for the reader's.
RunRow = RunSummary
read_row = run_summary

__all__ = [
    "RunRow",
    "all_rows",
    "effective_status",
    "format_ms",
    "format_tokens",
    "missing_in_run",
    "objects_of",
    "read_row",
    "resolve_run",
    "tail_path",
    "warn_skipped",
]


def all_rows(repo: GitRepo, *, warn: bool = True, labels: bool = False) -> list[RunSummary]:
    """Every run of the repository, newest first (with its labels when `labels`). A meta ref that is not a snapshot is
    skipped, with a warning that says what to do, so it cannot hide the others."""
    return list_runs(repo, labels=labels, on_skip=warn_skipped if warn else None)


def warn_skipped(name: str, problem: FabroError) -> None:
    """Say on stderr that the run ref `name` is left out of a listing, and why."""
    from fabro_git.terminal import printable

    # A fetched ref's name and its error are the remote's words.
    hint = f"\nhint: {problem.hint}" if problem.hint else ""
    print(printable(f"warning: skipped {name}: {problem.message}{hint}"), file=sys.stderr)


def resolve_run(repo: GitRepo, arg: str) -> str:
    """The run `arg` names (a run id, a prefix of one, or a workflow for its latest
    run, which is said on stderr so nobody is misled)."""
    return _resolve_run(repo, arg, note=lambda text: print(text, file=sys.stderr))


def format_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_tokens(count: int) -> str:
    """A token count for a table: 950, 12.3k, 4.1M."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"
