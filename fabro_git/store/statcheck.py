"""A fast "did anything change?" check for small worktrees, before asking git.

Turning a worktree into a tree costs two git processes (`add -A`, `write-tree`) even when
a stage touched nothing, and many stages touch nothing. For a worktree whose index is
small, one `lstat` per file against the stat data git itself recorded in the index
answers the question in well under a millisecond.

`scan` goes one step further and lists what differs (files whose stat data changed,
files the index does not know, files gone), for `staging` to record in process.

The check only ever says "unchanged" when that is certain; every doubt sends the caller
back to git: a path the index does not know (even an ignored one), a missing path, a
size, mode, inode or mtime that differs, an mtime not older than the index itself (git's
"racily clean" rule), a gitlink, or an index written since the caller last looked.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from fabro_git.errors import StoreError

if TYPE_CHECKING:
    from dulwich.index import IndexEntry

MAX_ENTRIES = 5000


def index_path(worktree: Path) -> Path | None:
    """The index file of `worktree` (a main worktree's `.git/index`, or the one in the
    linked worktree's own git dir that its `.git` file names); None when it has none.

    Asked several times a stage: a linked worktree's answer is kept for as long as its
    `.git` file is the same file with the same contents (same inode, size and mtime), so
    one `stat` answers it after the first time.
    """
    dotgit = os.path.join(worktree, ".git")
    try:
        st = os.stat(dotgit)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return Path(dotgit, "index")
    key = (dotgit, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _linked_index.get(key)
    if known is not None:
        return known
    try:
        with open(dotgit, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    gitdir = Path(text[len("gitdir:") :].strip())
    if not gitdir.is_absolute():
        gitdir = (Path(worktree) / gitdir).resolve()
    if len(_linked_index) > 64:
        _linked_index.clear()
    path = _linked_index[key] = gitdir / "index"
    return path


# Linked worktrees' index files, by their `.git` file's path and stat data.
_linked_index: dict[tuple[str, int, int, int], Path] = {}


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


class IndexState(msgspec.Struct):
    """A parsed worktree index: its entries, format version and extension signatures."""

    entries: dict[bytes, IndexEntry]
    version: int
    extensions: tuple[bytes, ...]
    # What each entry's stat data must be for the file to be unchanged (`_stat_keys`).
    stat_keys: dict[bytes, tuple[int, int, int, int, int]] | None = None


# The index parsed last time, keyed by its file and stamp: between stages that change
# nothing, git never rewrites it, so it is parsed once and then only stat'ed.
_parsed: dict[tuple[Path, tuple[int, int]], IndexState] = {}


def read_index(path: Path, stamp: tuple[int, int]) -> IndexState | None:
    """The index at `path` as of `stamp`; None when it cannot be used in process (a
    conflict, split index, sparse directories, too many entries, unreadable)."""
    cached = _parsed.get((path, stamp))
    if cached is not None:
        return cached
    from dulwich.index import IndexChecksumReader, read_index_dict_with_version
    from dulwich.index import IndexEntry as Entry

    try:
        with open(path, "rb") as f:
            reader = IndexChecksumReader(f)
            found, version, extensions = read_index_dict_with_version(reader)
            reader.check_checksum(allow_empty=True)
    except Exception:
        return None
    if len(found) > MAX_ENTRIES:
        return None
    signatures = tuple(ext.signature for ext in extensions)
    if b"link" in signatures or b"sdir" in signatures:
        return None
    entries: dict[bytes, IndexEntry] = {}
    for name, item in found.items():
        if not isinstance(item, Entry) or item.extended_flags:  # conflicted, skip-worktree
            return None
        entries[name] = item
    state = IndexState(entries, version, signatures)
    _parsed.clear()
    _parsed[(path, stamp)] = state
    return state


def remember_index(path: Path, stamp: tuple[int, int], state: IndexState) -> None:
    """Record an index the caller has just written, so it is not parsed back."""
    _parsed.clear()
    _parsed[(path, stamp)] = state


class WorktreeChanges(msgspec.Struct):
    """How a worktree differs from its index, as far as `lstat` can tell.

    `changed` holds tracked files whose stat data differs (or is racily clean: their
    content must be hashed to know), `added` files the index does not know, `deleted`
    index entries with no file. `ignore_files` and `attribute_files` are the
    `.gitignore` and `.gitattributes` files the walk passed, wherever they are.
    """

    index: IndexState
    changed: dict[bytes, os.stat_result] = msgspec.field(default_factory=dict)
    added: dict[bytes, os.stat_result] = msgspec.field(default_factory=dict)
    deleted: list[bytes] = msgspec.field(default_factory=list)
    ignore_files: list[bytes] = msgspec.field(default_factory=list)
    attribute_files: list[bytes] = msgspec.field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.changed) + len(self.added) + len(self.deleted)


def scan(worktree: Path, stamp: tuple[int, int] | None, *, limit: int) -> WorktreeChanges | None:
    """The worktree's differences from its index, when the index is the one the caller
    saw (`stamp`). None whenever only git can say: more than `limit` differences, a
    gitlink or nested repository, a special file, an index that cannot be read here."""
    if stamp is None:
        return None
    path = index_path(worktree)
    if path is None or index_stamp(worktree) != stamp:
        return None
    index = read_index(path, stamp)
    if index is None:
        return None
    entries = index.entries
    keys = _stat_keys(index)
    result = WorktreeChanges(index)
    seen = 0
    stack = [b""]
    root = os.fsencode(worktree)
    while stack:
        rel = stack.pop()
        if rel in entries:
            return None  # a file or link that became a directory
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                listed = list(it)
        except OSError:
            return None
        counted = _compare_directory(listed, rel, keys, result, stamp[0], stack, limit)
        if counted is None:
            return None
        seen += counted
    if seen != len(entries) and not _find_deleted(root, entries, result, seen, limit):
        return None
    return result


def _compare_directory(
    listed: list[os.DirEntry[bytes]],
    rel: bytes,
    keys: dict[bytes, tuple[int, int, int, int, int]],
    result: WorktreeChanges,
    index_mtime: int,
    subdirectories: list[bytes],
    limit: int,
) -> int | None:
    """Sort the files of one directory into `result` (its subdirectories onto
    `subdirectories`); the number of index entries found, or None when only git can
    say."""
    changed, added = result.changed, result.added
    is_dir, is_reg, is_link = stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK
    prefix = rel + b"/" if rel else b""
    seen = 0
    # One pass of a Python loop per file of the worktree: what it does per file is
    # kept to the `lstat` and one tuple comparison.
    for found in listed:
        name = found.name  # bytes: the directory was named in bytes
        if name == b".git":
            if rel:
                return None  # a nested repository: git decides whether it is a gitlink
            continue
        relpath = prefix + name
        try:
            st = found.stat(follow_symlinks=False)
        except OSError:
            return None
        mode = st.st_mode
        if is_dir(mode):
            subdirectories.append(relpath)
            continue
        if not (is_reg(mode) or is_link(mode)):
            _refuse_special(name, relpath, mode)
            return None  # a special file: git skips it
        if name == b".gitignore":
            result.ignore_files.append(relpath)
        elif name == b".gitattributes":
            result.attribute_files.append(relpath)
        key = keys.get(relpath)
        if key is None:
            added[relpath] = st
        else:
            seen += 1
            # Unchanged only when the stat data certainly match what git recorded,
            # by git's own rules: "racily clean" included (an mtime not older than
            # the index proves nothing), an inode only when git recorded one.
            if st.st_mtime_ns < index_mtime and key == (
                st.st_size & 0xFFFFFFFF,
                st.st_mtime_ns // 1000,
                st.st_ctime_ns // 1000,
                2 if is_link(mode) else (1 if mode & 0o100 else 0),
                st.st_ino & 0xFFFFFFFF if key[4] else 0,
            ):
                continue
            changed[relpath] = st
        if len(changed) + len(added) > limit:
            return None
    return seen


# The files of the worktree git opens as it adds or checks out files: a FIFO by one of
# these names blocks git itself (and a `git add -A` run would never end).
_READ_BY_GIT = (b".gitignore", b".gitattributes")


def refuse_special_files(worktree: Path, paths: Collection[str] | None = None) -> None:
    """StoreError naming the first special file (a FIFO, socket or device) in `worktree`
    by a name git reads as it walks the worktree (`_READ_BY_GIT`), where a git command
    that walks it (`add -A`, `clean`) would wait on a FIFO for ever: what such a git,
    found waiting, is stopped with (`_gitcli.run_git`'s `on_fifo`), and, where that
    cannot be seen, asked before it. A walk of names and types only (no file is
    opened, nothing is followed), `.git` left out: about 30 ms for 50,000 files. With
    `paths` (what an `add` is limited to), only the directories on the way to them are
    looked at, as git only reads those."""
    if paths is None:
        found: Iterable[tuple[bytes, int]] = special_files(worktree)
    else:
        found = _special_on_the_way(os.fsencode(worktree), paths)
    for relpath, mode in found:
        _refuse_special(os.path.basename(relpath), relpath, mode)


def _special_on_the_way(root: bytes, paths: Collection[str]) -> Iterator[tuple[bytes, int]]:
    directories = {b""}
    for path in paths:
        parent = os.path.dirname(os.fsencode(path))
        while parent and parent not in directories:
            directories.add(parent)
            parent = os.path.dirname(parent)
    for directory in sorted(directories):
        for name in _READ_BY_GIT:
            relpath = os.path.join(directory, name) if directory else name
            try:
                mode = os.lstat(os.path.join(root, relpath)).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
                yield relpath, mode


def special_files(worktree: Path) -> Iterator[tuple[bytes, int]]:
    """The special files by a name git reads in `worktree` (see `refuse_special_files`):
    their paths relative to it, and their modes."""
    root = os.fsencode(worktree)
    stack = [b""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                listed = list(it)
        except OSError:
            continue  # gone, or not ours to read: git will say so if it matters
        for entry in listed:
            name = entry.name
            if name == b".git":
                continue
            path = os.path.join(rel, name) if rel else name
            if entry.is_dir(follow_symlinks=False):
                stack.append(path)
            elif (
                name in _READ_BY_GIT
                and not entry.is_file(follow_symlinks=False)
                and not entry.is_symlink()
            ):
                with contextlib.suppress(OSError):
                    yield path, entry.stat(follow_symlinks=False).st_mode


def _refuse_special(name: bytes, relpath: bytes, mode: int) -> None:
    """StoreError for a special file by a name git reads (`_READ_BY_GIT`)."""
    if name not in _READ_BY_GIT or stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    if stat.S_ISFIFO(mode):
        kind = "named pipe (FIFO)"
    elif stat.S_ISSOCK(mode):
        kind = "socket"
    else:
        kind = "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file"
    raise StoreError(
        f"{os.fsdecode(relpath)} is a {kind}, not a file: git reads every "
        f"{os.fsdecode(name)} and would wait on it for ever",
        hint="a stage left it in the run's worktree: remove it there, and from what made it",
    )


def _find_deleted(
    root: bytes, entries: Collection[bytes], result: WorktreeChanges, seen: int, limit: int
) -> bool:
    """Add the index's paths that are gone from the worktree to `result`; False when
    only git can say (too many, or a path both seen and missing)."""
    for relpath in entries:
        if not os.path.lexists(os.path.join(root, relpath)):
            result.deleted.append(relpath)
            if result.count > limit:
                return False
    return seen + len(result.deleted) == len(entries)  # else a directory in the way


# What the index says of each path, in the form an `lstat` is compared with, kept per
# entry object: entries that did not change between two index writes are the same
# objects, so a scan converts only the entries that did.
_keys: dict[bytes, tuple[object, tuple[int, int, int, int], int]] = {}


def _entry_key(path: bytes, entry: IndexEntry) -> tuple[tuple[int, int, int, int], int]:
    cached = _keys.get(path)
    if cached is not None and cached[0] is entry:
        return cached[1], cached[2]
    mode = entry.mode
    kind = 2 if stat.S_ISLNK(mode) else (1 if mode & 0o100 else 0)
    if mode == 0o160000:
        kind = -1  # a gitlink never matches a file
    mtime, ctime = _ns(entry.mtime), _ns(entry.ctime)
    key = (
        entry.size,
        -1 if mtime is None else mtime // 1000,
        -1 if ctime is None else ctime // 1000,
        kind,
    )
    if len(_keys) > 2 * MAX_ENTRIES:
        _keys.clear()
    _keys[path] = (entry, key, entry.ino)
    return key, entry.ino


def _stat_keys(index: IndexState) -> dict[bytes, tuple[int, int, int, int, int]]:
    """Each entry's stat data as `scan` compares it: (size, mtime and ctime in us, kind,
    inode or 0 when git recorded none). Made once per index; entries an index write kept
    are the same objects, so only the ones it changed are converted again."""
    if index.stat_keys is None:
        keys = {}
        for path, entry in index.entries.items():
            key, ino = _entry_key(path, entry)
            keys[path] = (*key, ino & 0xFFFFFFFF)
        index.stat_keys = keys
    return index.stat_keys


def unchanged(worktree: Path, stamp: tuple[int, int] | None) -> bool:
    """True only when the worktree certainly matches its index, and the index is the one
    the caller saw (`stamp`, from `index_stamp` right after it last staged)."""
    changes = scan(worktree, stamp, limit=0)
    return changes is not None and changes.count == 0
