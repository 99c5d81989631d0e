"""`git fabro rm`: delete runs, everything they own here, and nothing else.

It takes run ids or unique prefixes of them, never a workflow's name: the other commands
read a workflow's name as its latest run, and a deletion aimed by that rule at "the
latest run of X" hits whichever run came last, which is not always the one meant. The
refusal names the run the name would have meant, and `prune --workflow` removes all of a
workflow's runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.cli import _housekeeping as housekeeping
from fabro_git.errors import FabroError, RunNotFound

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo


def run(run_args: list[str], *, yes: bool, dry_run: bool) -> int:
    from fabro_git.cli._runs import all_rows
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    rows = {row.run_id: row for row in all_rows(repo, warn=False)}
    run_ids: list[str] = []
    for arg in run_args:
        try:
            run_id = runrefs.resolve_run_id(repo, arg, remote=None)
        except RunNotFound:
            latest = next((r for r in rows.values() if r.workflow == arg), None)
            if latest is None:
                raise
            raise FabroError(
                f"{arg!r} is a workflow, not a run: rm takes run ids (or prefixes of them)",
                hint=f"its latest run is {latest.run_id} (git fabro rm {latest.run_id}); "
                f"remove all of its runs with git fabro prune --workflow {arg}",
            ) from None
        if run_id not in run_ids:
            run_ids.append(run_id)
    removals = [housekeeping.plan(repo, run_id, rows.get(run_id)) for run_id in run_ids]
    for removal in removals:
        housekeeping.check(repo, removal)
    for removal in removals:
        print("\n".join(removal.lines()))
    what = housekeeping.plural(len(removals), "run")
    if dry_run:
        print(f"dry run: would remove {what}; nothing was deleted", file=sys.stderr)
        return 0
    if not housekeeping.confirm(f"Remove {what}?", yes=yes, what=what):
        print("nothing was removed", file=sys.stderr)
        return 1
    for removal in removals:
        housekeeping.remove(repo, removal)
        print(f"removed run {removal.run_id}", file=sys.stderr)
    note_remote_tracking(repo, run_ids)
    return 0


def note_remote_tracking(repo: GitRepo, run_ids: list[str]) -> None:
    """Say when a remote-tracking branch still holds a removed run's commits: `git gc`
    keeps them until the run is gone from the remote too."""
    tracking = [
        name
        for name in repo.list_refs("refs/remotes/")
        if any(name.endswith(f"/fabro/run/{run_id}") for run_id in run_ids)
    ]
    if tracking:
        print(
            "note: remote-tracking branches still hold their commits: "
            + ", ".join(tracking)
            + " (they go when the runs are gone from the remote and you fetch with --prune)",
            file=sys.stderr,
        )
