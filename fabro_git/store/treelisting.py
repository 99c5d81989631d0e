"""A tree's entries kept ready to write again with a few changed.

Rebuilding a tree of a thousand entries for one changed entry costs a Python object
per entry (dulwich's `Tree`, its serialiser) at every checkpoint: the run branch's root
in a worktree that grows, the metadata ref's `nodes/` and events shard. A listing keeps
the entries in git's order with each entry's bytes already made, so a changed tree is
one copy of three containers (in C), a `bisect` per change and one join.
"""

from __future__ import annotations

import bisect

from dulwich.objects import parse_tree

DIR_MODE = 0o040000


class TreeListing:
    """A tree's entries: git's order, each entry's serialised bytes, name -> (mode, id)."""

    def __init__(
        self, keys: list[bytes], raw: dict[bytes, bytes], entries: dict[bytes, tuple[int, str]]
    ) -> None:
        self.keys = keys  # sort keys in git's order: a directory sorts as `name/`
        self._raw = raw  # sort key -> the entry's bytes in the tree object
        self.entries = entries  # name -> (mode, hex id)

    @classmethod
    def empty(cls) -> TreeListing:
        return cls([], {}, {})

    @classmethod
    def parse(cls, raw: bytes) -> TreeListing:
        """The listing of a tree object's body, as git wrote it (so in git's order)."""
        keys: list[bytes] = []
        chunks: dict[bytes, bytes] = {}
        entries: dict[bytes, tuple[int, str]] = {}
        for name, mode, hexsha in parse_tree(raw, 20):
            key = name + b"/" if mode == DIR_MODE else name
            keys.append(key)
            chunks[key] = b"%o %s\0%s" % (mode, name, bytes.fromhex(hexsha.decode()))
            entries[name] = (mode, hexsha.decode())
        if keys != sorted(keys):
            keys.sort()  # not git's order (a tree from elsewhere): write it in git's
        return cls(keys, chunks, entries)

    def copy(self) -> TreeListing:
        return TreeListing(list(self.keys), dict(self._raw), dict(self.entries))

    def put(self, name: bytes, mode: int, sha: str) -> None:
        if name in self.entries:
            self.remove(name)
        key = name + b"/" if mode == DIR_MODE else name
        bisect.insort(self.keys, key)
        self._raw[key] = b"%o %s\0%s" % (mode, name, bytes.fromhex(sha))
        self.entries[name] = (mode, sha)

    def remove(self, name: bytes) -> None:
        mode, _sha = self.entries.pop(name)
        key = name + b"/" if mode == DIR_MODE else name
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self._raw[key]

    def raw(self) -> bytes:
        """The tree object's body."""
        return b"".join(map(self._raw.__getitem__, self.keys))
