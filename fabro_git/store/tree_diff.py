"""Which files differ between two trees, and their diff when it is small, read in process.

Only subtrees whose ids differ are read, so the cost follows the change, not the tree.
A stage's checkpoint asks for the files it touched and then its diff, of the same two
trees, and the next stage diffs against this stage's tree: the last answer and the last
few trees' entries are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

from dulwich.object_store import BaseObjectStore
from dulwich.objects import ObjectID, ShaFile, parse_tree

from fabro_git.errors import MissingObject

_SMALL_DIFF_FILES = 20
_SMALL_DIFF_BYTES = 256 * 1024
# One side of a file change: (path, mode, sha), all None for a side that does not exist.
_Side = tuple[bytes | None, int | None, ObjectID | None]
_ABSENT: _Side = (None, None, None)
_Entry = tuple[int, ObjectID]


def _is_tree(entry: _Entry | None) -> bool:
    return entry is not None and entry[0] & 0o170000 == 0o040000


class _Objects:
    """What a diff asks of an object store, an object by its hex id, answered by the
    repository's own reader (held bytes and loose files before the packs)."""

    def __init__(self, read: Callable[[str], ShaFile]) -> None:
        self._read = read

    def __getitem__(self, sha: bytes) -> ShaFile:
        return self._read(sha.decode())


class TreeDiffs:
    """Tree comparisons over one repository's objects: `read` gives an object by its hex
    id, `tree_body` a tree's raw entries."""

    def __init__(self, read: Callable[[str], ShaFile], tree_body: Callable[[str], bytes]) -> None:
        self._objects = _Objects(read)
        self._tree_body = tree_body
        self._entries_cache: dict[str, dict[bytes, _Entry]] = {}
        self._last_changes: tuple[tuple[str, str], int, list[tuple[_Side, _Side]]] | None = None

    def small_diff(self, old_tree: str, new_tree: str, *, max_bytes: int) -> str | None:
        """A unified diff between two trees, computed in-process when the change is small
        (a few files of modest size); None when it is not, so the caller can ask git.

        Spawning `git diff` costs more than the rest of a small checkpoint; for the
        handful of changed files a typical stage leaves, reading the blobs here is faster.
        A `git repack` beside it can move a blob out of its loose file between the two
        places it is looked for: the diff is read once more, then left to git.
        """
        for _ in range(2):
            try:
                return self._small_diff(old_tree, new_tree, max_bytes=max_bytes)
            except (KeyError, MissingObject):
                continue
        return None

    def _small_diff(self, old_tree: str, new_tree: str, *, max_bytes: int) -> str | None:
        import io

        from dulwich.patch import write_object_diff

        store = self._objects
        changes = self._changes(old_tree, new_tree, _SMALL_DIFF_FILES)
        if len(changes) > _SMALL_DIFF_FILES:
            return None
        total = 0
        for change in changes:
            for _, mode, sha in change:
                if sha is None or mode is None:
                    continue
                if mode & 0o170000 == 0o160000:
                    return None  # a submodule: leave it to git
                total += len(store[sha].as_raw_string())
                if total > _SMALL_DIFF_BYTES:
                    return None
        out = io.BytesIO()
        for old_side, new_side in changes:
            write_object_diff(out, cast(BaseObjectStore, store), old_side, new_side)
        data = out.getvalue()
        if len(data) > max_bytes:
            cut = data.rfind(b"\n", 0, max_bytes) + 1 or max_bytes
            return data[:cut].decode("utf-8", "replace") + f"[diff truncated at {cut} bytes]\n"
        return data.decode("utf-8", "replace")

    def changed_paths(self, old_tree: str, new_tree: str, *, limit: int) -> list[str]:
        """The paths of the files added, changed or removed between two trees, in path
        order; at most `limit` of them."""
        paths: list[str] = []
        for old_side, new_side in self._changes(old_tree, new_tree, limit):
            path = new_side[0] if new_side[0] is not None else old_side[0]
            if path is not None and (not paths or paths[-1] != path.decode()):
                paths.append(path.decode("utf-8", "replace"))
        return paths[:limit]

    def _changes(self, old_tree: str, new_tree: str, limit: int) -> list[tuple[_Side, _Side]]:
        """`_tree_changes` as a list, remembered for the last pair of trees: a stage's
        checkpoint asks for its files and then its diff, of the same two trees."""
        last = self._last_changes
        if last is not None and last[0] == (old_tree, new_tree) and last[1] >= limit:
            return last[2][: limit + 1]
        changes = list(self._tree_changes(old_tree, new_tree, b"", limit=limit))
        self._last_changes = ((old_tree, new_tree), limit, changes)
        return changes

    def _tree_changes(
        self, old_tree: str | None, new_tree: str | None, prefix: bytes, *, limit: int
    ) -> Iterator[tuple[_Side, _Side]]:
        """The files that differ between two trees, in path order, descending only into
        subtrees whose ids differ (so the cost follows the change, not the tree); at
        most `limit` + 1 of them."""
        if old_tree == new_tree:
            return
        old = self.entries(old_tree) if old_tree else {}
        new = self.entries(new_tree) if new_tree else {}
        names = {n for n, v in new.items() if old.get(n) != v} | {n for n in old if n not in new}

        def order(name: bytes) -> bytes:
            return name + b"/" if _is_tree(new.get(name) or old[name]) else name

        emitted = 0
        for name in sorted(names, key=order):
            for side in self._entry_changes(prefix + name, old.get(name), new.get(name), limit):
                yield side
                emitted += 1
                if emitted > limit:
                    return

    def _entry_changes(
        self, path: bytes, before: _Entry | None, after: _Entry | None, limit: int
    ) -> Iterator[tuple[_Side, _Side]]:
        """The file changes under one name: a file changed, added or removed, and the
        files of a subtree (a file that became a directory is removed first, one that
        replaced a directory is added after; git's order)."""
        before_file = before if before is not None and not _is_tree(before) else None
        after_file = after if after is not None and not _is_tree(after) else None
        if before_file is not None:
            new_side: _Side = _ABSENT
            if after_file is not None:
                new_side = (path, after_file[0], after_file[1])
            yield (path, before_file[0], before_file[1]), new_side
        elif after_file is not None and before is None:
            yield _ABSENT, (path, after_file[0], after_file[1])
        if _is_tree(before) or _is_tree(after):
            # The caller stops after `limit` + 1 in all, so the subtree may run to it.
            yield from self._tree_changes(
                before[1].decode() if before is not None and _is_tree(before) else None,
                after[1].decode() if after is not None and _is_tree(after) else None,
                path + b"/",
                limit=limit,
            )
            if after_file is not None:
                yield _ABSENT, (path, after_file[0], after_file[1])

    def entries(self, sha: str) -> dict[bytes, tuple[int, ObjectID]]:
        """A tree's entries, {name: (mode, hex id)}, parsed in C from its raw bytes.

        The last few are kept: a stage's tree is diffed against the one before, which
        was the new side of the stage before's diff. Building `TreeEntry` records for a
        thousand-entry tree, twice a stage, cost more than the rest of the diff.
        """
        cache = self._entries_cache
        entries = cache.pop(sha, None)
        if entries is None:
            raw = self._tree_body(sha)
            # parse_tree gives hex ids: ObjectIDs, typed as such without a call per entry.
            entries = cast(
                dict[bytes, tuple[int, ObjectID]],
                {name: (mode, hexsha) for name, mode, hexsha in parse_tree(raw, 20)},
            )
            if len(cache) >= 4:
                del cache[next(iter(cache))]
        cache[sha] = entries
        return entries
