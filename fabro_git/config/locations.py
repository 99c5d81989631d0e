"""Where local, disposable state lives, and how it is kept private.

Nothing here is the truth: the repository is. The scratch dir holds worktrees, the live
event tail and materialised files for runs in progress; deleting it loses nothing that a
snapshot already holds. `FABRO_HOME` overrides the platform's user data dir.

A run's scratch dir is keyed by the repository as well as the run id: two clones on one
machine may both hold (and resume) the same run, and each must keep its own worktree and
event tail. The key is a short hash of the repository's resolved common git dir, so
every worktree of one repository finds the same scratch dir.

Scratch holds command output, which may hold secrets the redactor does not know of, so
it is private whatever the umask: directories we create are 0700 and files 0600. The
worktrees inside it are the user's checkouts and follow the user's umask, as any
checkout does.

A directory or file of ours that cannot be made (a read-only `.git`, a `FABRO_HOME` that
is a file or is not writable) is a user error naming the path and the reason, and
`FABRO_HOME` when the path lies under it: never a traceback. A full disk stays an
`OSError`, which the CLI reports as such.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from fabro_git.errors import DISK_FULL_ERRNOS, ConfigError, FabroError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600

# What refuses to create a file: the place is not the user's to write, for good.
_REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR})


def fabro_home() -> Path:
    override = os.environ.get("FABRO_HOME")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("git-fabro", appauthor=False))


def runs_dir() -> Path:
    return fabro_home() / "runs"


def repo_key(git_dir: Path) -> str:
    """A short, stable name for the repository whose common git dir is `git_dir`."""
    import hashlib

    return hashlib.sha256(os.fsencode(Path(git_dir).resolve())).hexdigest()[:12]


def run_scratch_dir(git_dir: Path, run_id: str) -> Path:
    """`runs/<run id>-<repository key>/`: this repository's scratch dir for the run."""
    return runs_dir() / f"{run_id}-{repo_key(git_dir)}"


def crash_log_dir() -> Path:
    return fabro_home() / "crash-logs"


def make_private_dir(path: Path) -> Path:
    """Create `path` and its missing parents as 0700 dirs, whatever the umask.

    A `path` that already exists and is ours is narrowed to 0700 too (a scratch dir an
    older version made 0755); parents that exist are left alone.
    """
    path = Path(path)
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR)
        except FileExistsError:
            pass
        except OSError as err:
            if err.errno in DISK_FULL_ERRNOS:
                raise
            raise unwritable(directory, err) from err
    with contextlib.suppress(OSError):
        info = path.stat()
        if stat.S_IMODE(info.st_mode) != PRIVATE_DIR and info.st_uid == os.getuid():
            os.chmod(path, PRIVATE_DIR)
    return path


def open_private(path: Path, flags: int) -> int:
    """`os.open` that creates the file 0600 (and narrows an existing one of ours)."""
    try:
        fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    except OSError as err:
        if err.errno not in _REFUSED:
            raise
        raise unwritable(Path(path), err) from err
    with contextlib.suppress(OSError):
        info = os.fstat(fd)
        if stat.S_IMODE(info.st_mode) != PRIVATE_FILE and info.st_uid == os.getuid():
            os.fchmod(fd, PRIVATE_FILE)
    return fd


def unwritable(path: Path, err: OSError) -> FabroError:
    """The user error for `path`, ours to write, that `err` refused: it names the path
    and the reason, and `FABRO_HOME` when the path is under it."""
    reason = err.strerror or str(err)
    home = fabro_home()
    if path.is_relative_to(home):
        return ConfigError(
            f"FABRO_HOME ({home}) is not usable: cannot write {path}: {reason}",
            hint="set FABRO_HOME to a directory you can write to (git-fabro keeps the "
            "scratch dirs of runs and its logs there)",
        )
    return FabroError(
        f"cannot write {path}: {reason}",
        hint=f"make {path.parent} writable (git-fabro keeps its locks and run records "
        "under the repository's git dir), or work in a clone you can write to",
    )
