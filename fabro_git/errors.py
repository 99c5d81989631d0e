"""The one family of errors a user can act on.

Everything a user can fix is a `FabroError`: the CLI boundary (`fabro_git.cli`) prints
its message on stderr and exits 1, with no traceback. Anything else that escapes is a
bug: the boundary says so, writes a crash log with versions and exits 3. Ctrl-C exits
130. Keep messages specific: name the file and line, or the run, and say what to do.
"""

from __future__ import annotations

from pathlib import Path


class FabroError(Exception):
    """An error the user can fix. `str(err)` is the whole message shown to them."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


class SourceError(FabroError):
    """An error located in a file: `path:line:column: message`."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None,
        line: int | None = None,
        column: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else "<string>"
        self.line = line
        self.column = column
        self.detail = message
        where = self.path
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}", hint=hint)


class WorkflowError(SourceError):
    """A workflow file that cannot be read or parsed."""


class ConfigError(FabroError):
    """Bad options, inputs or configuration."""


class RepositoryError(FabroError):
    """The directory is not a usable git repository for this command."""


class RunNotFound(FabroError):
    """No run matches the id or prefix the user gave."""


class AmbiguousRunId(FabroError):
    """A run id prefix matches more than one run."""


class RunLocked(FabroError):
    """Another live process owns the run."""


class StoreError(FabroError):
    """A git operation on the store failed."""


class RefRaceError(StoreError):
    """A compare-and-swap ref update lost a race: the ref moved underneath us."""


class MissingObject(StoreError):
    """An object a ref leads to is not in the repository (a `git gc --prune=now` while a
    run was writing can remove objects no ref pointed at yet)."""


class ToolMissing(FabroError):
    """An external program the command needs is not installed."""


class Interrupted(FabroError):
    """The user interrupted the command (Ctrl-C)."""

    exit_code = 130
