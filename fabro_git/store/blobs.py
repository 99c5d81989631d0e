"""Reading a blob: whole, up to a size checked before a byte is inflated, or streamed.

A run fetched from a remote is someone else's input, and a blob of a few kilobytes on
the wire can inflate to gigabytes: 200 MB of zeros is 200 KB of zlib. Whatever is read
whole into memory (`GitRepo.read_file`, `read_blob`) is therefore refused when it is
bigger than a cap, and the size is taken from the object's header, as `git cat-file -s`
takes it: a loose object's first bytes, inflated alone; a packed object's entry header;
for a delta, the size at the start of its data. A delta is put back together from its
base, inflated whole as well, so each link of its chain counts too. What may be bigger
than any cap (a command's whole output) is streamed from `git cat-file` instead.

The caps are here, in one place. They are generous: what git fabro writes is far
smaller, and a cap is met only by a run made some other way.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from dulwich.objects import ObjectID
from dulwich.pack import PackFileDisappeared

from fabro_git.errors import BlobTooLarge, StoreError
from fabro_git.store._gitcli import git_env, run_git

if TYPE_CHECKING:
    from dulwich.pack import Pack

# One event segment: one stage's events. A command stage's are a few KB; an agent
# stage's streamed pieces are a line of about 300 bytes each, so a long one reaches
# some MB, and its tools' output (up to 1 MB a call, `TOOL_OUTPUT_STREAM_LIMIT`) more.
SEGMENT_MAX_BYTES = 64 << 20
# Every other file read whole: checkpoint.json (several MB after thousands of stages; a
# delta's base the same), manifest.json, graph.fabro, a stage's status.json, retro.json,
# a thread, an offloaded value (benchmarks/offload_50mb.py offloads 50 MB ones).
FILE_MAX_BYTES = 64 << 20
# A file bigger than this that is only copied somewhere (`dump`, `artifact cp`) is
# streamed by `git cat-file` rather than read whole: a process costs less than the
# memory then.
STREAM_AT = 1_000_000
# Reading a delta holds its base and every delta of its chain at once: a chain may
# inflate to this many times its file's cap (a file under the cap, a base no bigger,
# the deltas between them).
CHAIN_FACTOR = 3
# The longest delta chain git writes (`pack.depth` is capped at 4095).
MAX_CHAIN = 4095

_OFS_DELTA, _REF_DELTA = 6, 7
# Bytes of a loose object's or a delta's compressed start read to find its sizes.
_HEAD = 512
_HEAD_MAX = 64 << 10
# A pack entry's header: the type and size (up to 10 bytes), an offset (up to 10) or
# a base's id (20).
_ENTRY_HEAD = 48


class ObjectSize(NamedTuple):
    """An object's size, and how many bytes reading it inflates (its size, or for a
    delta its base's and every delta's of its chain besides)."""

    size: int
    inflated: int


def blob_size(
    sha: str, objects_dir: Path, packs: Callable[[], Iterable[Pack]], root: Path
) -> ObjectSize | None:
    """The size of object `sha` of the repository at `root`, from its header
    (`object_size`), else as `git cat-file -s` tells it (an alternate's object); None
    when git does not have it."""
    found = object_size(objects_dir, packs, sha)
    if found is not None:
        return found
    proc = run_git(["cat-file", "-s", sha], cwd=root, check=False)
    text = proc.stdout.strip()
    if proc.returncode != 0 or not text.isdigit():
        return None
    return ObjectSize(int(text), int(text))


def check_size(sha: str, path: str, found: ObjectSize | None, limit: int) -> None:
    """Refuse (`BlobTooLarge`) the blob `sha`, read as `path`, when it or the chain of
    deltas it is stored as (`found`, from `blob_size`) inflates past `limit`. A blob
    whose size is not known (None: git does not have it) is left to the read that
    follows to report."""
    if found is None:
        return
    if found.size > limit:
        raise BlobTooLarge(path, sha, found.size, limit)
    if found.inflated > CHAIN_FACTOR * limit:
        raise BlobTooLarge(path, sha, found.size, limit, inflated=found.inflated)


def object_size(
    objects_dir: Path, packs: Callable[[], Iterable[Pack]], sha: str
) -> ObjectSize | None:
    """The size of object `sha` from its header, in its loose file or a pack; None
    when neither says (an alternate's object, a pack git could not read, or none)."""
    loose = _loose_size(objects_dir / sha[:2] / sha[2:])
    if loose is not None:
        return ObjectSize(loose, loose)
    with contextlib.suppress(OSError, ValueError, zlib.error, PackFileDisappeared):
        found = _packed(packs(), sha)
        if found is not None:
            return _chain_size(objects_dir, packs, *found)
    return None


def _packed(packs: Iterable[Pack], sha: str) -> tuple[Pack, int] | None:
    """The pack of `packs` that holds object `sha`, and where in it. A pack removed
    since the list was made (this process's own packs are merged as it goes) is passed
    over: its objects are in the pack that replaced it, or `git cat-file` finds them."""
    for pack in packs:
        try:
            return pack, pack.index.object_offset(ObjectID(sha.encode()))
        except (KeyError, PackFileDisappeared):
            continue
    return None


def _loose_size(path: Path) -> int | None:
    """The size in the header of the loose object at `path`; None when there is no
    such file or its start is not an object's header."""
    try:
        with open(path, "rb") as fh:
            head = _inflated_start(fh.read, 64)
    except (OSError, zlib.error):
        return None
    header, nul, _ = head.partition(b"\0")
    _type, _, size = header.partition(b" ")
    return int(size) if nul and size.isdigit() else None


def _inflated_start(read: Callable[[int], bytes], wanted: int) -> bytes:
    """The first `wanted` bytes (fewer if the stream ends) a zlib stream inflates to,
    reading `_HEAD` compressed bytes at a time, up to `_HEAD_MAX` of them."""
    inflate = zlib.decompressobj()
    out = b""
    taken = 0
    while len(out) < wanted and not inflate.eof:
        data = inflate.unconsumed_tail
        if not data:
            data = read(_HEAD) if taken < _HEAD_MAX else b""
            if not data:
                break
            taken += len(data)
        out += inflate.decompress(data, wanted - len(out))
    return out


def _chain_size(
    objects_dir: Path, packs: Callable[[], Iterable[Pack]], pack: Pack, offset: int
) -> ObjectSize:
    """The size of the object at `offset` of `pack`, and what its chain of deltas
    inflates: each delta's data and, at the end, its base, followed link by link (a
    base named by its id may be in another pack, or loose)."""
    result: int | None = None
    inflated = 0
    with contextlib.ExitStack() as files:
        opened: dict[str, int] = {}
        for _ in range(MAX_CHAIN + 1):
            path = str(pack.data.path)
            if path not in opened:
                opened[path] = files.enter_context(open(path, "rb")).fileno()
            kind, size, base, start = _entry(opened[path], offset)
            if kind not in (_OFS_DELTA, _REF_DELTA):
                return ObjectSize(size if result is None else result, inflated + size)
            if result is None:
                result = _delta_result_size(opened[path], start)
            inflated += size
            if isinstance(base, int):
                offset = base
                continue
            assert isinstance(base, bytes)  # a REF_DELTA's base, by id
            found = _packed([pack], base.hex()) or _packed(packs(), base.hex())
            if found is None:
                loose = _loose_size(objects_dir / base.hex()[:2] / base.hex()[2:])
                if loose is None:
                    raise ValueError(f"the base {base.hex()} of a delta is missing")
                return ObjectSize(result, inflated + loose)
            pack, offset = found
    raise StoreError(f"a delta chain in {pack.data.path} is longer than git makes them")


def _entry(fd: int, offset: int) -> tuple[int, int, int | bytes | None, int]:
    """A pack entry's header at `offset`: its type, its size (a delta's: its data's),
    its base (an offset or an id, for a delta) and where its compressed data starts."""
    head = os.pread(fd, _ENTRY_HEAD, offset)
    try:
        byte = head[0]
        kind, size, shift, at = (byte >> 4) & 7, byte & 15, 4, 1
        while byte & 0x80:
            byte = head[at]
            size |= (byte & 0x7F) << shift
            shift, at = shift + 7, at + 1
        base: int | bytes | None = None
        if kind == _OFS_DELTA:
            byte = head[at]
            back, at = byte & 0x7F, at + 1
            while byte & 0x80:
                byte = head[at]
                back, at = ((back + 1) << 7) | (byte & 0x7F), at + 1
            base = offset - back
            if not 0 < base < offset:
                raise ValueError(f"a delta at {offset} has no base before it")
        elif kind == _REF_DELTA:
            base, at = head[at : at + 20], at + 20
            if len(base) != 20:
                raise IndexError(at)
    except IndexError:
        raise ValueError(f"the pack entry at {offset} is cut short") from None
    return kind, size, base, offset + at


def _delta_result_size(fd: int, start: int) -> int:
    """The size of what a delta makes: the second number at the start of its data."""
    at = [start]

    def read(count: int) -> bytes:
        data = os.pread(fd, count, at[0])
        at[0] += len(data)
        return data

    head = _inflated_start(read, 20)
    position = 0
    sizes = []
    for _ in range(2):
        value = shift = 0
        while True:
            if position >= len(head):
                raise ValueError(f"the delta at {start} is cut short")
            byte = head[position]
            value |= (byte & 0x7F) << shift
            shift, position = shift + 7, position + 1
            if not byte & 0x80:
                break
        sizes.append(value)
    return sizes[1]


# -- streamed by git -----------------------------------------------------------------


def copy_blob(root: Path, sha: str, out: BinaryIO, what: str) -> None:
    """Write blob `sha` to the open file `out`, streamed from git in bounded memory;
    `what` names it in the error when git cannot."""
    out.flush()
    proc = subprocess.run(
        ["git", "cat-file", "blob", sha],
        cwd=root,
        stdout=out,
        stderr=subprocess.PIPE,
        env=git_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise StoreError(
            f"git cat-file failed for {what}: " + proc.stderr.decode("utf-8", "replace").strip()
        )


def blob_ends(root: Path, sha: str, keep: int) -> tuple[bytes, bytes]:
    """The first and last `keep` bytes of blob `sha`, streamed from git in bounded
    memory, however big it is."""
    with subprocess.Popen(
        ["git", "cat-file", "blob", sha],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=git_env(),
    ) as proc:
        assert proc.stdout is not None
        head = proc.stdout.read(keep)
        tail: collections.deque[bytes] = collections.deque()
        held = 0
        while block := proc.stdout.read(1 << 20):
            tail.append(block)
            held += len(block)
            while held - len(tail[0]) >= keep:
                held -= len(tail.popleft())
    return head, b"".join(tail)[-keep:] if tail else b""
