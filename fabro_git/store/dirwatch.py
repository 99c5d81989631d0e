"""Which files in a set of directories changed since the last look (Linux inotify).

`StateReader` takes the state of the user's git dir twice a stage; reading it whole
costs a `stat` per loose ref and hook, which a repository with thousands of loose refs
(every run leaves two) makes several milliseconds. A `DirWatch` tells it what changed
since its last look instead, so a look costs what changed.

The kernel queues an event as a change is made, inside the system call that makes it,
so every change finished before `changes()` is called is in what it returns. A
directory is watched before it is read (`watch`, then the caller's scan), so nothing
made in between is missed. When the queue overflowed, or a watch could not be added,
`changes()` answers None: the caller reads everything again. Elsewhere than Linux, or
without inotify, `DirWatch.open()` answers None and the caller reads everything each
time.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys
import weakref
from collections.abc import Callable

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# Without IN_DONT_FOLLOW: a directory reached through a symbolic link (`.git/hooks`
# linked to the project's hooks) is watched where the link leads, as it is read there.
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
# What makes a watched directory itself go: its entries must be read again from above.
_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_EVENT = struct.Struct("iIII")


class DirWatch:
    """The changes under the directories watched, as (directory, entry name) pairs."""

    def __init__(self, fd: int, add: Callable[[int, bytes, int], int]) -> None:
        self._fd = fd
        self._add = add
        self._dirs: dict[int, str] = {}
        self._lost = False
        # Closed with its reader, at the latest: a run's reader lives as long as the run,
        # and a process that makes many (the tests) must not keep their descriptors.
        self._closer = weakref.finalize(self, _close, fd)

    @classmethod
    def open(cls) -> DirWatch | None:
        """A new watch, or None where inotify is not to be had."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):
            return None
        init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
        add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        add.restype = ctypes.c_int
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        return cls(fd, add)

    def watch(self, directory: str) -> None:
        """Watch `directory` (not what is below it). One that cannot be watched (gone,
        or the system's limit on watches reached) makes the next `changes()` None."""
        wd = self._add(self._fd, os.fsencode(directory), _MASK)
        if wd < 0:
            if ctypes.get_errno() not in (2, 20):  # ENOENT, ENOTDIR: gone, nothing to see
                self._lost = True
            return
        self._dirs[wd] = directory

    def changes(self) -> set[tuple[str, str]] | None:
        """What changed since the last call: (watched directory, entry name) pairs, the
        name "" when the directory itself went. None when some change may be missing
        from them (the queue overflowed, a watch could not be added)."""
        found: set[tuple[str, str]] = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = data[start : start + length].split(b"\0", 1)[0]
                offset = start + length
                if mask & _IN_Q_OVERFLOW:
                    self._lost = True
                    continue
                directory = self._dirs.get(wd)
                if directory is None:
                    continue
                if mask & _GONE:
                    if mask & _IN_IGNORED:
                        del self._dirs[wd]
                    found.add((directory, ""))
                else:
                    found.add((directory, os.fsdecode(name)))
        if self._lost:
            self._lost = False
            return None
        return found

    def close(self) -> None:
        self._closer()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
