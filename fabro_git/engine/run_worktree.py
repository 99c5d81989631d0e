"""The run's worktree: its scratch checkout of the run branch, made ready for a drive.

A new run adds it; a resume reuses it (reset to the branch's tip), or makes it again
when it was removed, half removed or left behind by a repository that moved.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
from pathlib import Path

from fabro_git.config.locations import runs_dir
from fabro_git.engine.emit import Emit
from fabro_git.errors import FabroError, StoreError
from fabro_git.events.catalogue import GitReset
from fabro_git.store import runs as runrefs
from fabro_git.store import worktree as git_worktree
from fabro_git.store.repo import GitRepo


def ensure_worktree(
    repo: GitRepo,
    run_id: str,
    scratch: Path,
    run_tip: str,
    emit: Emit,
    *,
    new: bool = False,
    base_branch: str | None = None,
) -> tuple[Path, bool]:
    """The run's worktree at the run branch's tip: reuse, reset or rebuild it. A `new`
    run made its branch and scratch dir just now: nothing of git's can hold either, so
    git's list of worktrees is not consulted. `base_branch` (the branch the run started
    from) is what a checkout holding the run branch is told to switch back to."""
    path = scratch / "worktree"
    branch = runrefs.run_branch_name(run_id)
    if new:
        git_worktree.add_worktree(repo, path, branch=branch, commit=run_tip, new=True)
        return path, True
    # One listing for both checks below; `add_worktree` lists again under its lock.
    checkouts = git_worktree.checkouts_of(repo, branch)
    checkouts = _drop_stale_checkouts(repo, checkouts, path)
    if (path / ".git").exists():
        try:
            git_worktree.checkout(path, run_tip)
            emit(GitReset(sha=run_tip))
            return path, False
        except FabroError:
            with contextlib.suppress(FabroError):
                git_worktree.remove_worktree(repo, path)
            shutil.rmtree(path, ignore_errors=True)
    for other in checkouts:
        if other.resolve() != path.resolve():
            raise StoreError(
                f"run {run_id}: its branch {branch} is checked out at {other}, and a branch "
                "can be checked out in one worktree only",
                hint=_switch_away_hint(repo, other, base_branch),
            )
    git_worktree.add_worktree(repo, path, branch=branch, commit=run_tip)
    return path, True


def _switch_away_hint(repo: GitRepo, other: Path, base_branch: str | None) -> str:
    """How to free the run branch from the checkout `other`: the main worktree (the
    user's own checkout, which git never removes) goes back to the run's base branch;
    a linked one can be switched away or removed."""
    if other.resolve() == git_worktree.main_worktree(repo).resolve():
        switch = ["git", "-C", str(other), "switch", base_branch or "-"]
        return f"switch that checkout to another branch ({shlex.join(switch)}), then run the command again"
    detach = ["git", "-C", str(other), "switch", "--detach"]
    remove = ["git", "worktree", "remove", str(other)]
    return (
        f"switch that worktree away ({shlex.join(detach)}) or remove it "
        f"({shlex.join(remove)}), then run the command again"
    )


def _drop_stale_checkouts(repo: GitRepo, checkouts: list[Path], path: Path) -> list[Path]:
    """Remove this repository's other scratch checkouts of the run branch (`checkouts`,
    where it is checked out); returns those left.

    The scratch dir is keyed by the repository's path, so a repository that moved (or
    a scratch dir from before the key) leaves a checkout of the run branch under the old
    name, and git refuses a second one. We hold the run lock and a run worktree holds
    nothing git lacks, so it goes (its files first: after a move, its link back to the
    repository is broken and `git worktree remove` refuses it). What a killed process
    of the run left running there, by the records in that scratch dir, is killed first:
    it would go on writing into the files removed.
    """
    from fabro_git.engine import reaper
    from fabro_git.engine.process_groups import records_dir

    root = runs_dir().resolve()
    left = []
    for other in checkouts:
        resolved = other.resolve()
        if resolved != path.resolve() and resolved.is_relative_to(root):
            reaper.kill_recorded(records_dir(other.parent))
            shutil.rmtree(other, ignore_errors=True)
            git_worktree.remove_worktree(repo, other)
        else:
            left.append(other)
    return left
