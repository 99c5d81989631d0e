"""The worktree as the file tools see it: every path confined to it.

A path a tool is given (relative to the worktree, or absolute) is resolved through every
symlink and must land inside the worktree's own real path, and outside git's internals
(`.git` as a directory, or the file a linked worktree has instead). `../x`, `/etc/x`, a
symlink pointing out and `.git/config` are all refused as tool errors the model reads.

This guards the file tools only. The `shell` tool runs whatever the model writes, with
the worktree as its working directory: it is a shell, not a sandbox, just as a command
stage is. Confinement keeps an honest model's edits where they belong; it does not
contain a hostile one.
"""

from __future__ import annotations

import os
from pathlib import Path


class ToolError(Exception):
    """A tool call that cannot be done; the message goes back to the model."""


class Workspace:
    def __init__(self, worktree: Path) -> None:
        self.root = Path(os.path.realpath(worktree))

    def resolve(self, path: str) -> Path:
        """The real path `path` stands for, inside the worktree and outside `.git`."""
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
        relative = real.relative_to(self.root)
        if ".git" in relative.parts:
            raise ToolError(f"{path}: git's internal files are not for tools to touch")
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
