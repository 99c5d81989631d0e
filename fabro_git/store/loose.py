"""Loose objects, written as git writes them but without its lock files.

Each object is written to a temporary file renamed into place. dulwich's own writer
takes a `.lock` file per object, which fails when two runs write the same blob at the
same moment and sticks forever if a process dies holding it; a rename is atomic, and a
lost race leaves an identical file (objects are named by their content). A small object
is written without first asking whether it exists: a checkpoint's objects are nearly all
new, and the question costs a system call each; writing an existing one again also
freshens it against `git gc`, as git does.

The objects stored within a `batch` (a checkpoint's) go into one pack instead
(`fabro_git.store.packwrite`): two files where a dozen loose ones would be. They are
flushed as loose objects would be: a pack here holds what git would have written loose,
so `core.fsync` is asked about loose objects for it. A batch may also be carried over
(`batch(carry=True)`: a stage's new blobs and trees, found before its checkpoint) into
the next one written, by any thread, or the next ref move: the stage's objects then
share the checkpoint's pack rather than each make a file of its own. Whatever is to
name carried objects waits for them (`when_written`).

The writer remembers what it wrote (the bytes of the small ones), so that an object a
`git gc --prune=now` removed before a ref made it reachable can be found and written
again (`missing_written`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from dulwich.object_store import BaseObjectStore
from dulwich.objects import ObjectID, ShaFile, object_class

from fabro_git.errors import BlobTooLarge, DiskFull, StoreError, disk_full_in
from fabro_git.store import packwrite, runpacks
from fabro_git.store._gitcli import git_failure
from fabro_git.store.blobs import FILE_MAX_BYTES
from fabro_git.store.durability import durability

if TYPE_CHECKING:
    from dulwich.pack import Pack

    from fabro_git.redact import StreamMasker

_TEMP_ATTEMPTS = 100
_tmp_counter = itertools.count()
_LOOSE_COMPRESSION = 1  # git's default core.looseCompression: speed over size
FILE_CHUNK = 1 << 20  # bytes read at a time when a file is written as a blob
# What `missing_written` may write again from memory: objects up to this size, up to
# this much in all (the rest are only checked).
_HELD_OBJECT_MAX = 256 * 1024
_HELD_BUDGET = 32 * 1024 * 1024
_HEX_ID = re.compile(r"[0-9a-f]{40}")
# A batch of fewer objects is written loose: one file each is no more than a pack's two.
_PACK_MIN = 3
# Bigger objects of a batch are written loose all the same (and not held in memory
# until the batch ends).
_PACKED_OBJECT_MAX = 1 << 20
# A batch holding this much is written out as it goes, a pack at a time.
_BATCH_BYTES_MAX = 32 << 20


class _Batch:
    """The objects of an open `LooseObjects.batch`: id -> (type, body), in the order
    they came, and their size; only the thread that opened it adds to it."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, bytes]] = {}
        self.size = 0


class LooseObjects:
    """The loose objects of the repository at `root`, in `objects_dir`; `store` is
    dulwich's view of its packs, asked whether an object is packed already."""

    def __init__(self, root: Path, objects_dir: Path, store: BaseObjectStore) -> None:
        self.root = root
        self.objects_dir = objects_dir
        self._objects_path = str(objects_dir)
        self._store = store
        # Big blobs are stored from several threads at once (`store_blob`): dulwich's
        # pack list (`_packed`) is refreshed by one at a time.
        self._packs_lock = threading.Lock()
        self._packs_dir = os.path.join(self._objects_path, "pack")
        self._packs_stamp: int | None = None
        self._packs: list[Pack] = []
        # Every object this process wrote or relied on, for `missing_written`: with its
        # bytes (header, body) while they fit the budget, so a lost one can be written
        # again; None past it.
        self._written: dict[str, tuple[bytes, bytes] | None] = {}
        self._held_bytes = 0
        # The open batch of each thread that has one, by thread id.
        self._batches: dict[int, _Batch] = {}
        # Objects of carried batches, not on disk yet, and what waits for them.
        self._carried: dict[str, tuple[bytes, bytes]] = {}
        self._after_carried: list[Callable[[], object]] = []
        self._carried_lock = threading.Lock()
        self._ladder_lock = threading.Lock()
        # The packs this process wrote, merged as they pile up.
        self._ladder = packwrite.PackLadder(self._packs_dir)

    @contextlib.contextmanager
    def batch(self, *, carry: bool = False) -> Iterator[None]:
        """Objects this thread stores within the block are written as one pack when it
        ends (a few, or a big one: loose, at once or then). Nothing may point at them,
        no ref and no index, before the block ends; `flush` writes them sooner. An error
        inside drops them. A block inside another joins it; each thread has its own.

        With `carry`, the block's objects are not written when it ends but with the
        next batch written (by any thread), the next `flush` or ref move: nothing on
        disk may name them before then but what `when_written` puts off. They are read
        back from memory meanwhile (`held`)."""
        me = threading.get_ident()
        if me in self._batches:
            yield
            return
        batch = self._batches[me] = _Batch()
        try:
            yield
        except BaseException:
            del self._batches[me]
            for sha in batch.objects:
                self._forget(sha)
            raise
        del self._batches[me]
        if carry:
            with self._carried_lock:
                self._carried.update(batch.objects)
        else:
            self._write_batch(batch.objects)

    def when_written(self, then: Callable[[], object]) -> None:
        """Call `then` once the carried objects are on disk: now, if none are waiting;
        else on the thread that writes them, right after. An exception it raises goes
        to that thread's caller."""
        with self._carried_lock:
            if self._carried:
                self._after_carried.append(then)
                return
        then()

    def flush(self) -> None:
        """Write the objects of this thread's open batch, and the carried ones, now (a
        ref is about to point at them); the batch goes on, empty."""
        batch = self._batches.get(threading.get_ident())
        objects: dict[str, tuple[bytes, bytes]] = {}
        if batch is not None and batch.objects:
            objects, batch.objects, batch.size = batch.objects, {}, 0
        if objects or self._carried:
            self._write_batch(objects)

    def consolidate(self) -> None:
        """Merge the packs this process wrote into one (the run's end), after writing
        the carried objects, and list it among the packs runs left, merged with them as
        they pile up (`runpacks`): the run's objects are on disk either way, so a
        failure there is left to the next run's end."""
        if self._carried:
            self._write_batch({})
        fsync = durability(self.root).loose_objects
        try:
            with self._ladder_lock:
                left = self._ladder.merge_all(fsync=fsync)
        except OSError as err:
            self._raise(err, "merge the run's packs in")
        if left:
            with contextlib.suppress(OSError):
                runpacks.register(
                    self._packs_dir, self.objects_dir.parent / "fabro", left, fsync=fsync
                )

    def _write_batch(self, objects: dict[str, tuple[bytes, bytes]]) -> None:
        """Write `objects` and the carried ones, then call what waited for those."""
        with self._carried_lock:
            carried, self._carried = self._carried, {}
            after, self._after_carried = self._after_carried, []
        try:
            self._write_objects({**carried, **objects} if carried else objects)
        except BaseException:
            with self._carried_lock:  # still to be written, by the next batch
                self._carried = {**carried, **self._carried}
                self._after_carried[:0] = after
            raise
        for then in after:
            then()

    def _write_objects(self, objects: dict[str, tuple[bytes, bytes]]) -> None:
        if len(objects) < _PACK_MIN:
            for sha, (type_name, body) in objects.items():
                self._write_loose(sha, body, b"%s %d\0" % (type_name, len(body)))
            return
        entries = [
            packwrite.entry(bytes.fromhex(sha), type_name, body)
            for sha, (type_name, body) in objects.items()
        ]
        fsync = durability(self.root).loose_objects
        try:
            written = packwrite.write(self._packs_dir, entries, fsync=fsync)
            with self._ladder_lock:
                self._ladder.add(written, fsync=fsync)
        except OSError as err:
            self._raise(err, "write a pack to")

    def _raise(self, err: OSError, what: str) -> None:
        full = disk_full_in(err)
        if full is not None:
            raise DiskFull(f"cannot {what} {self._packs_dir}: {full.detail}") from err
        raise StoreError(f"cannot {what} {self._packs_dir}: {err}") from err

    def _forget(self, sha: str) -> None:
        held = self._written.pop(sha, None)
        if held is not None:
            self._held_bytes -= len(held[0]) + len(held[1])

    def store_object(self, obj: ShaFile) -> str:
        """Write `obj` as a loose object unless packed; safe against concurrent writers."""
        raw = obj.as_raw_string()
        return self._store_loose(obj.id.decode(), b"%s %d\0%s" % (obj.type_name, len(raw), raw))

    def store_raw(self, type_name: bytes, raw: bytes) -> str:
        """Write an object given as its serialised body (`raw`, say a tree's entries):
        no dulwich object is built, so a big tree is not parsed entry by entry."""
        data = b"%s %d\0%s" % (type_name, len(raw), raw)
        return self._store_loose(hashlib.sha1(data).hexdigest(), data)

    def store_blob(self, data: bytes) -> str:
        """Write `data` as a blob: hashed and compressed after its header without
        joining the two, so a 50 MB file is not copied once more on the way."""
        header = b"blob %d\0" % len(data)
        digest = hashlib.sha1(header)
        digest.update(data)
        return self._store_loose(digest.hexdigest(), data, header)

    def note_written(self, sha: str) -> None:
        """Count `sha` (say, a tree git wrote for us) among the objects `missing_written`
        checks."""
        self._written.setdefault(sha, None)

    def _remember(self, sha: str, data: bytes, header: bytes) -> None:
        size = len(data) + len(header)
        if sha in self._written and self._written[sha] is not None:
            return
        if size <= _HELD_OBJECT_MAX and self._held_bytes + size <= _HELD_BUDGET:
            self._written[sha] = (header, data)
            self._held_bytes += size
        else:
            self._written.setdefault(sha, None)

    def held(self, sha: str) -> tuple[bytes, bytes] | None:
        """The type and body of object `sha` if this process wrote it and still holds its
        bytes (a tree a checkpoint just wrote, read again to diff it); None otherwise.
        An object of an open or carried batch is always held."""
        for batch in list(self._batches.values()):
            pending = batch.objects.get(sha)
            if pending is not None:
                return pending
        pending = self._carried.get(sha)
        if pending is not None:
            return pending
        held = self._written.get(sha)
        if held is None:
            return None
        header, data = held
        if not header:  # the header leads the data
            end = data.index(b"\0") + 1
            header, data = data[:end], data[end:]
        return header.split(b" ", 1)[0], data

    def read(self, sha: str) -> ShaFile | None:
        """Object `sha` from the bytes this process holds or from its loose file; None
        when neither has it (it is in a pack, or absent)."""
        found = self.held(sha) or self.read_loose(sha)
        cls = object_class(found[0]) if found is not None else None
        if found is None or cls is None:
            return None
        return cls.from_raw_string(cls.type_num, found[1], ObjectID(sha.encode()))

    def read_loose(self, sha: str) -> tuple[bytes, bytes] | None:
        """The type and body of object `sha` from its loose file, or None where there is
        none (it is packed, or absent) or it cannot be read whole: the caller then looks
        in the packs, as git does after its loose file. Read here first because a
        repository that has seen many runs holds a pack for each, and a pack is asked
        for an object through its index, one index after another. An id that is not 40
        hex digits (a ref's content is not vouched for) names no file here."""
        if not _HEX_ID.fullmatch(sha):
            return None
        path = self._loose_path(sha)
        try:
            with open(path, "rb") as file:
                compressed = file.read()
        except OSError:
            return None
        # Inflated no further than its header says: a file written into `.git` by hand
        # (or an alternate's) can lie, and one of 1 MB can inflate to gigabytes. One
        # that says more than a reader takes is refused; a damaged one (bad zlib, more
        # or less than its header says) is left to the packs, as git leaves it.
        inflate = zlib.decompressobj()
        try:
            head = inflate.decompress(compressed, 64)
            end = head.find(b"\0")
            type_name, _, size = head[: max(end, 0)].partition(b" ")
            if end < 0 or not size.isdigit():
                return None
            if int(size) > FILE_MAX_BYTES:
                kind = type_name.decode("ascii", "replace")
                raise BlobTooLarge(f"{kind} {sha}", sha, int(size), FILE_MAX_BYTES)
            body = head[end + 1 :]
            if len(body) > int(size):
                return None
            # At least 1: a max_length of 0 is no limit at all.
            body += inflate.decompress(inflate.unconsumed_tail, int(size) - len(body) + 1)
        except zlib.error:
            return None
        if len(body) != int(size) or not inflate.eof:
            return None
        return type_name, body

    def missing_written(self, also: Iterable[str] = ()) -> list[str]:
        """The objects this process wrote (and `also`) that git does not have now,
        after writing again those whose bytes are still held: a `git gc --prune=now`
        can remove an object between its write and the ref move that makes it
        reachable. One `git cat-file --batch-check` for the lot."""
        wanted = list(dict.fromkeys([*self._written, *(sha for sha in also if sha)]))
        missing = self._absent(wanted)
        lost = []
        for sha in missing:
            held = self._written.get(sha)
            if held is None:
                lost.append(sha)
                continue
            header, data = held
            self._write_loose(sha, data, header)
        lost += self._absent([sha for sha in missing if sha not in lost])
        return lost

    def _absent(self, shas: list[str]) -> list[str]:
        """Those of `shas` git does not have. One in a pack this process wrote that is
        still there, or a loose file here, is there, read by git as it is (written whole,
        then renamed into place): only the others, packed since or gone, are asked of
        git, so a run that lost nothing starts no git process here."""
        there: dict[str, bool] = {}  # each of our packs looked for once
        shas = [
            sha
            for sha in shas
            if not self._in_our_pack(sha, there) and not os.path.isfile(self._loose_path(sha))
        ]
        if not shas:
            return []
        import subprocess

        from fabro_git.store._gitcli import git_env

        proc = subprocess.run(
            ["git", "cat-file", "--batch-check=%(objectname) %(objecttype)"],
            cwd=self.root,
            input="\n".join(shas).encode() + b"\n",
            capture_output=True,
            env=git_env(),
            check=False,
        )
        if proc.returncode != 0:
            raise git_failure(["cat-file", "--batch-check"], self.root, proc)
        return [
            line.split()[0].decode()
            for line in proc.stdout.splitlines()
            if line.endswith(b" missing")
        ]

    def _packed_here(self, sha: str) -> bool:
        """Whether a pack this process wrote holds `sha` (gone since, it went into
        git's)."""
        with self._ladder_lock:
            return self._ladder.find(bytes.fromhex(sha)) is not None

    def _in_our_pack(self, sha: str, there: dict[str, bool]) -> bool:
        """Whether a pack this process wrote holds `sha` and is still there (`there`:
        the packs looked for already)."""
        with self._ladder_lock:
            pack = self._ladder.find(bytes.fromhex(sha))
        if pack is None:
            return False
        found = there.get(pack.base)
        if found is None:
            found = there[pack.base] = os.path.isfile(pack.base + ".idx")
        return found

    def _packed(self, sha: str) -> bool:
        """Whether a pack holds `sha`. dulwich lists the pack directory at each question,
        which every new object of a checkpoint asks: the packs are listed again only
        when the directory changed. A pack added within one tick of the directory's
        clock goes unseen until the next change, and the object is written loose beside
        it: a duplicate git tolerates (and `git gc` drops), never a loss."""
        from dulwich.pack import PackFileDisappeared

        wanted = ObjectID(sha.encode())
        for _ in range(2):
            try:
                stamp = os.stat(self._packs_dir).st_mtime_ns
            except OSError:
                return False
            with self._packs_lock:
                if stamp != self._packs_stamp:
                    self._packs = list(self._store.packs)
                    self._packs_stamp = stamp
                packs = self._packs
            try:
                return any(wanted in pack for pack in packs)
            except (OSError, PackFileDisappeared):
                # A pack a repack removed within the directory's tick: list them again.
                with self._packs_lock:
                    self._packs_stamp = None
        return False

    def _loose_path(self, sha: str) -> str:
        return os.path.join(self._objects_path, sha[:2], sha[2:])

    def _store_loose(self, sha: str, data: bytes, header: bytes = b"") -> str:
        """Write `header` and `data` (or `data` alone, holding its header) as the loose
        object `sha` unless it exists; into the open batch, if this thread has one."""
        batch = self._batches.get(threading.get_ident()) if self._batches else None
        if batch is not None and len(data) <= _PACKED_OBJECT_MAX:
            if sha not in batch.objects and not self._packed_here(sha):
                if not header:
                    end = data.index(b"\0") + 1
                    header, data = data[:end], data[end:]
                batch.objects[sha] = (header.split(b" ", 1)[0], data)
                batch.size += len(data)
            self._remember(sha, data, header)
            if batch.size >= _BATCH_BYTES_MAX:
                self.flush()
            return sha
        self._remember(sha, data, header)
        return self._write_loose(sha, data, header)

    def _write_loose(self, sha: str, data: bytes, header: bytes = b"") -> str:
        # Plain strings: a checkpoint writes a dozen objects, and path objects cost more
        # than the system calls here.
        fanout = os.path.join(self._objects_path, sha[:2])
        path = os.path.join(fanout, sha[2:])
        # Looked for first, whatever its size: one syscall against a file written and
        # renamed (a stage's empty log, an unchanged file, is written at every stage).
        try:
            # Freshen the mtime so a concurrent `git gc` does not prune it before a
            # ref points at it, as git does.
            os.utime(path)
            return sha
        except FileNotFoundError:
            pass
        except PermissionError:
            return sha  # owned by another user in a shared repository; it exists
        if self._packed(sha):
            return sha
        # One zlib call for the whole object: dulwich compresses chunk by chunk, which
        # for a tree is once per entry.
        if header:
            compressor = zlib.compressobj(_LOOSE_COMPRESSION)
            data = compressor.compress(header) + compressor.compress(data) + compressor.flush()
        else:
            data = zlib.compress(data, _LOOSE_COMPRESSION)
        try:
            fd, tmp = self._open_temp(fanout)
            try:
                try:
                    # A bounded write at a time: one write(2) of tens of megabytes costs
                    # the kernel several times more than the same bytes in 1 MB ones.
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view[:FILE_CHUNK]) :]
                    if durability(self.root).loose_objects:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except BaseException as err:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                if isinstance(err, OSError) and os.path.exists(path):
                    return sha  # another user's identical object is as good
                raise
        except OSError as err:
            raise StoreError(f"cannot write object {sha} to {self.objects_dir}: {err}") from err
        return sha

    def store_file(self, path: Path, masker: StreamMasker[bytes]) -> tuple[str, int]:
        """Write the file at `path` as a blob, through `masker` (secrets out), a bounded
        chunk at a time: a 500 MB command output costs no more memory than a small one.
        Returns the blob's id and size.

        The chunks are one stream to the masker, so a secret cut in two between them
        is masked as it would be whole. When masking changes nothing, the file is hashed
        as it is; otherwise the masked bytes go to a temporary copy beside it first,
        since a loose object's header needs the final size.
        """
        import hashlib

        masked_copy: list[Path] = []
        try:
            source = _masked(path, masker, masked_copy)
            size = source.stat().st_size
            digest = hashlib.sha1(b"blob %d\0" % size)
            compressor = zlib.compressobj(_LOOSE_COMPRESSION)
            fd, tmp = self._open_temp(self._objects_path)
            try:
                with os.fdopen(fd, "wb") as out, source.open("rb") as fh:
                    out.write(compressor.compress(b"blob %d\0" % size))
                    while block := fh.read(FILE_CHUNK):
                        digest.update(block)
                        out.write(compressor.compress(block))
                    out.write(compressor.flush())
                    if durability(self.root).loose_objects:
                        out.flush()
                        os.fsync(out.fileno())
                sha = digest.hexdigest()
                target = self.objects_dir / sha[:2] / sha[2:]
                target.parent.mkdir(exist_ok=True)
                os.replace(tmp, target)
                self.note_written(sha)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as err:
            full = disk_full_in(err)
            if full is not None:
                raise full from err
            raise StoreError(f"cannot write {path} to {self.objects_dir}: {err}") from err
        finally:
            for copy in masked_copy:
                copy.unlink(missing_ok=True)
        return sha, size

    def _open_temp(self, fanout: str) -> tuple[int, str]:
        """Create a new temporary object file in `fanout`, read-only from the start.

        The file is tried first and the directory made only when it is missing, as git
        does: nearly every fan-out directory exists already, and a `mkdir` that finds
        one costs about what writing a small object does."""
        for _ in range(_TEMP_ATTEMPTS):
            tmp = os.path.join(fanout, f"tmp_obj_{os.getpid()}_{next(_tmp_counter)}")
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444), tmp
            except FileExistsError:
                continue  # debris of a crashed process that had our pid: take another name
            except FileNotFoundError:
                # Not made yet, or `git gc` / `git prune` removed it when it emptied it.
                # Another process may make it first; either way the open is tried again.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(fanout)
        raise StoreError(f"cannot create a temporary object file in {fanout}")


def _masked(path: Path, masker: StreamMasker[bytes], copies: list[Path]) -> Path:
    """`path` when `masker` changes nothing in it; else a masked copy beside it, added
    to `copies` as soon as it exists (the caller removes it)."""
    import tempfile

    with path.open("rb") as fh:
        copy = None
        released = 0  # bytes let go, all as they were until the first mask
        while True:
            chunk = fh.read(FILE_CHUNK)
            clean = masker.feed(chunk) if chunk else masker.flush()
            if copy is None and masker.masked:
                fd, name = tempfile.mkstemp(prefix=".masked-", dir=path.parent)
                copies.append(Path(name))
                copy = os.fdopen(fd, "wb")
                _copy_head(path, released, copy)
            if copy is not None:
                copy.write(clean)
            released += len(clean)
            if not chunk:
                break
        if copy is not None:
            copy.close()
            return copies[0]
    return path


def _copy_head(path: Path, size: int, out: BinaryIO) -> None:
    """Copy the first `size` bytes of `path` to `out`."""
    with path.open("rb") as head:
        remaining = size
        while remaining:
            block = head.read(min(remaining, FILE_CHUNK))
            out.write(block)
            remaining -= len(block)
