"""Taking another commit's files into a worktree without moving its branch.

The fan-in does this with the winning parallel branch: the worktree's index and files
become that commit's tree, while the run branch stays put until the fan-in's own
checkpoint commits the result with both the run branch and the branch head as parents.
"""

from __future__ import annotations

from pathlib import Path

from fabro_git.store._gitcli import run_git


def adopt_tree(worktree: Path, commit: str) -> None:
    """Make the index and tracked files of `worktree` match `commit`; HEAD is untouched."""
    # The id may come from a record (a resumed run's context): never an option to git.
    run_git(["read-tree", "-u", "--reset", "--end-of-options", commit], cwd=Path(worktree))
