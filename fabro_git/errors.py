"""The one family of errors a user can act on.

Everything a user can fix is a `FabroError`: the CLI boundary (`fabro_git.cli`) prints
its message on stderr and exits 1, with no traceback. Anything else that escapes is a
bug: the boundary says so, writes a crash log with versions and exits 3. Ctrl-C exits
130. Keep messages specific: name the file and line, or the run, and say what to do.
"""

from __future__ import annotations

import errno
from pathlib import Path

# A write refused for lack of space: the disk is full, or the user's quota is.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How git (and the C library under it) words the same two failures.
DISK_FULL_MESSAGES = ("No space left on device", "Disk quota exceeded")


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


class DiskFull(FabroError):
    """A write failed because the disk or the quota is full.

    Writes go objects first and refs last, so a write cut short leaves every run at its
    last checkpoint, exactly as a kill would: the message says so, and how to go on.
    """

    def __init__(self, detail: str, *, run_id: str | None = None) -> None:
        self.detail = detail
        self.run_id = run_id
        if run_id is None:
            message = f"disk full: {detail}"
            hint = "free some space, then run the command again"
        else:
            message = (
                f"disk full: {detail}\n"
                f"Nothing recorded is lost: run {run_id} stopped at its last checkpoint in git."
            )
            hint = f"free some space, then continue with `git fabro resume {run_id}`"
        super().__init__(message, hint=hint)

    def for_run(self, run_id: str) -> DiskFull:
        return self if self.run_id == run_id else DiskFull(self.detail, run_id=run_id)


def disk_full_in(exc: BaseException) -> DiskFull | None:
    """The disk-full failure behind `exc`, if any, as a `DiskFull`.

    Looks through exception groups (a trio nursery wraps what its tasks raise) and
    through causes and contexts (a store error raised from an `OSError`).
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, DiskFull):
            return current
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            reason = current.strerror or str(current)
            where = f" (writing {current.filename})" if current.filename else ""
            return DiskFull(f"{reason}{where}")
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
    return None


def disk_full_message(text: str) -> bool:
    """True when a tool's error output says the disk or quota is full."""
    return any(marker in text for marker in DISK_FULL_MESSAGES)


class MissingObject(StoreError):
    """An object a ref leads to is not in the repository (a `git gc --prune=now` while a
    run was writing can remove objects no ref pointed at yet)."""


class DamagedObject(StoreError):
    """An object git has cannot be read as git wrote it: its header does not say what it
    holds, or its delta cannot be applied (`store.blobs`). git never writes one, and
    `git fetch` refuses one, so it was written into `.git` some other way."""

    def __init__(self, sha: str, where: Path, problem: str) -> None:
        self.path = where
        super().__init__(
            f"object {sha} in {where} is damaged: {problem}; nothing of it was read",
            hint="`git fsck` lists what is damaged; a run that leads to it cannot be read",
        )


class BlobTooLarge(StoreError):
    """A file of git's that a reader would take whole into memory is bigger than it may
    be (`store.blobs`): refused from the object's header, before a byte of it is
    inflated. git fabro records no file that big, so a run that holds one was made some
    other way, and a run fetched from a remote is someone else's input."""

    def __init__(
        self,
        path: str,
        sha: str,
        size: int,
        limit: int,
        *,
        inflated: int | None = None,
        run_id: str | None = None,
    ) -> None:
        self.path = path
        self.sha = sha
        self.size = size
        self.limit = limit
        self.inflated = inflated  # set when its chain of deltas is what is too big
        self.run_id = run_id
        who = f"run {run_id}: its " if run_id else ""
        chain = f", kept as deltas that inflate {inflated:,} bytes to read" if inflated else ""
        look = f"see how it starts with `git cat-file blob {sha} | head -c 2000`"
        super().__init__(
            f"{who}{path} (blob {sha[:12]}) is {size:,} bytes{chain}: more than git fabro "
            f"reads of one file ({limit >> 20} MiB); nothing of it was read",
            hint=(
                f"git fabro records no file this big: if the run came from a remote, "
                f"remove it here with `git fabro rm {run_id}`; {look}"
                if run_id
                else look
            ),
        )

    def for_run(self, run_id: str) -> BlobTooLarge:
        """The same refusal, naming the run the file belongs to."""
        if self.run_id == run_id:
            return self
        return BlobTooLarge(
            self.path, self.sha, self.size, self.limit, inflated=self.inflated, run_id=run_id
        )


class ToolMissing(FabroError):
    """An external program the command needs is not installed."""


class Interrupted(FabroError):
    """The user interrupted the command (Ctrl-C)."""

    exit_code = 130
