"""The one rule for paths built from run data: checked, joined and written here only.

A run's meta ref can come from anywhere (`git fabro fetch` takes what a remote holds,
and git does not check tree entry names on fetch), so its tree entry names, manifest
fields and artifact keys are untrusted text. Whatever turns them into a file on disk
(resume's artifact restore, `dump`, `artifact cp`, `fork`) goes through this module,
so one rule holds everywhere:

- a relative path is plain components joined by `/`: no absolute path, no empty, `.`
  or `..` component, no NUL, no component too long for a file system, and no `.git`
  component however spelled (any case, trailing dots or spaces, the code points HFS+
  ignores, the NTFS short name `git~1`), so nothing lands in a repository's git dir;
  and at most `MAX_PARTS` components, so no reader walks a tree deep without end;
- under the destination, no existing component may be a symlink (whether it leads
  out or not) or a file where a directory is needed;
- a write never follows a symlink: directories are walked and made with `O_NOFOLLOW`
  descriptors, the file is created beside its name with `O_EXCL | O_NOFOLLOW` and
  renamed over it, so a symlink put in place between the check and the write is
  replaced, never written through.

The destination itself is the caller's (the user named it, or it is a scratch dir):
it is trusted, symlinks and all. Only what lies below it is checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from fabro_git.errors import DISK_FULL_ERRNOS, FabroError

# The longest file name most file systems take, in bytes.
NAME_MAX = 255
# Code points HFS+ ignores in file names, so `.g\u200cit` is `.git` there (git's list).
_HFS_IGNORED = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
# Bytes written at a time: one 50 MB write(2) costs the kernel several times more.
_WRITE_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_HINT = (
    "git fabro never writes such a path, so this run's metadata was made or changed by "
    "something else (a fetched run can hold anything): look at it with "
    "`git ls-tree -r refs/fabro/meta/<run id>`, and remove the run with `git fabro rm` "
    "if you do not trust it"
)


class UnsafeEntry(FabroError):
    """A path from run data that would leave its destination, or reach through a symlink
    or into a `.git` dir: refused, with nothing written for it."""

    def __init__(
        self, entry: str, reason: str, *, root: Path | None = None, run_id: str | None = None
    ) -> None:
        self.entry = entry
        self.reason = reason
        self.root = root
        self.run_id = run_id
        who = f"run {run_id}: " if run_id else ""
        where = f" under {root}" if root is not None else ""
        super().__init__(
            f"{who}refusing to write {entry!r}{where}: {reason}; nothing was written for it",
            hint=_HINT.replace("<run id>", run_id) if run_id else _HINT,
        )

    def for_run(self, run_id: str) -> UnsafeEntry:
        """The same refusal, naming the run it came from."""
        if self.run_id == run_id:
            return self
        return UnsafeEntry(self.entry, self.reason, root=self.root, run_id=run_id)


def _is_git_name(part: str) -> bool:
    """True for a component a file system may take as `.git` (git's own list of
    spellings: any case, trailing dots and spaces, HFS+ ignored code points, `git~1`)."""
    plain = part.translate(_HFS_IGNORED).casefold().rstrip(". ")
    return plain == ".git" or plain == "git~1"


def _reason(part: str) -> str | None:
    if part == "":
        return "it has an empty component"
    if part == ".":
        return "it has a `.` component"
    if part == "..":
        return "it climbs out of its directory with `..`"
    if _is_git_name(part):
        return "it reaches into a `.git` directory"
    try:
        size = len(os.fsencode(part))
    except UnicodeEncodeError:
        return "it is not a valid file name"
    if size > NAME_MAX:
        return f"it has a component of {size} bytes (file names hold at most {NAME_MAX})"
    return None


# The most components a path from run data may have: far more than any run writes.
MAX_PARTS = 64


def checked_parts(relpath: str) -> tuple[str, ...]:
    """The components of the relative path `relpath`, once it passes the name rules (see
    the module docstring); `UnsafeEntry` when it does not. The file system is not read."""
    if not relpath:
        raise UnsafeEntry(relpath, "it is empty")
    if "\0" in relpath:
        raise UnsafeEntry(relpath, "it holds a NUL byte")
    if relpath.startswith("/"):
        raise UnsafeEntry(relpath, "it is an absolute path")
    parts = tuple(relpath.split("/"))
    if len(parts) > MAX_PARTS:
        # Read level by level, a deeper tree costs its reader the square of its depth
        # (and a recursive walk of it, the stack).
        raise UnsafeEntry(relpath[:200] + "…", f"it nests more than {MAX_PARTS} directories deep")
    for part in parts:
        reason = _reason(part)
        if reason is not None:
            raise UnsafeEntry(relpath, reason)
    return parts


def checked_name(name: str) -> str:
    """`name` when it is one plain path component (a run id in a scratch dir's name)."""
    parts = checked_parts(name)
    if len(parts) != 1:
        raise UnsafeEntry(name, "it is not a single file name")
    return name


def _refusal(fd: int, part: str, relpath: str, root: Path) -> UnsafeEntry | None:
    """Why the existing `part` in the directory `fd` cannot be walked through or
    written over, if it cannot."""
    try:
        info = os.stat(part, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return UnsafeEntry(
            relpath,
            f"{part!r} there is a symlink, and git fabro never writes through one",
            root=root,
        )
    return None


def _walk(root: Path, parts: tuple[str, ...], relpath: str, *, private: bool) -> int:
    """A descriptor of the directory `parts` below `root`, made as needed, with no symlink
    followed on the way."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o700 if private else 0o777, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                refusal = _refusal(fd, part, relpath, root)
                if refusal is None and err.errno in (errno.ENOTDIR, errno.ELOOP):
                    refusal = UnsafeEntry(
                        relpath, f"{part!r} there is a file, not a directory", root=root
                    )
                if refusal is not None:
                    raise refusal from None
                raise
            if made and private:
                os.fchmod(inner, 0o700)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def confined_path(root: Path, relpath: str) -> Path:
    """`root` joined with `relpath`, once `relpath` passes the name rules and no existing
    component of it below `root` is a symlink. For a path only read or handed on; a
    write goes through `write_confined`."""
    parts = checked_parts(relpath)
    path = Path(root)
    for part in parts:
        path = path / part
        try:
            info = path.lstat()
        except (FileNotFoundError, NotADirectoryError):
            break
        if stat.S_ISLNK(info.st_mode):
            raise UnsafeEntry(
                relpath,
                f"{part!r} there is a symlink, and git fabro never writes through one",
                root=root,
            )
    return Path(root).joinpath(*parts)


def write_confined(
    root: Path,
    relpath: str,
    data: bytes | Callable[[BinaryIO], object],
    *,
    private: bool = False,
) -> Path:
    """Write `data` (bytes, or a function that writes to the open file) to `relpath`
    below `root`, by the rules in the module docstring: the directories are made (0700
    when `private`, as the file is then 0600), the file replaced whole. Returns the path
    written. `UnsafeEntry` when the rules refuse it; `FabroError` when the write fails
    (an `OSError` for a full disk, which the CLI reports as such)."""
    parts = checked_parts(relpath)
    root = Path(root)
    if private:
        from fabro_git.config.locations import make_private_dir

        make_private_dir(root)
    else:
        root.mkdir(parents=True, exist_ok=True)
    try:
        fd = _walk(root, parts[:-1], relpath, private=private)
        try:
            _write_in(fd, parts[-1], relpath, root, data, private=private)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno in DISK_FULL_ERRNOS:
            raise
        raise FabroError(f"cannot write {root.joinpath(*parts)}: {err.strerror or err}") from err
    return root.joinpath(*parts)


def _write_in(
    fd: int,
    name: str,
    relpath: str,
    root: Path,
    data: bytes | Callable[[BinaryIO], object],
    *,
    private: bool,
) -> None:
    refusal = _refusal(fd, name, relpath, root)
    if refusal is not None:
        raise refusal
    temp = f".fabro-{secrets.token_hex(8)}.tmp"
    out_fd = os.open(temp, _FILE_FLAGS, 0o600 if private else 0o666, dir_fd=fd)
    try:
        with os.fdopen(out_fd, "wb") as out:
            if isinstance(data, bytes):
                view = memoryview(data)
                for start in range(0, len(data), _WRITE_CHUNK):
                    out.write(view[start : start + _WRITE_CHUNK])
            else:
                data(out)
        # Renaming replaces whatever is at `name` now (a symlink too), never follows it.
        os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=fd)
        raise
