"""Staging a small change in process, without starting git.

After a stage, `git add -A` and `git write-tree` cost two processes, most of a
checkpoint when the stage changed a file or two. When an `lstat` walk against the
worktree's index (`statcheck.scan`) finds a small change set, the changed files are
hashed here, the index entries for them rewritten with their new stat data, and the new
tree built from the previous one by replacing only the trees on the way to each change.
The result is the tree git would write, byte for byte.

Git stays in charge of everything this module does not reproduce exactly, and the
caller falls back to `git add -A` when any of it is in play:
- content conversion: a `.gitattributes` (in the worktree, `info/attributes` or the
  user's attributes file) that sets `filter`, `text`, `eol`, `ident`, `crlf`,
  `working-tree-encoding` or `binary`, or defines a macro; `core.autocrlf`;
- ignore rules, for files the index does not know yet: a file that any pattern of any
  `.gitignore`, `info/exclude` or the user's excludes file might match, read widely
  (tracked files are staged whatever those say);
- `core.fileMode=false`, `core.symlinks=false`, `core.ignoreCase`, split or sparse
  indexes, gitlinks and nested repositories, special files, and an index that moved.

The stage's new objects are carried into the checkpoint's pack (`LooseObjects.batch`
with `carry`), and the index, which names them, is written once they are on disk
(`PendingIndex`): a stage makes no object file of its own. An index git rewrote in
between (a hook's `git add`) is left as git wrote it.

The index is written to a temporary file renamed into place, in the version it had,
without its cache extensions: git rebuilds its cache-tree and untracked
cache on its next write, and a stale one would mislead it. Entries keep git's "racily
clean" rule: an entry whose mtime is not older than the index is hashed again by the
next reader, here and in git, so a file rewritten in the same tick is never missed.
Like git, the index is fsync'ed only when `core.fsync` names `index` (not by default):
it is a cache of the worktree.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from dulwich.objects import Blob, ObjectID

from fabro_git.errors import FabroError
from fabro_git.files import read_regular
from fabro_git.store import statcheck
from fabro_git.store._gitcli import config_entries, run_git
from fabro_git.store.durability import durability
from fabro_git.store.repo import GitRepo
from fabro_git.store.treelisting import TreeListing

if TYPE_CHECKING:
    from dulwich.index import IndexEntry

MAX_CHANGES = 256
MAX_BYTES = 32 * 1024 * 1024
_DIR = 0o040000
_LINK = 0o120000
_NAME_MASK = 0xFFF
_BLOB_CHANGING = re.compile(
    rb"(?:^|\s)[-!]?(?:filter|text|eol|ident|crlf|working-tree-encoding|binary)(?:[=\s]|$)"
    rb"|^\s*\[attr\]"
)


class _Settings(msgspec.Struct, frozen=True):
    """The git configuration that decides whether staging here matches git."""

    supported: bool
    ignore_files: tuple[Path, ...]
    attribute_files: tuple[Path, ...]


class _Conflict(Exception):
    """A file became a directory or the reverse: left to git."""


Stamp = tuple[int, int]


class PendingIndex:
    """The index a staging will write once its objects are on disk, and then the stamp
    of the index written (None: it was not written, and only git knows the index)."""

    def __init__(
        self,
        stager: Stager,
        seen: Stamp,
        old: statcheck.IndexState,
        entries: dict[bytes, IndexEntry],
    ) -> None:
        self._stager = stager
        self._seen = seen
        self._old = old
        self._entries: dict[bytes, IndexEntry] | None = entries
        self.done = False
        self.stamp: Stamp | None = None

    def settle(self) -> Stamp | None:
        """The stamp of the index once written: the objects are written now if they are
        still waiting."""
        if not self.done:
            self._stager.repo.objects.flush()
        return self.stamp

    def write(self) -> None:
        """Write the index, unless it changed since the scan: a rename over an index git
        wrote meanwhile would undo what git recorded there."""
        entries, self._entries = self._entries, None
        self.done = True
        if entries is None:
            return
        try:
            if statcheck.index_stamp(self._stager.worktree) == self._seen:
                self.stamp = self._stager.write_index(self._old, entries)
        except (OSError, _Conflict):
            self.stamp = None  # the next staging asks git


class Stager:
    """Stages one worktree's small changes in process (see the module docstring)."""

    def __init__(self, repo: GitRepo, worktree: Path) -> None:
        self.repo = repo
        self.worktree = Path(worktree)
        self._settings: tuple[tuple[object, ...], _Settings] | None = None
        self._encoded: dict[bytes, tuple[IndexEntry, bytes, bytes]] = {}
        # The trees the last staging wrote or read, ready to write again with a change.
        self._listings: dict[str, TreeListing] = {}

    def stage(
        self, base_tree: str, stamp: Stamp | PendingIndex | None
    ) -> tuple[str, Stamp | PendingIndex | None] | None:
        """The worktree's tree, and its index's new stamp (or the index write waiting for
        the tree's objects), when the index still is the one `stamp` names and
        `base_tree` was written from it; None when git must do it."""
        if isinstance(stamp, PendingIndex):
            try:
                stamp = stamp.settle()
            except (FabroError, OSError):
                return None  # git will write them, or say what is wrong
        # A special file where git would read one raises: git would hang on it.
        changes = statcheck.scan(self.worktree, stamp, limit=MAX_CHANGES)
        if changes is None or stamp is None:
            return None
        if changes.count == 0:
            return base_tree, stamp
        try:
            return self._stage(base_tree, changes, stamp)
        except (FabroError, OSError, _Conflict):
            return None  # git will do it, and say what is wrong if anything is

    def _stage(
        self, base_tree: str, changes: statcheck.WorktreeChanges, stamp: Stamp
    ) -> tuple[str, PendingIndex] | None:
        settings = self._current_settings()
        if not settings.supported:
            return None
        # The user's files are read as git reads them, symlinks followed; the worktree's
        # own are not followed (git does not follow them either).
        if changes.added:
            sources = [(path, True) for path in settings.ignore_files]
            sources += [(self.worktree / os.fsdecode(p), False) for p in changes.ignore_files]
            if _may_be_ignored(list(changes.added), _ignore_patterns(sources)):
                return None
        to_hash = {**changes.changed, **changes.added}
        if any(len(path) >= _NAME_MASK for path in to_hash):
            return None
        attribute_files = [(path, True) for path in settings.attribute_files]
        attribute_files += [
            (self.worktree / os.fsdecode(p), False) for p in changes.attribute_files
        ]
        if to_hash and _sets_conversion(attribute_files):
            return None
        if sum(st.st_size for st in to_hash.values()) > MAX_BYTES:
            return None
        # The stage's blobs and trees go to disk with the checkpoint's pack, and the
        # index that names them after it.
        with self.repo.objects.batch(carry=True):
            staged = self._objects(base_tree, changes, to_hash)
        if staged is None:
            return None
        tree, entries = staged
        pending = PendingIndex(self, stamp, changes.index, entries)
        self.repo.objects.when_written(pending.write)
        return tree, pending

    def _objects(
        self,
        base_tree: str,
        changes: statcheck.WorktreeChanges,
        to_hash: dict[bytes, os.stat_result],
    ) -> tuple[str, dict[bytes, IndexEntry]] | None:
        """Store the changed files' blobs and the trees above them: the worktree's tree
        and the index entries that name it; None when a file is still being written."""
        from dulwich.index import IndexEntry as Entry

        root = os.fsencode(self.worktree)
        entries = dict(changes.index.entries)
        leaves: dict[bytes, tuple[int, str] | None] = {}
        for path, st in to_hash.items():
            full = os.path.join(root, path)
            if stat.S_ISLNK(st.st_mode):
                data, mode = os.readlink(full), _LINK
            else:
                with open(full, "rb") as f:
                    data = f.read()
                mode = 0o100755 if st.st_mode & 0o100 else 0o100644
            after = os.lstat(full)
            if after.st_mtime_ns != st.st_mtime_ns or after.st_size != len(data):
                return None  # still being written: let git look
            sha = self.repo.store_object(Blob.from_string(data))
            leaves[path] = (mode, sha)
            entries[path] = Entry(
                ctime=(st.st_ctime_ns // 1_000_000_000, st.st_ctime_ns % 1_000_000_000),
                mtime=(st.st_mtime_ns // 1_000_000_000, st.st_mtime_ns % 1_000_000_000),
                dev=st.st_dev & 0xFFFFFFFF,
                ino=st.st_ino & 0xFFFFFFFF,
                mode=mode,
                uid=st.st_uid & 0xFFFFFFFF,
                gid=st.st_gid & 0xFFFFFFFF,
                size=st.st_size & 0xFFFFFFFF,
                sha=ObjectID(sha.encode()),
            )
        for path in changes.deleted:
            leaves[path] = None
            del entries[path]
        fresh: dict[str, TreeListing] = {}
        tree = _apply(self.repo, base_tree, _nest(leaves), self._listings, fresh)
        if tree is None:
            tree = self.repo.store_raw(b"tree", b"")
        # Only the new tree's listings are built on next: older ones would only grow.
        self._listings = fresh
        return tree, entries

    def write_index(
        self, old: statcheck.IndexState, entries: dict[bytes, IndexEntry]
    ) -> Stamp | None:
        path = statcheck.index_path(self.worktree)
        if path is None:
            raise _Conflict
        data = self._encode_index(entries, old.version)
        data += hashlib.sha1(data).digest()
        # Not through `index.lock`: a kill -9 while holding it would leave a lock that
        # blocks every git command in the worktree, resume's reset included. A private
        # temporary file renamed over the index is as atomic; a git process writing the
        # index at the same moment wins or loses the rename, and either way the next
        # scan sees an index it did not write and asks git.
        tmp = path.with_name(f"index.fabro-{os.getpid()}")
        if path.with_name("index.lock").exists():
            raise _Conflict  # git is writing the index right now
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                if durability(self.repo.root).index:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        stamp = statcheck.index_stamp(self.worktree)
        if stamp is not None:
            state = statcheck.IndexState(entries, old.version, ())
            statcheck.remember_index(path, stamp, state)
        return stamp

    def _encode_index(self, entries: dict[bytes, IndexEntry], version: int) -> bytes:
        """The index file's bytes, before its checksum. An entry's encoding is kept
        between writes and reused while the entry, and the path before it (which v4
        compresses against), are the same: the cost follows the change."""
        import io

        from dulwich.index import Stage, write_cache_entry

        cache, fresh = self._encoded, {}
        parts = [b"DIRC", struct.pack(">LL", version, len(entries))]
        previous = b""
        for name in sorted(entries):
            entry = entries[name]
            known = cache.get(name)
            if known is not None and known[0] is entry and known[1] == previous:
                encoded = known[2]
            else:
                buffer = io.BytesIO()
                serialized = entry.serialize(name, Stage.NORMAL)
                write_cache_entry(buffer, serialized, version=version, previous_path=previous)
                encoded = buffer.getvalue()
            fresh[name] = (entry, previous, encoded)
            parts.append(encoded)
            previous = name
        self._encoded = fresh
        return b"".join(parts)

    def _current_settings(self) -> _Settings:
        key = tuple(_stamp(p) for p in self._config_files())
        if self._settings is None or self._settings[0] != key:
            self._settings = (key, self._read_settings())
        return self._settings[1]

    def _config_files(self) -> list[Path]:
        home = Path.home()
        xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        index = statcheck.index_path(self.worktree)
        own = [index.parent / "config.worktree"] if index is not None else []
        return [
            Path(self.repo.git_dir) / "config",
            *own,
            home / ".gitconfig",
            xdg / "git" / "config",
        ]

    def _read_settings(self) -> _Settings:
        # Asked in the worktree, so that its own `config.worktree` counts.
        config = config_entries(run_git(["config", "--null", "--list"], cwd=self.worktree))

        def flag(name: str, default: bool) -> bool:
            value = config.get(name)
            if value is None:
                return default
            return value.strip().lower() in ("true", "yes", "on", "1", "")

        autocrlf = config.get("core.autocrlf", "false").strip().lower()
        supported = (
            autocrlf in ("false", "no", "off", "0")
            and flag("core.filemode", True)
            and flag("core.symlinks", True)
            and not flag("core.ignorecase", False)
            and not flag("core.splitindex", False)
            and not flag("core.precomposeunicode", False)
        )
        xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "git"
        git_dir = Path(self.repo.git_dir)
        excludes = config.get("core.excludesfile")
        attributes = config.get("core.attributesfile")
        return _Settings(
            supported=supported,
            ignore_files=(
                git_dir / "info" / "exclude",
                Path(os.path.expanduser(excludes)) if excludes else xdg / "ignore",
            ),
            attribute_files=(
                git_dir / "info" / "attributes",
                Path(os.path.expanduser(attributes)) if attributes else xdg / "attributes",
            ),
        )


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _lines(path: Path, *, follow: bool) -> list[bytes] | None:
    """The pattern lines of an ignore or attributes file (none when it is missing); None
    when it is no regular file (`follow` False: a symlink, which git does not follow in
    the worktree), so git decides: a stage may leave a `.gitignore` linked to
    `/dev/zero`, or a FIFO, which a read would never finish.

    Remembered between stages by the file's stat data, and only for a file last written
    well before it was read: one rewritten within the same timestamp tick as a read
    would otherwise keep its stat data, as git's racily clean index entries would."""
    key = os.fspath(path)
    try:
        st = os.stat(key, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not stat.S_ISREG(st.st_mode):
        return None
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _read_lines.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    read_at = time.time_ns()
    read = read_regular(key, limit=_MAX_PATTERN_BYTES + 1, follow=follow)
    if read is None or len(read[0]) > _MAX_PATTERN_BYTES:
        return None
    data = read[0]
    lines = [
        line for line in data.splitlines() if line.strip() and not line.lstrip().startswith(b"#")
    ]
    if read_at - max(st.st_mtime_ns, st.st_ctime_ns) > _SETTLED_NS:
        if len(_read_lines) >= 256:
            _read_lines.clear()
        _read_lines[key] = (stamp, lines)
    return lines


# The lines of the ignore and attributes files read so far, by path, with their stat data.
_read_lines: dict[str, tuple[tuple[int, int, int, int], list[bytes]]] = {}
# How long before it is read a file must have been written for its lines to be kept.
_SETTLED_NS = 100_000_000
# An ignore or attributes file larger than this is left to git.
_MAX_PATTERN_BYTES = 16 * 1024 * 1024


def _ignore_patterns(paths: list[tuple[Path, bool]]) -> list[re.Pattern[bytes]] | None:
    """Every positive ignore pattern of `paths`, widened so that it matches at least
    what git's would (`*` and `?` also cross `/`, `**` is `*`, anchors and the
    directory-only slash are dropped); None when a pattern cannot be widened safely, or
    a file cannot be read as a regular file (`_lines`)."""
    import fnmatch

    found = []
    for path, follow in paths:
        lines = _lines(path, follow=follow)
        if lines is None:
            return None
        for line in lines:
            pattern = line.strip()
            if pattern.startswith(b"!"):
                continue  # a negation can only un-ignore
            if b"\\" in pattern or b"[" in pattern:
                return None
            pattern = pattern.replace(b"**", b"*").strip(b"/")
            if pattern:
                regex = fnmatch.translate(os.fsdecode(pattern))
                found.append(re.compile(regex.encode("utf-8", "surrogateescape")))
    return found


def _may_be_ignored(paths: list[bytes], patterns: list[re.Pattern[bytes]] | None) -> bool:
    """False only when no ignore pattern can match a path or one of its directories,
    which is when git certainly adds it. Git ignores a path when the last pattern that
    matches it (or a directory above it) is positive, so if no positive pattern matches
    any part of it, wherever the pattern's file lives, nothing ignores it."""
    if patterns is None:
        return True
    if not patterns:
        return False
    for path in paths:
        parts = path.split(b"/")
        pieces = [
            b"/".join(parts[start:end])
            for start in range(len(parts))
            for end in range(start + 1, len(parts) + 1)
        ]
        if any(p.match(piece) for p in patterns for piece in pieces):
            return True
    return False


def _sets_conversion(paths: list[tuple[Path, bool]]) -> bool:
    """True when an attributes file sets anything that can change a blob's bytes, or
    cannot be read as a regular file."""
    for path, follow in paths:
        lines = _lines(path, follow=follow)
        if lines is None or any(_BLOB_CHANGING.search(line) for line in lines):
            return True
    return False


# A change set shaped like the tree: name -> (mode, sha), None (delete) or a nested dict.
_Changes = dict[bytes, "tuple[int, str] | _Changes | None"]


def _nest(leaves: dict[bytes, tuple[int, str] | None]) -> _Changes:
    root: _Changes = {}
    for path, leaf in leaves.items():
        *dirs, name = path.split(b"/")
        node = root
        for part in dirs:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise _Conflict  # `a` deleted or changed, and `a/b` added
            node = child
        if isinstance(node.get(name), dict):
            raise _Conflict
        node[name] = leaf
    return root


def _apply_entry(
    repo: GitRepo,
    listing: TreeListing,
    name: bytes,
    change: tuple[int, str] | _Changes | None,
    known: dict[str, TreeListing],
    fresh: dict[str, TreeListing],
) -> bool:
    """Apply one entry's change to `listing` (a removal, a file, or a subtree's
    changes); whether the listing changed."""
    current = listing.entries.get(name)
    if change is None:
        if current is None:
            return False
        if current[0] == _DIR:
            raise _Conflict
        listing.remove(name)
        return True
    if isinstance(change, tuple):
        if current is not None and current[0] == _DIR:
            raise _Conflict
        if current == change:
            return False
        listing.put(name, *change)
        return True
    if current is not None and current[0] != _DIR:
        raise _Conflict
    sub = _apply(repo, current[1] if current is not None else None, change, known, fresh)
    if sub is None:
        if current is None:
            return False
        listing.remove(name)
        return True
    if current == (_DIR, sub):
        return False
    listing.put(name, _DIR, sub)
    return True


def _apply(
    repo: GitRepo,
    tree_sha: str | None,
    changes: _Changes,
    known: dict[str, TreeListing],
    fresh: dict[str, TreeListing],
) -> str | None:
    """`tree_sha` with `changes` applied, writing only the trees that change; None when
    the result is empty (git leaves empty directories out). The listings of the trees
    the last staging wrote come from `known`; those of the new tree's trees go into
    `fresh`."""
    if tree_sha is None:
        old = TreeListing.empty()
    else:
        found = known.get(tree_sha)
        old = found if found is not None else TreeListing.parse(repo.tree_body(tree_sha))
        fresh[tree_sha] = old
    listing = old.copy()
    changed = False
    for name, change in changes.items():
        # Every change is applied: `changed` must not stop at the first.
        changed = _apply_entry(repo, listing, name, change, known, fresh) or changed
    if not listing.entries:
        return None
    if tree_sha is not None and not changed:
        return tree_sha
    sha = repo.store_raw(b"tree", listing.raw())
    fresh[sha] = listing
    return sha
