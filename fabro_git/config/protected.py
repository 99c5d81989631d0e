"""`.fabro/` in an `--in-place` run: the user's own configuration, which no stage may change.

An in-place run works in the user's checkout, so a file a stage writes under `.fabro/`
is read by the user's next run: a `run_start` hook planted in `.fabro/project.toml`
would run as the user, outside any run. (A run in its own worktree is safe as it is:
the configuration is read from the user's checkout at the start and kept in the run's
manifest, so nothing a stage writes in the run's worktree is loaded by a later stage,
by `resume` or by the next run.)

The file tools refuse such writes up front (`fabro_git.agent.workspace`). What runs
commands (a command stage, an agent's `shell` tool, an agent CLI) cannot be stopped
before it writes, so `.fabro/` is snapshotted before and compared after: every entry's
kind, mode and bytes (or link target). A change fails the tool call or the stage, and
is put back from the snapshot: entries added are removed, changed and removed ones
written again. A file larger than `KEEP_LIMIT` is kept as its hash only, so a change to
it is found but cannot be put back (which is said).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import msgspec

CONFIG_DIR = ".fabro"
# Files up to this size are kept whole in a snapshot, so a change to them can be undone.
KEEP_LIMIT = 4 * 1024 * 1024


class Entry(msgspec.Struct, frozen=True):
    kind: str  # "dir", "file", "link" or "other"
    mode: int
    digest: str  # of a file's bytes or a link's target; "" for the rest
    data: bytes | None = None  # a file's bytes or a link's target, when kept


class ConfigSnapshot:
    """The entries under `<root>/.fabro` (the directory itself as "."), as they stood."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.entries = _entries(self.root / CONFIG_DIR)

    @property
    def may_have_changed(self) -> bool:
        """Whether `changes()` can find anything: False, from one `lstat` and without
        reading a file, when there was no `.fabro/` and there is none now (most stages:
        the walk can skip a trip to a worker thread)."""
        return bool(self.entries) or os.path.lexists(self.root / CONFIG_DIR)

    def changes(self) -> list[str]:
        """The `.fabro/...` paths that differ now, sorted; empty when nothing changed."""
        now = _entries(self.root / CONFIG_DIR)
        names = {
            name
            for name in self.entries.keys() | now.keys()
            if not _same(self.entries.get(name), now.get(name))
        }
        return sorted(_shown(name) for name in names)

    def restore(self) -> list[str]:
        """Put `.fabro/` back as it stood; the paths that could not be (too large to keep,
        or an error), empty when all were."""
        top = self.root / CONFIG_DIR
        now = _entries(top)
        failed: list[str] = []
        # Entries that are new or of another kind go first, deepest first.
        for name in sorted(now, key=lambda n: n.count("/"), reverse=True):
            was = self.entries.get(name)
            if was is None or was.kind != now[name].kind:
                try:
                    _remove(top / name if name != "." else top)
                except OSError:
                    failed.append(_shown(name))
        for name in sorted(self.entries, key=lambda n: (n != ".", n.count("/"), n)):
            was = self.entries[name]
            path = top if name == "." else top / name
            if _same(was, _entry(path)):
                continue
            try:
                if not _put_back(path, was):
                    failed.append(_shown(name))
            except OSError:
                failed.append(_shown(name))
        return failed


def config_change_refused(before: ConfigSnapshot, *, what: str = "the command") -> str | None:
    """None when `.fabro/` is as `before` found it; otherwise it is put back, and this
    says what changed and whether all of it could be undone."""
    changed = before.changes() if before.may_have_changed else []
    if not changed:
        return None
    failed = before.restore()
    shown = ", ".join(changed[:10]) + (
        f" and {len(changed) - 10} more" if len(changed) > 10 else ""
    )
    undone = (
        "put back as it was"
        if not failed
        else f"put back, except {', '.join(failed[:10])} (restore those by hand)"
    )
    return (
        f"refused: {what} changed {shown}. {CONFIG_DIR}/ holds the project's configuration, "
        f"which the user's next run obeys; in an --in-place run no stage may change it. "
        f"It was {undone}."
    )


def _shown(name: str) -> str:
    return f"{CONFIG_DIR}/" if name == "." else f"{CONFIG_DIR}/{name}"


def _entries(top: Path) -> dict[str, Entry]:
    first = _entry(top)
    if first is None:
        return {}
    found = {".": first}
    if first.kind != "dir":
        return found
    for directory, subdirectories, files in os.walk(top):  # symlinks are not followed
        base = Path(directory)
        for name in [*subdirectories, *files]:
            entry = _entry(base / name)
            if entry is not None:
                found[(base / name).relative_to(top).as_posix()] = entry
    return found


def _entry(path: Path) -> Entry | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISDIR(info.st_mode):
        return Entry("dir", mode, "")
    if stat.S_ISLNK(info.st_mode):
        target = os.fsencode(os.readlink(path))
        return Entry("link", 0, hashlib.sha256(target).hexdigest(), target)
    if not stat.S_ISREG(info.st_mode):
        return Entry("other", mode, "")
    digest = hashlib.sha256()
    kept: list[bytes] | None = [] if info.st_size <= KEEP_LIMIT else None
    # Opened as what lstat saw: a FIFO or a link swapped in since is never waited on
    # nor followed, and is "other".
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return Entry("other", mode, "")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Entry("other", mode, "")
        while chunk := os.read(fd, 1024 * 1024):
            digest.update(chunk)
            if kept is not None:
                kept.append(chunk)
    except OSError:
        return Entry("other", mode, "")
    finally:
        os.close(fd)
    return Entry("file", mode, digest.hexdigest(), None if kept is None else b"".join(kept))


def _same(was: Entry | None, now: Entry | None) -> bool:
    if was is None or now is None:
        return was is now
    return (was.kind, was.mode, was.digest) == (now.kind, now.mode, now.digest)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _put_back(path: Path, was: Entry) -> bool:
    if was.kind == "dir":
        if not path.is_dir() or path.is_symlink():
            _remove(path)
            path.mkdir()
        os.chmod(path, was.mode)
        return True
    if was.kind == "other" or was.data is None:
        return False
    _remove(path)
    if was.kind == "link":
        os.symlink(os.fsdecode(was.data), path)
        return True
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, was.mode)
    with open(fd, "wb") as fh:
        fh.write(was.data)
    os.chmod(path, was.mode)
    return True
