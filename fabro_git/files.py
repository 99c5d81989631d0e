"""Read a file the user named, with limits: the one way input files are read.

A path on the command line or in a workflow can name anything: `/dev/zero` (endless),
a FIFO (a plain `open` blocks until a writer comes), a socket, or a log of several
gigabytes. Each must end in a message, never in a hang or a `MemoryError`. So: `stat`
first and refuse anything but a regular file without opening it; open with
`O_NONBLOCK`, so a file swapped for a FIFO after the check cannot block the open; check
the opened file again with `fstat`; and read at most one byte past the cap, which also
catches a file that grows while it is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fabro_git.errors import SourceError

# The graph file of a workflow kept by its name, in a directory of that name
# (`.fabro/workflows/<name>/workflow.fabro`): the run takes the directory's name.
NAMED_GRAPH_FILE = "workflow.fabro"

MAX_INPUT_BYTES = 10 * 1024 * 1024

_KINDS = (
    (stat.S_ISDIR, "is a directory, not a file"),
    (stat.S_ISFIFO, "is a named pipe (FIFO), not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
)


class UnreadableFile(SourceError):
    """A named input file that cannot be used; `detail` says why, without the path."""


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"


def _check_kind(path: Path, mode: int, size: int, limit: int) -> None:
    for test, reason in _KINDS:
        if test(mode):
            raise UnreadableFile(reason, path=path)
    if not stat.S_ISREG(mode):
        raise UnreadableFile("is not a regular file", path=path)
    if size > limit:
        raise UnreadableFile(
            f"is {_megabytes(size)}; input files are limited to {_megabytes(limit)}", path=path
        )


def _os_error(path: Path, exc: OSError) -> UnreadableFile:
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return UnreadableFile("no such file", path=path)
    if isinstance(exc, PermissionError):
        return UnreadableFile("permission denied", path=path)
    return UnreadableFile(f"cannot read file: {exc.strerror or exc}", path=path)


def read_input_file(path: Path, *, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `limit`.

    Raises `UnreadableFile` for a missing, unreadable, special or too-large file.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _os_error(path, exc) from None
    _check_kind(path, info.st_mode, info.st_size, limit)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise _os_error(path, exc) from None
    try:
        info = os.fstat(fd)
        _check_kind(path, info.st_mode, info.st_size, limit)
        data = _read_fd(fd, limit + 1)
    except OSError as exc:
        raise _os_error(path, exc) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFile(
            f"grew past {_megabytes(limit)} while being read; input files are limited to "
            f"{_megabytes(limit)}",
            path=path,
        )
    return data


# Never blocking: a FIFO swapped in after a check cannot hold up the open.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_fd(fd: int, limit: int) -> bytes:
    """At most `limit` bytes from `fd`, a megabyte at a time."""
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(1024 * 1024, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_input_text(path: Path, *, limit: int = MAX_INPUT_BYTES) -> str:
    """`read_input_file`, decoded as UTF-8 (a leading byte-order mark is dropped)."""
    data = read_input_file(path, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(
            f"is not valid UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            path=path,
        ) from None


def read_inside(path: Path, root: Path | None, *, limit: int) -> tuple[bytes, int] | None:
    """At most `limit` bytes of the regular file at `path`, and its size; None when it
    is no regular file, cannot be read, or (symlinks followed) lies outside `root`.

    For files a repository holds (a cloned one's, or what an agent wrote): a symlink
    committed there may lead anywhere, to `~/.ssh` or `/proc/self/environ`, and a
    device or FIFO would never end a read. `root` None: the file is the user's own
    (their config dir), read wherever it leads.
    """
    real = os.path.realpath(path)
    if root is not None and not Path(real).is_relative_to(os.path.realpath(root)):
        return None
    return read_regular(real, limit=limit, follow=False)


def read_regular(path: str | Path, *, limit: int, follow: bool = True) -> tuple[bytes, int] | None:
    """At most `limit` bytes of the regular file at `path`, and its size; None when it
    is no regular file (without `follow`, a symlink is none) or cannot be read. Opened
    without blocking, so a FIFO put in its place is never waited on, and checked again
    once open."""
    try:
        fd = os.open(path, _OPEN_FLAGS if follow else _OPEN_FLAGS | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return _read_fd(fd, limit), info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)
