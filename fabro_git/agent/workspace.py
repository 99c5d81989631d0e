"""The worktree as the file tools see it: every path confined to it.

A path a tool is given (relative to the worktree, or absolute) is resolved through every
symlink and must land inside the worktree's own real path, and outside git's internals
(`.git` as a directory, or the file a linked worktree has instead). `../x`, `/etc/x`, a
symlink pointing out and `.git/config` are all refused as tool errors the model reads.
In an `--in-place` run the worktree is the user's checkout, and its `.fabro/` (the
project's configuration, which the user's next run obeys) is refused to writes too; the
shell is checked after each command instead (`fabro_git.config.protected`).

This guards the file tools only. The `shell` tool runs whatever the model writes, with
the worktree as its working directory: it is a shell, not a sandbox, just as a command
stage is. Confinement keeps an honest model's edits where they belong; it does not
contain a hostile one.
"""

from __future__ import annotations

import os
from pathlib import Path

from fabro_git.config.protected import CONFIG_DIR


class ToolError(Exception):
    """A tool call that cannot be done; the message goes back to the model."""


class Workspace:
    def __init__(self, worktree: Path, *, guard_config: Path | None = None) -> None:
        self.root = Path(os.path.realpath(worktree))
        # An in-place run's checkout (a sub-agent's root may lie below it): its `.fabro/`
        # is the user's configuration, not the stage's.
        self.guard_config = guard_config
        self._config_dir = (
            None if guard_config is None else Path(os.path.realpath(guard_config)) / CONFIG_DIR
        )

    def resolve(self, path: str, *, write: bool = False) -> Path:
        """The real path `path` stands for, inside the worktree and outside `.git`; to be
        written, outside a guarded `.fabro/` too."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("a path is required")
        if "\x00" in path:
            raise ToolError("a path cannot hold a NUL byte")
        given = Path(path)
        joined = given if given.is_absolute() else self.root / given
        real = Path(os.path.realpath(joined))
        if real != self.root and not real.is_relative_to(self.root):
            raise ToolError(
                f"{path}: outside the worktree ({self.root}); tools may only touch files in it"
            )
        if ".git" in real.relative_to(self.root).parts:
            raise ToolError(f"{path}: git's internal files are not for tools to touch")
        config = self._config_dir
        if write and config is not None and (real == config or real.is_relative_to(config)):
            raise ToolError(
                f"{path}: {CONFIG_DIR}/ holds the project's configuration, which the user's "
                "next run obeys; in an --in-place run no stage may change it"
            )
        return real

    def relative(self, real: Path) -> str:
        """How a resolved path is named to the model and in the result: worktree-relative."""
        return real.relative_to(self.root).as_posix() or "."

    def is_hidden(self, real: Path) -> bool:
        """True for paths a listing skips: outside the worktree or inside `.git`."""
        try:
            relative = Path(os.path.realpath(real)).relative_to(self.root)
        except ValueError:
            return True
        return ".git" in relative.parts
