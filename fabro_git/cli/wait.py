"""`git fabro wait`: block until a run ends, and exit as the run did.

The run's process holds an exclusive `flock` for as long as it executes, so waiting is
one blocking shared lock on the same file: no polling, and it returns the moment the
process ends, however it ends. A `run -d` child that has not taken the lock yet counts
as live (its start marker), and a resume that takes the lock again is waited for too.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

EXIT_BY_STATUS = {"succeeded": 0, "partially_succeeded": 0, "failed": 1, "interrupted": 130}


def run(run_id: str, *, timeout: str | None) -> int:
    from fabro_git.cli._runs import read_row, resolve_run
    from fabro_git.durations import option_seconds
    from fabro_git.engine.lock import is_live, lock_path
    from fabro_git.errors import ConfigError
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    git_dir = Path(repo.git_dir)
    deadline = None
    if timeout is not None:
        deadline = time.monotonic() + option_seconds(timeout, "--timeout")
    while is_live(git_dir, full_id):
        if deadline is not None and time.monotonic() >= deadline:
            print(f"run {full_id} is still running after {timeout}", file=sys.stderr)
            return 124
        if not _wait_for_lock(lock_path(git_dir, full_id), deadline):
            time.sleep(0.05)  # still starting: the lock is not held yet
    meta = repo.read_ref(runrefs.meta_ref(full_id))
    if meta is None:
        raise ConfigError(f"run {full_id} has no metadata ref any more")
    from fabro_git.terminal import printable

    status = read_row(repo, full_id, meta).status
    print(f"run {full_id} {printable(status.replace('_', ' '), one_line=True)}", file=sys.stderr)
    return EXIT_BY_STATUS.get(status, 1)


def _wait_for_lock(path: Path, deadline: float | None) -> bool:
    """Block until nobody holds `path` exclusively; False if it was free at once (the
    run has not taken it yet). With a deadline, wait in short steps instead."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            pass
        if deadline is None:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return True
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                time.sleep(0.1)
        return True
    finally:
        os.close(fd)
