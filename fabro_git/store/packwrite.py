"""Pack files, written as git reads them: a checkpoint's objects in one file.

A checkpoint writes about a dozen small objects. Written loose, each is a file created
in its fan-out directory and renamed into place, and creating a file is the dearest
step of a checkpoint on a busy file system (from 35 µs to 400 µs each, depending on
where the directory lies on disk). Written as one pack, the same objects are two files:
the pack, then its index, each renamed into place whole, the index last (a pack is
only read through its index, so a reader never sees half of one).

Objects are stored whole (no deltas), each compressed on its own, so that packs are
merged by copying their entries as they are (`merge`): a run's small packs become one
as it goes (`PackLadder`), and one when it ends, so a run leaves one pack, not one a
stage, and `git gc --auto` (which counts packs) is not woken by a run.

Formats: git's pack version 2 and pack index version 2 (`gitformat-pack(5)`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import struct
import zlib
from collections.abc import Iterable
from typing import NamedTuple

TYPE_NUMBERS = {b"commit": 1, b"tree": 2, b"blob": 3, b"tag": 4}
# Pack entries are compressed for speed, as loose objects are (core.looseCompression).
_COMPRESSION = 1
_IDX_MAGIC = b"\377tOc"
_LARGE_OFFSET = 0x80000000
_tmp_counter = itertools.count()
_TEMP_ATTEMPTS = 100


class Entry(NamedTuple):
    """One object as a pack holds it: its raw id, the CRC-32 of its bytes in the pack,
    and those bytes (type and size header, then the compressed body)."""

    sha: bytes
    crc: int
    data: bytes


class Written(NamedTuple):
    """A pack on disk: its path without `.pack`/`.idx`, and where each object is in it
    (raw id -> offset, length, CRC-32)."""

    base: str
    objects: dict[bytes, tuple[int, int, int]]


def entry(sha: bytes, type_name: bytes, body: bytes) -> Entry:
    """The pack entry of an object: its size in a variable-length header after the type
    (4 bits in the first byte, 7 in each next), then the zlib-compressed body."""
    size = len(body)
    byte = (TYPE_NUMBERS[type_name] << 4) | (size & 0x0F)
    size >>= 4
    header = bytearray()
    while size:
        header.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    header.append(byte)
    data = bytes(header) + zlib.compress(body, _COMPRESSION)
    return Entry(sha, zlib.crc32(data), data)


def write(pack_dir: str, entries: Iterable[Entry], *, fsync: bool) -> Written:
    """Write `entries` (distinct objects) as a new pack in `pack_dir`: the pack, then its
    index, each a temporary file renamed into place."""
    body = [b"PACK", b""]
    objects: dict[bytes, tuple[int, int, int]] = {}
    offset = 12
    for item in entries:
        if item.sha in objects:
            continue
        objects[item.sha] = (offset, len(item.data), item.crc)
        body.append(item.data)
        offset += len(item.data)
    body[1] = struct.pack(">LL", 2, len(objects))
    digest = hashlib.sha1()
    for part in body:
        digest.update(part)
    checksum = digest.digest()
    body.append(checksum)
    base = os.path.join(pack_dir, f"pack-{checksum.hex()}")
    index = _index(objects, checksum)
    _put(pack_dir, base + ".pack", body, fsync=fsync)
    _put(pack_dir, base + ".idx", [index], fsync=fsync)
    return Written(base, objects)


def read_entries(written: Written) -> list[Entry]:
    """The entries of a pack this process wrote, read back from its file."""
    with open(written.base + ".pack", "rb") as fh:
        data = fh.read()
    return [
        Entry(sha, crc, data[offset : offset + length])
        for sha, (offset, length, crc) in written.objects.items()
    ]


def remove(written: Written) -> None:
    """Delete a pack, its index first: a reader that lists the directory after that no
    longer finds it, and one that opened it already keeps reading the open files."""
    for suffix in (".idx", ".pack"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(written.base + suffix)


def _index(objects: dict[bytes, tuple[int, int, int]], checksum: bytes) -> bytes:
    """A version 2 pack index: a fan-out table of 256 counts, the sorted ids, their
    CRC-32s, their offsets (those past 2 GiB in a table of 64-bit ones after), the
    pack's checksum, then the index's own."""
    shas = sorted(objects)
    fanout = [0] * 256
    for sha in shas:
        fanout[sha[0]] += 1
    total = 0
    for i, count in enumerate(fanout):
        total += count
        fanout[i] = total
    small: list[int] = []
    large: list[int] = []
    for sha in shas:
        offset = objects[sha][0]
        if offset < _LARGE_OFFSET:
            small.append(offset)
        else:
            small.append(_LARGE_OFFSET | len(large))
            large.append(offset)
    n = len(shas)
    parts = [
        _IDX_MAGIC,
        struct.pack(">L", 2),
        struct.pack(">256L", *fanout),
        b"".join(shas),
        struct.pack(f">{n}L", *(objects[sha][2] for sha in shas)),
        struct.pack(f">{n}L", *small),
        struct.pack(f">{len(large)}Q", *large),
        checksum,
    ]
    head = b"".join(parts)
    return head + hashlib.sha1(head).digest()


def _put(pack_dir: str, path: str, parts: list[bytes], *, fsync: bool) -> None:
    """Write `parts` to a new read-only temporary file in `pack_dir`, renamed to `path`."""
    for _ in range(_TEMP_ATTEMPTS):
        tmp = os.path.join(pack_dir, f"tmp_pack_{os.getpid()}_{next(_tmp_counter)}")
        try:
            # A new file, never one already there (a crashed process's, or a link).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary pack name in {pack_dir}")
    try:
        try:
            for part in parts:
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class PackLadder:
    """The packs one process wrote, merged as they pile up: when `rung` packs of one
    size class are there, they become one of the next class. A run of n checkpoints so
    holds at most `rung - 1` packs per class (about log n classes), and each object is
    copied once per class it climbs. `merge_all` leaves one, and hands it over."""

    def __init__(self, pack_dir: str, *, rung: int = 8) -> None:
        self.pack_dir = pack_dir
        self.rung = rung
        self._classes: list[list[Written]] = []

    def add(self, written: Written, *, fsync: bool) -> None:
        """Count a new pack in, merging a full class into one of the next."""
        level = 0
        pack: Written | None = written
        while pack is not None:
            if len(self._classes) == level:
                self._classes.append([])
            rung = self._classes[level]
            rung.append(pack)
            if len(rung) < self.rung:
                return
            self._classes[level] = []
            pack = self._merge(rung, fsync=fsync)
            level += 1

    def merge_all(self, *, fsync: bool) -> list[Written]:
        """Merge every pack left into one, and hand it over: the ladder forgets it (it
        is the run's, for `runpacks` to merge with other runs')."""
        packs = [p for rung in self._classes for p in rung]
        self._classes = []
        if len(packs) < 2:
            return packs
        merged = self._merge(packs, fsync=fsync)
        return [merged] if merged is not None else []

    def find(self, sha: bytes) -> Written | None:
        """The pack of this ladder that holds `sha` (a raw id), if one does."""
        for rung in self._classes:
            for pack in rung:
                if sha in pack.objects:
                    return pack
        return None

    def _merge(self, packs: list[Written], *, fsync: bool) -> Written | None:
        """One pack of the objects of `packs`, which are then deleted; None when none of
        them is left."""
        readable: list[tuple[Written, list[Entry]]] = []
        for pack in packs:
            # A pack a `git repack` took away is skipped: its objects went into the
            # repack's (or, unreachable, loose: `missing_written` looks for them).
            with contextlib.suppress(FileNotFoundError):
                readable.append((pack, read_entries(pack)))
        if len(readable) < 2:
            # Nothing to merge; a lone pack left stays as it is (merged again, it would
            # be the same file, deleted as an old one).
            return readable[0][0] if readable else None
        merged = write(self.pack_dir, [e for _, entries in readable for e in entries], fsync=fsync)
        for pack in packs:
            if pack.base != merged.base:
                remove(pack)
        return merged
