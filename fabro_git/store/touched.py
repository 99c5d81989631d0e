"""Which files a stage touched, told from two snapshots of its worktree.

(A stage that directly follows a checkpoint's scan of the worktree needs neither: it
reads the worktree from the checkpoints, see `fabro_git.engine.clean_start`. These
snapshots are what it falls back on.)

An agent CLI edits files with its own tools, so there are no tool events to read the
paths from. Instead the worktree's dirty set (changed tracked files and untracked,
non-ignored ones, as `git status` finds them) is snapshotted with each file's stat
data before the stage, again after it, and the two are diffed. A file that is dirty
in only one snapshot was touched; one dirty in both was touched when its stat data
differ, unless its size is equal and its content hash (xxhash, taken only for the few
dirty files) says the bytes are the same. Files the stage committed itself are clean
afterwards, so the paths of those commits are added.

Only the dirty set is read, so the cost is one `git status` per snapshot (which also
names HEAD) plus an `lstat` per dirty file. Every directory is read: the untracked
cache is off for these scans, though the worktree's index has one. With it, git (2.39
measured) skips a directory whose stat data have not moved since the last scan, and it
missed a new directory made inside a directory of tracked files shortly after a scan,
its files never listed, in about one stage of forty in `benchmarks/files_touched.py`.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from fabro_git.store._gitcli import run_git

# Dirty files up to this size get a content hash in a snapshot; a larger one counts as
# touched when its stat data changed.
HASH_LIMIT = 8 * 1024 * 1024
# An mtime this close to the snapshot (in ns) may hide a later write within the same
# timestamp tick: such a file is compared by content too (git's "racily clean" rule).
RACY_NS = 2_000_000_000

_STATUS = (
    "-c",
    "core.untrackedCache=false",
    # Every untracked file, not its directory.
    "-c",
    "status.showUntrackedFiles=all",
    "status",
    "--porcelain=v2",
    "--branch",
    "-z",
    "--no-renames",
    "--ignore-submodules=all",
)
# How many space-separated fields come before the path in a porcelain v2 entry.
_FIELDS_BEFORE_PATH = {"1": 8, "u": 10, "?": 1}


class FileState(msgspec.Struct, frozen=True):
    size: int
    mtime_ns: int
    mode: int
    digest: str | None  # xxhash of the content; None when absent or too large

    @property
    def exists(self) -> bool:
        return self.mode != 0


class WorktreeSnapshot(msgspec.Struct):
    head: str | None
    taken_ns: int
    files: dict[str, FileState] = msgspec.field(default_factory=dict)


def take_snapshot(worktree: Path, *, keep_cache: bool = True) -> WorktreeSnapshot:
    """The worktree's dirty files with their stat data, and the commit HEAD names.

    With `keep_cache`, git may write what it learnt (the files' stat data)
    back to the index, so the next scan is cheaper.
    """
    taken = time.time_ns()
    locks = [] if keep_cache else ["--no-optional-locks"]
    listing = run_git([*locks, *_STATUS], cwd=worktree).stdout
    head = None
    paths: list[str] = []
    for entry in listing.split(b"\0"):
        text = entry.decode("utf-8", "surrogateescape")
        if text.startswith("# branch.oid "):
            oid = text.removeprefix("# branch.oid ")
            head = oid if oid != "(initial)" else None
            continue
        fields = _FIELDS_BEFORE_PATH.get(text[:1])
        if fields is not None:
            parts = text.split(" ", fields)
            if len(parts) > fields:
                paths.append(parts[fields])
    snapshot = WorktreeSnapshot(head=head, taken_ns=taken)
    for path in paths:
        snapshot.files[path] = _state(worktree / path, hash_it=True)
    return snapshot


def touched_paths(
    worktree: Path, before: WorktreeSnapshot, after: WorktreeSnapshot, *, limit: int
) -> list[str]:
    """The paths the stage touched between `before` and `after`, sorted, at most `limit`."""
    found: set[str] = set()
    for path in before.files.keys() | after.files.keys():
        old, new = before.files.get(path), after.files.get(path)
        if old is None or new is None or _differs(old, new, before.taken_ns):
            found.add(path)
    if before.head and after.head and before.head != after.head:
        found.update(_committed(worktree, before.head, after.head))
    return sorted(found)[:limit]


def _differs(old: FileState, new: FileState, taken_ns: int) -> bool:
    if old.mode != new.mode or old.size != new.size:
        return True
    racy = old.mtime_ns >= taken_ns - RACY_NS
    if old.mtime_ns == new.mtime_ns and not racy:
        return False
    if old.digest is None or new.digest is None:
        return old.mtime_ns != new.mtime_ns or not old.exists
    return old.digest != new.digest


def _committed(worktree: Path, old: str, new: str) -> Iterable[str]:
    proc = run_git(
        ["diff", "--name-only", "-z", "--no-renames", old, new], cwd=worktree, check=False
    )
    if proc.returncode != 0:
        return []
    return [p.decode("utf-8", "surrogateescape") for p in proc.stdout.split(b"\0") if p]


def _state(path: Path, *, hash_it: bool) -> FileState:
    try:
        st = os.lstat(path)
    except OSError:
        return FileState(0, 0, 0, None)
    digest = None
    if hash_it and stat.S_ISREG(st.st_mode) and st.st_size <= HASH_LIMIT:
        digest = _hash(path)
    elif stat.S_ISLNK(st.st_mode):
        digest = os.readlink(path)
    return FileState(st.st_size, st.st_mtime_ns, stat.S_IFMT(st.st_mode), digest)


def _hash(path: Path) -> str | None:
    import xxhash

    hasher = xxhash.xxh3_64()
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                hasher.update(chunk)
    except OSError:
        return None
    return hasher.hexdigest()
