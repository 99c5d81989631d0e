"""Meta snapshots: the run's metadata tree, committed on its own orphan ref.

A snapshot is a commit whose tree is the previous snapshot's tree with a handful of
paths replaced, added or removed. Only the trees on the way from the root to a changed
path are rebuilt; every other entry keeps the object id it already had, so an
unchanged `nodes/plan/` is the same tree object in every later snapshot and the cost
of a snapshot grows with what changed, not with the history or the size of the tree.

The entries of the trees it wrote are kept in memory between snapshots of one run, in
git's order and already serialised, so the next snapshot neither reads back from disk
the trees the previous one just wrote nor re-serialises a big `nodes/` entry by entry. All objects are
written before the ref moves, and the ref moves by compare-and-swap from the tip the
caller last saw, so a crash at any point leaves either the old snapshot or the new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import msgspec
from dulwich.objects import Tree

from fabro_git.errors import StoreError
from fabro_git.store.repo import GitRepo
from fabro_git.store.treelisting import TreeListing

_DIR = 0o040000
_FILE = 0o100644
_CACHE_LIMIT = 4096
# Files at least this big are written on threads of their own, at most _WRITERS at once.
_PARALLEL_MIN = 1 << 20
_WRITERS = 2


class SnapshotResult(msgspec.Struct, frozen=True):
    commit_sha: str
    entry_count: int  # files written (deletions not counted)
    bytes: int  # total size of the files written


class StoredBlob(msgspec.Struct, frozen=True):
    """A file already written to the object store (`GitRepo.store_file`): a snapshot
    names it by id instead of holding its bytes."""

    sha: str
    size: int


# A change set shaped like the tree: name -> new bytes or a stored blob, None (delete)
# or a nested dict.
_Changes = dict[bytes, "bytes | StoredBlob | _Changes | None"]


class MetaSnapshotter:
    """Writes successive snapshots of one run's metadata tree to `ref`."""

    def __init__(self, repo: GitRepo, ref: str) -> None:
        self.repo = repo
        self.ref = ref
        self._listings: dict[str, TreeListing] = {}
        # The listings this write looked at or made: the trees of the new tip.
        self._fresh: dict[str, TreeListing] = {}
        # Within one write, blob ids by the bytes object they were made from: the same
        # bytes under two paths (an offloaded value's two files) are hashed once.
        self._blob_ids: dict[int, str] = {}
        # The commit this snapshotter last made and its tree: the next snapshot builds
        # on it without reading the commit back from disk.
        self._made: tuple[str, str] | None = None

    def write(
        self,
        files: Mapping[str, bytes | StoredBlob | None],
        message: str,
        *,
        expected_tip: str | None,
        then: Callable[[str], object] | None = None,
    ) -> SnapshotResult:
        """Commit the tree at `expected_tip` with `files` applied, then move the ref.

        `files` maps a slash-separated path to its new content, or to None to delete
        it (a whole directory may be deleted that way). RefRaceError if the ref is no
        longer at `expected_tip`; nothing is overwritten then. `then` is called with the
        new commit before the ref moves: the objects it stores (the run branch's commit,
        which names this one) go into the snapshot's pack.
        """
        changes = _nest(files)
        self._fresh = {}
        self._blob_ids = {}
        self._store_big(files.values())
        base_tree: str | None = None
        if expected_tip is not None:
            made = self._made
            base_tree = (
                made[1] if made is not None and made[0] == expected_tip else None
            ) or self.repo.commit_info(expected_tip).tree
        # The snapshot's new objects, a dozen small ones, go to disk as one pack.
        with self.repo.objects.batch():
            root = self._apply(base_tree, changes, "")
            if root is None:
                root = self.repo.store_object(Tree())
            commit = self.repo.write_commit(
                tree=root,
                parents=[expected_tip] if expected_tip is not None else [],
                message=message,
            )
            if then is not None:
                then(commit)
        subject = message.strip().split("\n", 1)[0]
        self.repo.update_ref(self.ref, commit, old=expected_tip, message=f"fabro: {subject}")
        self._made = (commit, root)
        # Only the new tip's trees are built on next: older listings would only grow the
        # heap (a thousand-entry nodes/ per stage) for the garbage collector to walk.
        self._listings = self._fresh
        self._blob_ids = {}
        written = [v for v in files.values() if v is not None]
        size = sum(v.size if isinstance(v, StoredBlob) else len(v) for v in written)
        return SnapshotResult(commit_sha=commit, entry_count=len(written), bytes=size)

    def _apply(self, tree_sha: str | None, changes: _Changes, where: str) -> str | None:
        """Return the sha of `tree_sha` with `changes` applied; None if it ends up empty."""
        old = self._listing(tree_sha) if tree_sha is not None else TreeListing.empty()
        listing = old.copy()
        changed = False
        for name, change in changes.items():
            # Every change is applied: `changed` must not stop at the first.
            changed = self._apply_entry(listing, name, change, where) or changed
        if not listing.entries:
            return None
        if tree_sha is not None and not changed:
            return tree_sha
        # Hashed and written from the spliced bytes: building a dulwich Tree, even
        # parsed in C, costs a Python object per entry of a thousand-entry `nodes/` or
        # events shard at every snapshot.
        sha = self.repo.store_raw(b"tree", listing.raw())
        self._remember(sha, listing)
        return sha

    def _apply_entry(
        self,
        listing: TreeListing,
        name: bytes,
        change: bytes | StoredBlob | _Changes | None,
        where: str,
    ) -> bool:
        """Apply one entry's change to `listing` (a removal, a file, or a subtree's
        changes); whether the listing changed."""
        path = f"{where}{name.decode('utf-8', 'surrogateescape')}"
        current = listing.entries.get(name)
        if change is None:
            if current is None:
                return False
            listing.remove(name)
            return True
        if isinstance(change, bytes | StoredBlob):
            if current is not None and current[0] == _DIR:
                raise StoreError(
                    f"cannot write file {path} in {self.ref}: a directory of that name exists"
                )
            sha = change.sha if isinstance(change, StoredBlob) else self._blob(change)
            if current == (_FILE, sha):
                return False
            listing.put(name, _FILE, sha)
            return True
        if current is not None and current[0] != _DIR:
            raise StoreError(f"cannot write under {path}/ in {self.ref}: {path} is a file")
        sub = self._apply(current[1] if current is not None else None, change, path + "/")
        if sub is None:
            if current is None:
                return False
            listing.remove(name)
            return True
        if current == (_DIR, sub):
            return False
        listing.put(name, _DIR, sub)
        return True

    def _blob(self, data: bytes) -> str:
        sha = self._blob_ids.get(id(data))
        if sha is None:
            sha = self._blob_ids[id(data)] = self.repo.store_blob(data)
        return sha

    def _store_big(self, contents: Iterable[bytes | StoredBlob | None]) -> None:
        """Write the big files of a snapshot side by side, one thread each: hashing and
        compressing release the GIL, so two 50 MB files take little more than one."""
        big = {id(c): c for c in contents if isinstance(c, bytes) and len(c) >= _PARALLEL_MIN}
        if len(big) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=_WRITERS) as pool:
            shas = pool.map(self.repo.store_blob, big.values())
            self._blob_ids.update(zip(big, shas, strict=True))

    def _listing(self, sha: str) -> TreeListing:
        listing = self._listings.get(sha)
        if listing is not None:
            self._fresh[sha] = listing
        else:
            listing = TreeListing.parse(self.repo.tree_body(sha))
            self._remember(sha, listing)
        return listing

    def _remember(self, sha: str, listing: TreeListing) -> None:
        if len(self._listings) >= _CACHE_LIMIT:
            self._listings.clear()
        self._listings[sha] = listing
        self._fresh[sha] = listing


def _nest(files: Mapping[str, bytes | StoredBlob | None]) -> _Changes:
    root: _Changes = {}
    for path, content in files.items():
        parts = _split(path)
        node = root
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise StoreError(
                    f"snapshot writes both the file {'/'.join(p.decode() for p in parts[: i + 1])}"
                    f" and {path} beneath it"
                )
            node = child
        leaf = parts[-1]
        if isinstance(node.get(leaf), dict):
            raise StoreError(f"snapshot writes both the file {path} and paths beneath it")
        if isinstance(content, StoredBlob):
            node[leaf] = content
            continue
        if content is not None and not isinstance(content, bytes | bytearray | memoryview):
            raise TypeError(
                f"snapshot content for {path} must be bytes, not {type(content).__name__}"
            )
        node[leaf] = bytes(content) if content is not None else None
    return root


def _split(path: str) -> list[bytes]:
    parts = path.split("/")
    if not path or any(p in ("", ".", "..", ".git") or "\0" in p for p in parts):
        raise StoreError(f"{path!r} is not a valid path inside a snapshot")
    return [p.encode("utf-8", "surrogateescape") for p in parts]
