"""Compare-and-swap of one loose ref, flushed to disk only when git would flush it.

dulwich's `set_if_equals` and `add_if_new` always `fsync` the ref's lock file, and
offer no switch; git flushes a ref update only when `core.fsync` names `reference`
(not by default). This is the same update with the flush made a parameter: take
`<ref>.lock` (O_EXCL, so a held lock surfaces as `FileLocked`), read the ref again
under it (loose file, then packed-refs), give up if it moved, write the new id, append
the reflog line, rename the lock into place. The reflog is appended before the rename,
as dulwich does, and like git it is never flushed. The line is written here, in git's
format, rather than by dulwich's reflog writer, which parses the repository's config
file again at every update (for `core.sharedRepository`): two config parses a stage.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dulwich.file import GitFile, SharedPerm, adjust_shared_perm
from dulwich.objects import ZERO_SHA, ObjectID
from dulwich.reflog import format_reflog_line
from dulwich.refs import DiskRefsContainer, Ref, SymrefLoop


def swap_ref(
    refs: DiskRefsContainer,
    name: Ref,
    old: ObjectID | None,
    new: ObjectID,
    *,
    fsync: bool,
    logs: Path,
    shared: SharedPerm | None,
    committer: bytes,
    timestamp: int,
    timezone: int,
    message: bytes,
    make_dirs: bool = True,
) -> bool:
    """Point `name` at `new` if it points at `old` (old=None: if it does not exist).
    False when it does not; True also when it already points at `new` (no reflog line
    then, as with dulwich). The reflog line goes under `logs` (the common dir's
    `logs/`), with `shared` permissions when the repository is shared. Without
    `make_dirs` the ref's directory is taken to exist (FileNotFoundError if not)."""
    try:
        realnames, contents = refs.follow(name)
        realname = realnames[-1]
    except (KeyError, IndexError, SymrefLoop):
        realname, contents = name, None
    if old is None and contents is not None:
        return False
    filename = refs.refpath(realname)
    packed = refs.get_packed_refs()
    if old is not None:
        _refuse_packed_parent(packed, realname, filename)
    if make_dirs:
        os.makedirs(os.path.dirname(filename), exist_ok=True)
    with GitFile(filename, "wb", fsync=fsync) as f:
        current = refs.read_loose_ref(realname)
        if current is None:
            packed = refs.get_packed_refs()  # read again under the lock
            current = packed.get(realname)
        if old is None:
            if os.path.exists(filename) or name in packed:
                f.abort()
                return False
        elif (current if current is not None else ZERO_SHA) != old:
            f.abort()
            return False
        elif current == new:
            f.abort()
            return True
        f.write(new + b"\n")
        logged = realname if old is not None else name
        line = format_reflog_line(old, new, committer, timestamp, timezone, message)
        log_path = logs / os.fsdecode(logged)
        with open(log_path, "ab") as log:
            log.write(line + b"\n")
        if shared is not None:
            adjust_shared_perm(log_path, shared)
    return True


def _refuse_packed_parent(packed: Mapping[Ref, object], name: Ref, filename: str | bytes) -> None:
    """NotADirectoryError when a packed ref's name is a directory of `name`: git cannot
    hold both."""
    probe = Ref(os.path.dirname(name))
    while probe:
        if packed.get(probe) is not None:
            raise NotADirectoryError(filename)
        probe = Ref(os.path.dirname(probe))
