"""A fast "did anything change?" check for small worktrees, before asking git.

Turning a worktree into a tree costs two git processes (`add -A`, `write-tree`) even when
a stage touched nothing, and many stages touch nothing. For a worktree whose index is
small, one `lstat` per file against the stat data git itself recorded in the index
answers the question in well under a millisecond.

The check only ever says "unchanged" when that is certain; every doubt sends the caller
back to git: a path the index does not know (even an ignored one), a missing path, a
size, mode, inode or mtime that differs, an mtime not older than the index itself (git's
"racily clean" rule), a gitlink, or an index written since the caller last looked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dulwich.index import IndexEntry

MAX_ENTRIES = 5000


def index_path(worktree: Path) -> Path | None:
    dotgit = worktree / ".git"
    try:
        if dotgit.is_dir():
            return dotgit / "index"
        text = dotgit.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(text[len("gitdir:") :].strip())
    if not gitdir.is_absolute():
        gitdir = (worktree / gitdir).resolve()
    return gitdir / "index"


def index_stamp(worktree: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of the worktree's index file, to notice when git rewrote it."""
    path = index_path(worktree)
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _ns(value: object) -> int | None:
    if isinstance(value, tuple):
        return int(value[0]) * 1_000_000_000 + int(value[1])
    if isinstance(value, int):
        return value * 1_000_000_000
    if isinstance(value, float):
        return int(value * 1_000_000_000)
    return None


# The index parsed last time, keyed by its file and stamp: between stages that change
# nothing, git never rewrites it, so it is parsed once and then only stat'ed.
_parsed: dict[tuple[Path, tuple[int, int]], dict[bytes, IndexEntry]] = {}


def _read_entries(path: Path, stamp: tuple[int, int]) -> dict[bytes, IndexEntry] | None:
    cached = _parsed.get((path, stamp))
    if cached is not None:
        return cached
    from dulwich.index import Index
    from dulwich.index import IndexEntry as Entry

    try:
        index = Index(str(path))
    except Exception:
        return None
    entries: dict[bytes, IndexEntry] = {}
    for name, item in index.items():
        if not isinstance(item, Entry):  # a conflicted entry
            return None
        entries[name] = item
        if len(entries) > MAX_ENTRIES:
            return None
    _parsed.clear()
    _parsed[(path, stamp)] = entries
    return entries


def unchanged(worktree: Path, stamp: tuple[int, int] | None) -> bool:
    """True only when the worktree certainly matches its index, and the index is the one
    the caller saw (`stamp`, from `index_stamp` right after it last staged)."""
    if stamp is None:
        return False
    path = index_path(worktree)
    if path is None or index_stamp(worktree) != stamp:
        return False
    entries = _read_entries(path, stamp)
    if entries is None:
        return False
    index_mtime = stamp[0]
    seen = 0
    stack = [b""]
    root = os.fsencode(worktree)
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                dir_entries = list(it)
        except OSError:
            return False
        for found in dir_entries:
            name = found.name if isinstance(found.name, bytes) else os.fsencode(found.name)
            if not rel and name == b".git":
                continue
            relpath = rel + b"/" + name if rel else name
            try:
                st = found.stat(follow_symlinks=False)
            except OSError:
                return False
            if stat.S_ISDIR(st.st_mode):
                stack.append(relpath)
                continue
            entry = entries.get(relpath)
            if entry is None:
                return False
            mode = entry.mode
            if stat.S_ISLNK(st.st_mode) != stat.S_ISLNK(mode) or mode == 0o160000:
                return False
            if not stat.S_ISLNK(st.st_mode) and bool(st.st_mode & 0o100) != bool(mode & 0o100):
                return False
            mtime = _ns(entry.mtime)
            if (
                entry.size != (st.st_size & 0xFFFFFFFF)
                or mtime is None
                or mtime // 1000 != st.st_mtime_ns // 1000
                or (entry.ino and entry.ino != (st.st_ino & 0xFFFFFFFF))
                or st.st_mtime_ns >= index_mtime
            ):
                return False
            seen += 1
    return seen == len(entries)
