"""One live process per run.

An advisory `flock` on `<git dir>/fabro/locks/<run id>.lock`: the kernel drops it when
the process dies, kill -9 included, so a crashed run never needs unlocking by hand and
`ps` can tell a live run from an interrupted one without trusting pid files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.config.locations import make_private_dir, open_private
from fabro_git.errors import RunLocked

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo


def lock_path(git_dir: Path, run_id: str) -> Path:
    return git_dir / "fabro" / "locks" / f"{run_id}.lock"


def starting_path(git_dir: Path, run_id: str) -> Path:
    """Names the process that is about to take the run's lock (a `run -d` child)."""
    return git_dir / "fabro" / "locks" / f"{run_id}.starting"


def mark_starting(git_dir: Path, run_id: str, pid: int) -> None:
    """Record that `pid` will execute the run, so the run counts as live until it has
    taken the lock: `logs -f` and `ps` right after `run -d` must not see it as dead."""
    path = starting_path(git_dir, run_id)
    make_private_dir(path.parent)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as out:
        out.write(f"pid {pid}\n")
    os.replace(tmp, path)


def checkout_lock_path(git_dir: Path, checkout: Path) -> Path:
    """The lock of the in-place runs of `checkout` (one checkout of the repository)."""
    key = hashlib.sha1(os.fsencode(Path(checkout).resolve())).hexdigest()[:16]
    return git_dir / "fabro" / "locks" / f"in-place-{key}.lock"


class RunLock:
    def __init__(self, repo: GitRepo, run_id: str) -> None:
        self.run_id = run_id
        self.git_dir = Path(repo.git_dir)
        self.root = Path(repo.root)
        self.path = lock_path(self.git_dir, run_id)
        self._fd: int | None = None
        self._checkout_fd: int | None = None

    def hold_checkout(self) -> None:
        """One in-place run at a time in a checkout: two would work in the same files,
        each recording the other's writes as its own. Held with the run's lock, and
        dropped with it (by the kernel too, when the process dies)."""
        path = checkout_lock_path(self.git_dir, self.root)
        fd = open_private(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 80, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunLocked(
                f"another run works in place in {self.root} ({holder})",
                hint="wait for it to end, or run this one without --in-place (in a worktree "
                "of its own)",
            ) from None
        record = f"run {self.run_id}, pid {os.getpid()}".ljust(60).encode() + b"\n"
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
        self._checkout_fd = fd

    def acquire(self) -> None:
        make_private_dir(self.path.parent)
        fd = open_private(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunLocked(
                f"run {self.run_id} is being executed by {holder}",
                hint="wait for it to finish, or follow it with `git fabro logs -f "
                + self.run_id
                + "`",
            ) from None
        # One fixed-width write over the old record, never an empty file in between: a
        # loser reading it right now sees a whole record.
        record = f"pid {os.getpid()}".ljust(23).encode() + b"\n"
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
        self._fd = fd
        with contextlib.suppress(FileNotFoundError):
            starting_path(self.git_dir, self.run_id).unlink()

    def clear_stale_ref_locks(
        self, refs: Sequence[str], namespaces: Sequence[str] = ()
    ) -> list[Path]:
        """Remove `<ref>.lock` files of this run's own refs; call only while holding the lock.

        A process killed inside a ref update (kill -9 between creating the lock file and
        renaming it into place) leaves the lock behind, and every later update of that ref
        fails as "locked by another process". The refs named here (and every ref under the
        `namespaces` directories) are written only by the process that holds this run's
        lock, so once we hold it any such file is debris.
        """
        if self._fd is None:
            raise RuntimeError("clear_stale_ref_locks needs the run lock held")
        candidates = [self.git_dir / f"{ref}.lock" for ref in refs]
        for namespace in namespaces:
            candidates += sorted((self.git_dir / namespace).rglob("*.lock"))
        removed: list[Path] = []
        for stale in candidates:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
                removed.append(stale)
        return removed

    def release(self) -> None:
        if self._checkout_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._checkout_fd, fcntl.LOCK_UN)
                os.close(self._checkout_fd)
            self._checkout_fd = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> str:
    """Who holds the lock, as its pid line.

    The winner of a race writes that line just after taking the lock, so for a moment
    the file can be empty or still name a holder that was killed: read it again until it
    names a live process, then give up and say nothing specific.
    """
    for _ in range(50):
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if text.startswith("pid ") and _alive(text[4:]):
            return text
        time.sleep(0.01)
    return "another process"


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def is_live(git_dir: Path, run_id: str) -> bool:
    """True when some process holds the run's lock right now, or is starting to."""
    return _locked(git_dir, run_id) or _starting(git_dir, run_id)


def _starting(git_dir: Path, run_id: str) -> bool:
    try:
        text = starting_path(git_dir, run_id).read_text()
    except OSError:
        return False
    return text.startswith("pid ") and _alive(text[4:].strip())


def _locked(git_dir: Path, run_id: str) -> bool:
    path = lock_path(git_dir, run_id)
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
