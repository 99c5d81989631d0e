"""`git fabro prune`: remove runs by age, status and workflow, and what gone runs left.

With no filter at all it keeps the last day's runs (as `--older-than 24h`), so a bare
`git fabro prune` never takes the run someone is looking at. A live run is never
removed, whatever the filters say; a dead `running` run counts as `interrupted`. Besides
runs, it removes what runs that are gone left behind: scratch worktrees registered in
this repository, this repository's scratch dirs, parallel refs and lock files.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fabro_git.cli import _housekeeping as housekeeping
from fabro_git.cli._runs import RunRow, all_rows
from fabro_git.errors import ConfigError

STATUSES = ("succeeded", "partially_succeeded", "failed", "interrupted")
DEFAULT_AGE = "24h"


def run(
    *,
    older_than: str | None,
    statuses: list[str],
    workflow: str | None,
    dry_run: bool,
    yes: bool,
) -> int:
    from fabro_git.cli.rm import note_remote_tracking
    from fabro_git.store.repo import GitRepo

    wanted = _statuses(statuses)
    if older_than is None and not wanted and workflow is None:
        older_than = DEFAULT_AGE
    cutoff = _cutoff(older_than)
    repo = GitRepo.discover(Path.cwd())
    rows = all_rows(repo)
    chosen = [r for r in rows if _matches(r, cutoff, wanted, workflow)]
    removals = []
    for row in reversed(chosen):  # oldest first
        removal = housekeeping.plan(repo, row.run_id, row)
        if removal.checked_out:
            where = ", ".join(str(p) for p in removal.checked_out)
            print(
                f"keeping run {row.run_id}: its branch is checked out in {where}", file=sys.stderr
            )
            continue
        removals.append(removal)
    # The runs it removes take their own things with them; orphans are what no run owns.
    orphans = housekeeping.find_orphans(repo, {r.run_id for r in rows})
    if not removals and not orphans:
        print(f"nothing to prune ({_criteria(older_than, wanted, workflow)})", file=sys.stderr)
        return 0
    for removal in removals:
        print("\n".join(removal.lines()))
    if orphans:
        print("\n".join(orphans.lines()))
    what = housekeeping.plural(len(removals), "run")
    if orphans:
        what += " and what gone runs left"
    if dry_run:
        print(f"dry run: would remove {what}; nothing was deleted", file=sys.stderr)
        return 0
    if not housekeeping.confirm(f"Remove {what}?", yes=yes, what=what):
        print("nothing was removed", file=sys.stderr)
        return 1
    removed = []
    for removal in removals:
        try:
            housekeeping.remove(repo, removal)
        except housekeeping.RunLive as err:  # it started since it was listed
            print(f"keeping run {removal.run_id}: {err.message}", file=sys.stderr)
            continue
        removed.append(removal.run_id)
        print(f"removed run {removal.run_id}", file=sys.stderr)
    housekeeping.remove_orphans(repo, orphans)
    print(f"pruned {housekeeping.plural(len(removed), 'run')}", file=sys.stderr)
    note_remote_tracking(repo, removed)
    return 0


def _statuses(values: list[str]) -> set[str]:
    wanted = {part.strip() for value in values for part in value.split(",") if part.strip()}
    unknown = sorted(wanted - set(STATUSES))
    if unknown:
        extra = " (a live run is never pruned)" if "running" in unknown else ""
        raise ConfigError(
            f"--status: unknown status {', '.join(unknown)}{extra}",
            hint=f"use one or more of {', '.join(STATUSES)}, separated by commas",
        )
    return wanted


def _cutoff(older_than: str | None) -> datetime | None:
    if older_than is None:
        return None
    from fabro_git.durations import option_seconds

    return datetime.now(UTC) - timedelta(seconds=option_seconds(older_than, "--older-than"))


def _matches(row: RunRow, cutoff: datetime | None, wanted: set[str], workflow: str | None) -> bool:
    if row.live:
        return False
    if wanted and row.status not in wanted:
        return False
    if workflow is not None and row.workflow != workflow:
        return False
    if cutoff is not None:
        try:
            started = datetime.fromisoformat(row.started.replace("Z", "+00:00"))
        except ValueError:
            return False  # no readable start time: not provably old
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        if started > cutoff:
            return False
    return True


def _criteria(older_than: str | None, wanted: set[str], workflow: str | None) -> str:
    parts = []
    if older_than is not None:
        parts.append(f"older than {older_than}")
    if wanted:
        parts.append("status " + ",".join(sorted(wanted)))
    if workflow is not None:
        parts.append(f"workflow {workflow}")
    return "; ".join(parts)
