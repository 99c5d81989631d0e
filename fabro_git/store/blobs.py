"""Reading a blob: whole, up to a size checked before a byte is inflated, or streamed.

A run fetched from a remote is someone else's input, and a blob of a few kilobytes on
the wire can inflate to gigabytes: 200 MB of zeros is 200 KB of zlib. Whatever is read
whole into memory (`GitRepo.read_file`, `read_blob`) is therefore refused when it is
bigger than a cap, and the size is taken from the object's header, as `git cat-file -s`
takes it: a loose object's first bytes, inflated alone; a packed object's entry header;
for a delta, the size at the start of its data. A delta is put back together from its
base, inflated whole as well, so each link of its chain counts too. What may be bigger
than any cap (a command's whole output) is streamed from `git cat-file` instead.

A header is only believed where the read that follows holds the object to it: dulwich
stops inflating a pack entry or applying a delta at the size its header gives, but
takes a loose file (ours, or an alternate's) whole, whatever its header says, so a
loose blob about to be read is inflated once here, a megabyte at a time, to see that
its header tells the truth. An object whose header cannot be read is damaged, never
missing: left to dulwich, it would be inflated whole. None of this comes by `git
fetch`, whose `index-pack` refuses such a pack, and which writes loose objects itself;
it comes from a repository whose `.git` or alternate someone else could write to.

The caps are here, in one place. They are generous: what git fabro writes is far
smaller, and a cap is met only by a run made some other way.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from dulwich.errors import ChecksumMismatch, ObjectFormatException
from dulwich.object_store import DiskObjectStore
from dulwich.objects import ObjectID
from dulwich.pack import ApplyDeltaError, PackFileDisappeared, UnresolvedDeltas

from fabro_git.errors import BlobTooLarge, DamagedObject, StoreError
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
_KINDS = (1, 2, 3, 4, _OFS_DELTA, _REF_DELTA)  # a commit, tree, blob, tag, or a delta
# Bytes of a loose object's or a delta's compressed start read to find its sizes.
_HEAD = 512
_HEAD_MAX = 64 << 10
# A pack entry's header: the type and size (up to 10 bytes), an offset (up to 10) or
# a base's id (20).
_ENTRY_HEAD = 48


class ObjectSize(NamedTuple):
    """An object's size, and how many bytes reading it inflates (its size, or for a
    delta its base's, every delta's of its chain and the biggest object made on the
    way)."""

    size: int
    inflated: int


def blob_size(sha: str, store: DiskObjectStore, root: Path, *, whole: int = 0) -> ObjectSize | None:
    """The size of object `sha` of the repository at `root` (whose objects are
    `store`), from its header (`object_size`), else as `git cat-file -s` tells it;
    None when git does not have it."""
    found = object_size(store, sha, whole=whole)
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


def object_size(store: DiskObjectStore, sha: str, *, whole: int = 0) -> ObjectSize | None:
    """The size of object `sha` from its header, in a loose file or a pack of `store`
    or of its alternates; None when none has it (or a pack went while it was read). A
    loose file whose header says it is at most `whole` bytes (a delta's base: that
    many times `CHAIN_FACTOR`), which a read would take whole, is inflated to its end
    here, to see that it is that size (`DamagedObject` when not)."""
    stores = [store, *(other for other in store.alternates if isinstance(other, DiskObjectStore))]
    damaged: DamagedObject | None = None
    for objects in stores:
        try:
            loose = _loose_size(Path(objects.path), sha, whole=whole)
        except DamagedObject as err:
            damaged = damaged or err
            continue
        if loose is not None:
            return ObjectSize(loose, loose)

    def packs() -> list[Pack]:
        return [pack for objects in stores for pack in objects.packs]

    found = None
    with contextlib.suppress(OSError, PackFileDisappeared):
        packed = _packed(packs(), sha)
        if packed is not None:
            found = _chain_size(sha, stores, packs, *packed, whole=CHAIN_FACTOR * whole)
    # A damaged loose file is passed over for a pack, as git does, when the reader that
    # tries it first (`LooseObjects.read_loose`, which inflates it whole) gives up on it
    # soon enough.
    if damaged is not None and (found is None or 0 < whole < _inflates(damaged.path, whole)):
        raise damaged
    return found


@contextlib.contextmanager
def damaged_as_error(sha: str, where: Path) -> Iterator[None]:
    """Report what dulwich raises for an object it cannot put back together (say, a pack
    entry that inflates past its header's size) as a `DamagedObject`, not a bug."""
    try:
        yield
    except (
        zlib.error,
        ChecksumMismatch,
        ObjectFormatException,
        ApplyDeltaError,
        UnresolvedDeltas,
    ) as err:
        raise DamagedObject(sha, where, str(err) or type(err).__name__) from None


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


def _loose_size(objects_dir: Path, sha: str, *, whole: int) -> int | None:
    """The size in the header of the loose object `sha` of `objects_dir`; None when
    there is no such file. When that is at most `whole`, the rest is inflated, a
    megabyte at a time, and held to it."""
    path = objects_dir / sha[:2] / sha[2:]
    try:
        with open(path, "rb") as fh:
            inflate = zlib.decompressobj()
            head = _inflated_start(fh.read, inflate, 64)
            header, nul, body = head.partition(b"\0")
            _type, _, size = header.partition(b" ")
            if not nul or not size.isdigit() or len(size) > 20:
                raise DamagedObject(
                    sha, path, f"no object header in its first {_HEAD_MAX >> 10} KiB"
                )
            if int(size) <= whole:
                _inflate_to(fh.read, inflate, int(size) - len(body), sha, path)
            return int(size)
    except FileNotFoundError:
        return None
    except (OSError, zlib.error) as err:
        raise DamagedObject(sha, path, str(err)) from None


def _inflates(path: Path, most: int) -> int:
    """How many bytes the zlib stream in the file at `path` inflates to, up to where it
    is damaged, counted up to `most` + 1, a megabyte at a time."""
    inflate = zlib.decompressobj()
    count = 0
    with contextlib.suppress(OSError, zlib.error), open(path, "rb") as fh:
        while count <= most and not inflate.eof:
            data = inflate.unconsumed_tail or fh.read(1 << 20)
            if not data:
                break
            count += len(inflate.decompress(data, min(1 << 20, most + 1 - count)))
    return count


def _inflated_start(read: Callable[[int], bytes], inflate: zlib._Decompress, wanted: int) -> bytes:
    """The first `wanted` bytes (fewer if the stream ends) the zlib stream `inflate` of
    what `read` gives inflates to, reading `_HEAD` compressed bytes at a time, up to
    `_HEAD_MAX` of them."""
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


def _inflate_to(
    read: Callable[[int], bytes], inflate: zlib._Decompress, rest: int, sha: str, path: Path
) -> None:
    """Inflate the rest of the zlib stream `inflate` of what `read` gives, holding a
    megabyte at a time: `DamagedObject` unless it ends after `rest` more bytes."""
    chunk = 1 << 20
    while not inflate.eof:
        data = inflate.unconsumed_tail or read(chunk)
        if not data:
            break
        rest -= len(inflate.decompress(data, min(chunk, max(rest, 0) + 1)))
        if rest < 0:
            break
    if rest != 0 or not inflate.eof:
        raise DamagedObject(sha, path, "it is not the size its header says")


def _chain_size(
    sha: str,
    stores: list[DiskObjectStore],
    packs: Callable[[], list[Pack]],
    pack: Pack,
    offset: int,
    *,
    whole: int,
) -> ObjectSize | None:
    """The size of object `sha`, at `offset` of `pack`, and what its chain of deltas
    inflates: each delta's data, the biggest object one of them makes, and, at the
    end, its base, followed link by link (a base named by its id may be in another
    pack, or loose: inflated here whole, as dulwich will, when at most `whole` bytes);
    None when that is missing."""
    result: int | None = None
    inflated = made = 0
    with contextlib.ExitStack() as files:
        opened: dict[str, int] = {}
        for _ in range(MAX_CHAIN + 1):
            path = str(pack.data.path)
            if path not in opened:
                opened[path] = files.enter_context(open(path, "rb")).fileno()
            try:
                kind, size, base, start = _entry(opened[path], offset)
                if kind not in (_OFS_DELTA, _REF_DELTA):
                    if result is None:
                        return ObjectSize(size, size)
                    return ObjectSize(result, inflated + made + size)
                makes = _delta_result_size(opened[path], start)
            except (ValueError, zlib.error) as err:
                raise DamagedObject(sha, Path(path), f"at {offset}: {err}") from None
            result = makes if result is None else result
            made, inflated = max(made, makes), inflated + size
            if isinstance(base, int):
                offset = base
                continue
            assert isinstance(base, bytes)  # a REF_DELTA's base, by id
            sha = base.hex()
            found = _packed([pack], sha) or _packed(packs(), sha)
            if found is None:
                for objects in stores:
                    loose = _loose_size(Path(objects.path), sha, whole=whole)
                    if loose is not None:
                        return ObjectSize(result, inflated + made + loose)
                return None  # the base is missing, as dulwich will say
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
        if kind not in _KINDS:
            raise ValueError(f"the pack entry at {offset} is of no type git has ({kind})")
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

    head = _inflated_start(read, zlib.decompressobj(), 20)
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
