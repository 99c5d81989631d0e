"""An object's size read from its header, as `git cat-file -s` gives it, wherever git
keeps the object: a loose file, a pack entry, a delta on a base named by its offset or
by its id. A blob read whole is refused by it, before a byte is inflated."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from dulwich.pack import write_pack_index_v2
from helpers import git, loosen_packs

from fabro_git.errors import BlobTooLarge, DamagedObject
from fabro_git.store import blobs
from fabro_git.store.repo import GitRepo

NO_BASE = "0" * 40


def _cat(repo: Path, sha: str) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "blob", sha], cwd=repo, capture_output=True, check=True
    ).stdout


def _versions(repo: Path) -> None:
    """Thirty commits of a growing file (one `git fast-import`): a pack holds most of
    them as deltas, the early ones on a later, bigger one."""
    stream = []
    for version in range(30):
        lines = "".join(f"line {n}\n" for n in range(200 + 300 * version))
        data = f"{lines}version {version}\n".encode()
        stream += [
            b"commit refs/heads/main\n",
            b"committer T <t@example.com> 1700000000 +0000\n",
            b"data 1\nv\n",
            *([b"from refs/heads/main^0\n"] if version == 0 else []),
            b"M 100644 inline grows.txt\n",
            b"data %d\n%s\n" % (len(data), data),
        ]
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=b"".join(stream), check=True)


@pytest.mark.parametrize("kept", ["loose", "ofs-delta", "ref-delta"])
def test_sizes_from_headers_are_the_sizes_git_gives(repo: Path, kept: str) -> None:
    _versions(repo)
    if kept == "loose":
        loosen_packs(repo)
        assert not list((repo / ".git" / "objects" / "pack").glob("*.pack"))
    else:
        offsets = "true" if kept == "ofs-delta" else "false"
        git(repo, "-c", f"repack.useDeltaBaseOffset={offsets}", "repack", "-adfq", "--window=50")
    listing = git(
        repo,
        "cat-file",
        "--batch-all-objects",
        "--batch-check=%(objectname) %(objecttype) %(objectsize) %(deltabase)",
    ).split("\n")
    objects = [line.split() for line in listing if line]
    chained = [name for name, _, _, base in objects if base != NO_BASE]
    assert (len(chained) > 20) == (kept != "loose")
    kept_as_deltas = 0  # blobs whose chain, not their size, is over the limit
    with GitRepo.discover(repo) as grepo:
        store = grepo._repo.object_store
        for name, kind, size, _ in objects:
            found = blobs.object_size(store, name)
            assert found is not None and found.size == int(size), (name, kind, found)
            # A delta's chain counts its base and every delta on the way.
            assert (found.inflated > found.size) == (name in chained)
            if kind == "blob":
                # Up to the byte; a delta's chain may inflate to a few times more.
                limit = max(int(size), -(-found.inflated // blobs.CHAIN_FACTOR))
                assert grepo.read_blob(name, limit=limit) == _cat(repo, name)
                with pytest.raises(BlobTooLarge, match=f"grows.txt .* is {int(size):,} bytes:"):
                    grepo.read_blob(name, limit=int(size) - 1, path="grows.txt")
                if limit > int(size):  # an early version, kept as deltas on a later one
                    kept_as_deltas += 1
                    with pytest.raises(BlobTooLarge, match="kept as deltas that inflate"):
                        grepo.read_blob(name, limit=int(size))
    assert (kept_as_deltas > 0) == (kept != "loose")


# -- forged objects: written into .git directly, as `git fetch` would not -------------

BODY = bytes(2 << 20)  # what the forged loose blobs hold: more than the limits below
LIMIT = 1 << 20


def _loose(objects: Path, header: bytes, body: bytes, *, named_by: bytes | None = None) -> str:
    """A loose object file of `header` and `body`, named by the id git would give
    `named_by` (the header git would write for `body`, by default), so that its name
    is no lie, whatever its header is."""
    sha = hashlib.sha1((named_by or b"blob %d\0" % len(body)) + body).hexdigest()
    path = objects / sha[:2] / sha[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zlib.compress(header + body, 1))
    return sha


def _varint(number: int) -> bytes:
    out = []
    while number > 0x7F:
        out.append(0x80 | number & 0x7F)
        number >>= 7
    return bytes([*out, number])


def _entry(kind: int, size: int, data: bytes, base: bytes = b"") -> bytes:
    """A pack entry: its type and size, its base (a delta's), its data deflated."""
    head = [kind << 4 | size & 15]
    size >>= 4
    while size:
        head[-1] |= 0x80
        head.append(size & 0x7F)
        size >>= 7
    return bytes(head) + base + zlib.compress(data)


def _delta(source: int, target: int, ops: bytes) -> bytes:
    return _varint(source) + _varint(target) + ops


def _copy(size: int) -> bytes:
    """A delta's instruction to copy the `size` (up to 16 MiB) bytes at its base's start."""
    return bytes([0x80 | 0x70]) + size.to_bytes(3, "little")


def _pack(objects: Path, entries: list[tuple[str, bytes]]) -> None:
    """A pack of `entries` (an id, the entry naming it) and the index dulwich writes
    for it: git's `index-pack` would refuse it."""
    data = b"PACK" + struct.pack(">II", 2, len(entries))
    index = []
    for sha, entry in entries:
        index.append((bytes.fromhex(sha), len(data), zlib.crc32(entry)))
        data += entry
    checksum = hashlib.sha1(data).digest()
    pack = objects / "pack" / f"pack-{checksum.hex()}"
    pack.with_suffix(".pack").write_bytes(data + checksum)
    with pack.with_suffix(".idx").open("wb") as fh:
        write_pack_index_v2(fh, sorted(index), checksum)


@pytest.mark.parametrize("where", ["here", "alternate"])
def test_a_loose_blob_bigger_than_its_header_says_is_refused(repo: Path, where: str) -> None:
    """dulwich takes a loose file whole, whatever its header says: it is held to it."""
    objects = repo / ".git" / "objects"
    if where == "alternate":
        objects = repo.parent / "shared-objects"
        (repo / ".git" / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    sha = _loose(objects, b"blob 5\0", BODY)
    with (
        GitRepo.discover(repo) as grepo,
        pytest.raises(DamagedObject, match="not the size its header says"),
    ):
        grepo.read_blob(sha, limit=LIMIT)


def test_a_loose_blob_whose_header_git_cannot_read_is_refused(repo: Path) -> None:
    """git reads no header longer than 32 bytes (so `git cat-file -s` cannot say the
    size), dulwich does: such an object is damaged, not missing, and not read whole."""
    sha = _loose(repo / ".git" / "objects", b"blob %s5\0" % (b"0" * 80), BODY)
    with (
        GitRepo.discover(repo) as grepo,
        pytest.raises(DamagedObject, match="no object header in its first 64 KiB"),
    ):
        grepo.read_blob(sha, limit=LIMIT)


FIVE = hashlib.sha1(b"blob 5\0hello").hexdigest()
BASE = hashlib.sha1(b"blob 1024\0" + bytes(1024)).hexdigest()


@pytest.mark.parametrize(
    "forged",
    [
        "inflates past its size",
        "of no type",
        "delta on itself",
        "delta copies past its size",
        "delta on a loose base bigger than its header says",
    ],
)
def test_a_damaged_pack_entry_is_an_error_not_a_bug(repo: Path, forged: str) -> None:
    """What dulwich raises for an entry it cannot put back together is no traceback."""
    objects = repo / ".git" / "objects"
    hello = _delta(5, 5, b"\x05hello")
    twice = _delta(1024, 5, _copy(1024) * 2)  # makes 2 KiB, says 5 bytes
    entries = {
        "inflates past its size": [(FIVE, _entry(3, 5, BODY))],
        "of no type": [(FIVE, _entry(5, 5, b"hello"))],
        "delta on itself": [(FIVE, _entry(6, len(hello), hello, b"\0"))],
        "delta copies past its size": [
            (BASE, base := _entry(3, 1024, bytes(1024))),
            (FIVE, _entry(6, len(twice), twice, bytes([len(base)]))),
        ],
        "delta on a loose base bigger than its header says": [
            (FIVE, _entry(7, len(hello), hello, bytes.fromhex(_loose(objects, b"blob 5\0", BODY))))
        ],
    }[forged]
    _pack(objects, entries)
    with GitRepo.discover(repo) as grepo, pytest.raises(DamagedObject):
        grepo.read_blob(FIVE, limit=LIMIT)


def test_a_delta_chain_counts_the_biggest_object_made_on_its_way(repo: Path) -> None:
    """A 5-byte blob kept as a delta on a delta that makes 1 MiB of 1 KiB: a pack git's
    `index-pack` takes (as `git fetch` would), which reading would put together whole."""
    made = hashlib.sha1(b"blob %d\0" % (1024 * 1024) + bytes(1024 * 1024)).hexdigest()
    grows = _delta(1024, 1024 * 1024, _copy(1024) * 1024)
    shrinks = _delta(1024 * 1024, 5, b"\x05hello")
    stream = [
        _entry(3, 1024, bytes(1024)),
        _entry(7, len(grows), grows, bytes.fromhex(BASE)),
        _entry(7, len(shrinks), shrinks, bytes.fromhex(made)),
    ]
    data = b"PACK" + struct.pack(">II", 2, 3) + b"".join(stream)
    data += hashlib.sha1(data).digest()
    subprocess.run(["git", "index-pack", "--stdin"], cwd=repo, input=data, check=True)
    with GitRepo.discover(repo) as grepo:
        assert grepo.read_blob(FIVE) == b"hello"
        with pytest.raises(BlobTooLarge, match="kept as deltas that inflate 1,05"):
            grepo.read_blob(FIVE, limit=300_000)


def test_a_damaged_loose_file_is_passed_over_for_a_pack_only_when_small(repo: Path) -> None:
    """The loose file is tried first, inflated whole: one that inflates past the limit
    is refused, though a pack holds the object, rather than inflated to be passed over."""
    (repo / "a.txt").write_text("alpha\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    git(repo, "repack", "-a", "-q")  # packed, and still loose
    blob = git(repo, "rev-parse", "HEAD:a.txt").strip()
    path = repo / ".git" / "objects" / blob[:2] / blob[2:]
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(zlib.compress(b"blob 6\0alpha\n" + bytes(1024), 1))
    with GitRepo.discover(repo) as grepo:
        assert grepo.read_blob(blob, limit=LIMIT) == b"alpha\n"  # as git does
        path.write_bytes(zlib.compress(b"blob 6\0alpha\n" + BODY, 1))
        with pytest.raises(DamagedObject, match="not the size its header says"):
            grepo.read_blob(blob, limit=LIMIT)


def test_a_loose_tree_or_commit_is_inflated_no_further_than_its_header_says(
    repo: Path,
) -> None:
    """Trees and commits are read whole with no size asked first: a loose one that
    says more than a reader takes is refused, and one that holds more than it says is
    inflated only that far and left to the packs, never read to its end."""
    import tracemalloc

    def planted(header: bytes, body_size: int) -> str:
        sha = hashlib.sha1(header + b"x").hexdigest()  # any name: the file lies anyway
        path = repo / ".git" / "objects" / sha[:2] / sha[2:]
        path.parent.mkdir(exist_ok=True)
        squeeze = zlib.compressobj(1)
        chunk = bytes(1 << 20)
        parts = [squeeze.compress(header)]
        parts += [squeeze.compress(chunk) for _ in range(body_size >> 20)]
        path.write_bytes(b"".join([*parts, squeeze.flush()]))
        return sha

    with GitRepo.discover(repo) as grepo:
        lying = planted(b"tree 10\0", 100 << 20)
        tracemalloc.start()
        try:
            assert grepo.objects.read_loose(lying) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, peak
        huge = planted(b"commit %d\0" % (200 << 20), 1 << 20)
        with pytest.raises(BlobTooLarge, match=huge[:12]):
            grepo.objects.read_loose(huge)
