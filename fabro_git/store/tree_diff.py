"""Which files differ between two trees, and their diff when it is small, read in process.

Only subtrees whose ids differ are read, so the cost follows the change, not the tree.
A stage's checkpoint asks for the files it touched and then its diff, of the same two
trees, and the next stage diffs against this stage's tree: the last answer and the last
few trees' entries are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

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
            out.writelines(file_diff(old_side, new_side, lambda sha: store[sha].as_raw_string()))
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


# -- one file's diff, in the form `git diff` gives it -----------------------------------------


def file_diff(old: _Side, new: _Side, content: Callable[[bytes], bytes]) -> Iterator[bytes]:
    """The lines of one file's diff between two sides (`content` gives a blob's bytes by
    its hex id): git's header, then "Binary files ... differ" or the unified hunks with
    three lines of context and git's "\\ No newline at end of file"."""
    old_path, old_mode, old_id = old
    new_path, new_mode, new_id = new
    yield from _diff_header(old, new)
    before, after = (
        _side_content(old_mode, old_id, content),
        _side_content(new_mode, new_id, content),
    )
    from_name, to_name = _patch_name(old_path, b"a"), _patch_name(new_path, b"b")
    if b"\0" in before[:8000] or b"\0" in after[:8000]:
        yield b"Binary files " + from_name + b" and " + to_name + b" differ\n"
        return
    yield from _hunks(_lines(before), _lines(after), from_name, to_name)


def _lines(data: bytes) -> list[bytes]:
    """A file's lines, each with its newline, as git splits them: at LF only (a CR is
    part of its line)."""
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _side_content(mode: int | None, sha: bytes | None, content: Callable[[bytes], bytes]) -> bytes:
    if sha is None:
        return b""
    if mode is not None and mode & 0o170000 == 0o160000:  # a submodule: its commit
        return b"Subproject commit " + sha + b"\n"
    return content(sha)


def _patch_name(path: bytes | None, root: bytes) -> bytes:
    return b"/dev/null" if path is None else root + b"/" + path


def _diff_header(old: _Side, new: _Side) -> Iterator[bytes]:
    (old_path, old_mode, old_id), (new_path, new_mode, new_id) = old, new
    old_path = old_path if old_path is not None else new_path
    new_path = new_path if new_path is not None else old_path
    yield b"diff --git " + _patch_name(old_path, b"a") + b" " + _patch_name(new_path, b"b") + b"\n"
    if old_mode != new_mode:
        if new_mode is None:
            yield f"deleted file mode {old_mode:o}\n".encode()
        else:
            if old_mode is not None:
                yield f"old file mode {old_mode:o}\n".encode()
            yield f"new file mode {new_mode:o}\n".encode()
    both = f" {new_mode:o}" if new_mode is not None and old_mode is not None else ""
    short = [b"0" * 7 if sha is None else sha[:7] for sha in (old_id, new_id)]
    yield b"index " + short[0] + b".." + short[1] + both.encode() + b"\n"


_NO_NEWLINE = b"\n\\ No newline at end of file\n"


def _hunks(a: list[bytes], b: list[bytes], from_name: bytes, to_name: bytes) -> Iterator[bytes]:
    from difflib import SequenceMatcher

    def last_line(line: bytes) -> bytes:
        return line if line.endswith(b"\n") else line + _NO_NEWLINE

    for number, group in enumerate(SequenceMatcher(a=a, b=b).get_grouped_opcodes(3)):
        if number == 0:
            yield b"--- " + from_name + b"\n"
            yield b"+++ " + to_name + b"\n"
        first, last = group[0], group[-1]
        ranges = _range(first[1], last[2]), _range(first[3], last[4])
        yield f"@@ -{ranges[0]} +{ranges[1]} @@\n".encode()
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (b" " + last_line(line) for line in a[i1:i2])
                continue
            if tag in ("replace", "delete"):
                yield from (b"-" + last_line(line) for line in a[i1:i2])
            if tag in ("replace", "insert"):
                yield from (b"+" + last_line(line) for line in b[j1:j2])


def _range(start: int, stop: int) -> str:
    """A hunk's range of lines as a unified diff writes it (`3`, `3,4`, `2,0`)."""
    length = stop - start
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"
