"""Git's answers about the repository a command runs in, asked as the command starts.

`git fabro run` needs three answers from git before its run exists: where the
repository is (`git rev-parse`), what is uncommitted in it (`git status`) and its
configuration (`git config --list`). Asked before the command loads the engine (trio and
dulwich take a tenth of a second to import), the three git processes work on another
core meanwhile, and their answers wait for the command. This module imports nothing
heavy for that reason.

An answer is the repository's where the command was started: `GitRepo.discover` takes
them only for that directory, and only when the repository it opens is the one git
found there (not a run's worktree, whose main checkout it opens instead). Each is taken
once; a question asked again goes to git again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from fabro_git.errors import FabroError
from fabro_git.store._gitcli import start_git

DISCOVER_ARGS = (
    "rev-parse",
    "--path-format=absolute",
    "--git-dir",
    "--git-common-dir",
    "--is-bare-repository",
    "--is-inside-work-tree",
    "--show-toplevel",
)
STATUS_ARGS = ("--no-optional-locks", "status", "--porcelain", "--untracked-files=normal")
SETTINGS_ARGS = ("config", "--null", "--list")

Waiting = Callable[[], subprocess.CompletedProcess[bytes]]


class EarlyAnswers:
    """The three questions, asked of git in `cwd` as this object is made."""

    def __init__(self, cwd: Path, waiting: dict[str, Waiting]) -> None:
        self.cwd = cwd
        self._waiting = waiting

    @classmethod
    def ask(cls, cwd: Path) -> EarlyAnswers | None:
        """Ask now; None when git cannot be asked here (the command's own discovery
        then says why, as it would have)."""
        if not cwd.is_dir():
            return None
        waiting: dict[str, Waiting] = {}
        try:
            for name, args in (
                ("discovery", DISCOVER_ARGS),
                ("status", STATUS_ARGS),
                ("settings", SETTINGS_ARGS),
            ):
                waiting[name] = start_git(args, cwd=cwd)
        except (FabroError, OSError):
            return None
        return cls(cwd, waiting)

    def take(self, name: str) -> Waiting | None:
        """What waits for the answer to `name`, once; None after that."""
        return self._waiting.pop(name, None)
