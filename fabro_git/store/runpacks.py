"""The packs runs leave, merged across runs as they pile up.

A run leaves one pack (`packwrite.PackLadder.merge_all`). git counts packs for
`git gc --auto` (`gc.autoPackLimit`, 50), so fifty runs would wake a repack of the
whole repository in the user's next commit, and every object lookup asks each pack's
index in turn. The packs runs left are listed in `<git dir>/fabro/run-packs`, each with
a size class, and merged as they pile up: eight of a class become one of the next, the
rule of a run's own ladder, so an object is copied once per class it climbs. A merge
that would read more than `MERGE_MAX` is not made: its packs stay as they are.

Only packs this tool wrote are listed, and each is read again, and checked, before it
is merged: git's pack format 2 holding whole objects only, as `packwrite` writes them
(a delta's offset would be wrong in a copy). The list and the merges are taken under a
lock. A listed pack that is gone (a `git gc` folded it into its own) is dropped from
the list; its objects are git's now.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import struct
import zlib
from pathlib import Path

from fabro_git.store import packwrite

RUNG = 8
MERGE_MAX = 64 << 20
REGISTRY = "run-packs"
_IDX_HEADER = 8 + 256 * 4
_WHOLE = frozenset({1, 2, 3, 4})  # commit, tree, blob, tag: no delta
_NAME = re.compile(r"pack-[0-9a-f]{40}")


def register(
    pack_dir: str, fabro_dir: Path, packs: list[packwrite.Written], *, fsync: bool
) -> None:
    """List `packs` (a run's, at its end) among the runs' packs of the repository
    whose tool dir is `fabro_dir`, and merge a class that is full."""
    fabro_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(fabro_dir / f"{REGISTRY}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        listed = [
            (level, name)
            for level, name in _read_list(fabro_dir / REGISTRY)
            if os.path.isfile(os.path.join(pack_dir, name + ".idx"))
        ]
        listed += [(0, os.path.basename(p.base)) for p in packs]
        listed = _climb(pack_dir, listed, fsync=fsync)
        _write_list(fabro_dir / REGISTRY, listed)
    finally:
        os.close(fd)


def _climb(pack_dir: str, listed: list[tuple[int, str]], *, fsync: bool) -> list[tuple[int, str]]:
    """`listed` with every full class merged into one pack of the next."""
    level = 0
    while level <= max((lv for lv, _ in listed), default=-1):
        names = [name for lv, name in listed if lv == level]
        merged = _merge(pack_dir, names, fsync=fsync) if len(names) >= RUNG else None
        if merged is not None:
            gone = set(names)
            listed = [(lv, n) for lv, n in listed if n not in gone]
            listed.append((level + 1, merged))
        level += 1
    return listed


def _merge(pack_dir: str, names: list[str], *, fsync: bool) -> str | None:
    """The name of one pack of the objects of the packs `names`, which are then
    removed; None when they are not merged (too big, unreadable, not ours to copy)."""
    bases = [os.path.join(pack_dir, name) for name in names]
    try:
        if sum(os.path.getsize(base + ".pack") for base in bases) > MERGE_MAX:
            return None
        found = [load(base) for base in bases]
        entries = [packwrite.read_entries(w) for w in found if w is not None]
    except OSError:
        return None  # a pack went meanwhile: the next run's end tries again
    if any(w is None for w in found) or not all(_whole(e) for e in entries):
        return None
    merged = packwrite.write(pack_dir, [e for pack in entries for e in pack], fsync=fsync)
    for pack in found:
        if pack is not None and pack.base != merged.base:
            packwrite.remove(pack)
    return os.path.basename(merged.base)


def _whole(entries: list[packwrite.Entry]) -> bool:
    """Whether every entry is a whole object, read where its index says it is (its
    CRC-32 is the index's)."""
    return all(
        entry.data and (entry.data[0] >> 4) & 7 in _WHOLE and zlib.crc32(entry.data) == entry.crc
        for entry in entries
    )


def load(base: str) -> packwrite.Written | None:
    """The pack at `base` (`.pack`, `.idx`) as `packwrite` describes one it wrote:
    where each object is in it; None when its index is not one `packwrite` would write
    (version 2, its pack's object count and checksum)."""
    with open(base + ".idx", "rb") as fh:
        index = fh.read()
    if len(index) < _IDX_HEADER + 40 or index[:8] != b"\377tOc\0\0\0\2":
        return None
    if hashlib.sha1(index[:-20]).digest() != index[-20:]:
        return None
    count = struct.unpack_from(">L", index, 8 + 255 * 4)[0]
    shas_at = _IDX_HEADER
    crcs_at = shas_at + 20 * count
    offsets_at = crcs_at + 4 * count
    large_at = offsets_at + 4 * count
    if len(index) < large_at + 40:
        return None
    crcs = struct.unpack_from(f">{count}L", index, crcs_at)
    offsets = list(struct.unpack_from(f">{count}L", index, offsets_at))
    for i, offset in enumerate(offsets):
        if offset & 0x80000000:
            at = large_at + 8 * (offset & 0x7FFFFFFF)
            if at + 8 > len(index) - 40:
                return None
            offsets[i] = struct.unpack_from(">Q", index, at)[0]
    with open(base + ".pack", "rb") as fh:
        header = fh.read(12)
        fh.seek(-20, os.SEEK_END)
        end = fh.tell()
        checksum = fh.read(20)
    if header != b"PACK\0\0\0\2" + struct.pack(">L", count) or checksum != index[-40:-20]:
        return None
    ends = [*sorted(offsets), end]
    following = {offset: ends[i + 1] for i, offset in enumerate(ends[:-1])}
    objects = {
        index[shas_at + 20 * i : shas_at + 20 * (i + 1)]: (
            offsets[i],
            following[offsets[i]] - offsets[i],
            crcs[i],
        )
        for i in range(count)
    }
    return packwrite.Written(base, objects)


def _read_list(path: Path) -> list[tuple[int, str]]:
    listed: list[tuple[int, str]] = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(encoding="ascii", errors="replace").splitlines():
            level, _, name = line.partition(" ")
            if level.isdigit() and _NAME.fullmatch(name):
                listed.append((int(level), name))
    return listed


def _write_list(path: Path, listed: list[tuple[int, str]]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{level} {name}\n" for level, name in listed), encoding="ascii")
    os.replace(tmp, path)
