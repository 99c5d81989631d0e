"""The process groups a run's stages start, so none of them outlives the run.

A stage command runs as the leader of its own process group (and session). A kill -9 of
`git fabro` does not reach that group: the command, and whatever it started in the
background, would go on writing into the worktree a resumed run is about to restore.
So each group is recorded in the run's scratch dir while it may be alive (one small
file per group, written atomically), and killed when the run ends and when a resumed
run starts.

A pid can be recycled once its group is gone, so a record also holds the leader's start
time (from `/proc/<pid>/stat`, in clock ticks since boot) and the boot id. A group is
only signalled when its leader is the very process recorded, or, with the leader gone,
when every member started after it and still sits in the leader's session: Linux never
hands out an id that a live group or session still uses. Without `/proc` a record is
never trusted, only removed.

On Linux the command's leader also gets `PR_SET_PDEATHSIG`, so it dies with `git fabro`
rather than waiting for a resume; the signal reaches that one process only, which is
why the records are still needed. The kernel sends it when the *thread* that forked
the child ends, and trio forks from worker threads that end after ten idle seconds: so
such a child is started on the thread trio runs on, and waited for through a pidfd. The
request is made by util-linux `setpriv` when it is installed, else in a preexec function.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import trio

_PROC = Path("/proc")
_PR_SET_PDEATHSIG = 1


class StageProcess(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


async def start(
    argv: list[str],
    *,
    cwd: Path,
    stdout: IO[bytes],
    stderr: IO[bytes],
    env: dict[str, str],
    stdin: IO[bytes] | None = None,
) -> StageProcess:
    """Start a command as the leader of a new session (and so of a new process group).
    Its stdin is `stdin`, else nothing."""
    options: dict[str, Any] = dict(
        cwd=str(cwd),
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        stdout=stdout,
        stderr=stderr,
        env=env,
        start_new_session=True,
    )
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return await trio.lowlevel.open_process(argv, **options)
    # Started here, on trio's own thread, which lives as long as the run (see above).
    setpriv = _setpriv()
    if setpriv is not None:
        # Cheaper than a preexec function, which makes Python fork instead of vfork:
        # about 1 ms of the trio thread's time per stage instead of 5.
        popen = subprocess.Popen([setpriv, "--pdeathsig", "KILL", "--", *argv], **options)
    else:
        popen = subprocess.Popen(argv, preexec_fn=_die_with_parent(), **options)
    return _Child(popen)


class _Child:
    """A child waited for through a pidfd, without a thread (Linux)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self._pidfd: int | None = os.pidfd_open(popen.pid)
        self._finalizer = weakref.finalize(self, os.close, self._pidfd)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        while self._popen.poll() is None:
            assert self._pidfd is not None
            await trio.lowlevel.wait_readable(self._pidfd)
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            self._finalizer()
            self._pidfd = None
        return self._popen.returncode


@functools.cache
def _setpriv() -> str | None:
    """util-linux `setpriv` if it can set the parent-death signal (2.33 and later)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        usage = subprocess.run([path, "--help"], capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if b"--pdeathsig" in usage else None


_prctl: Callable[..., int] | None = None


def _die_with_parent() -> Callable[[], None]:
    """A preexec function asking for SIGKILL when this process dies (Linux)."""
    global _prctl
    if _prctl is None:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl, parent = _prctl, os.getpid()

    def preexec() -> None:
        # Runs in the child between fork and exec: a system call and nothing else.
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def records_dir(scratch: Path) -> Path:
    """Where a run's scratch dir keeps its process group records."""
    return scratch / "process-groups"


@dataclass(frozen=True)
class _Process:
    pid: int
    pgid: int
    session: int
    start: int
    zombie: bool


def record(directory: Path, pgid: int) -> Path | None:
    """Note that group `pgid` (led by the process `pgid`) belongs to this run."""
    leader = _read_stat(pgid)
    entry = {"pgid": pgid, "start": leader.start if leader else None, "boot": _boot_id()}
    if directory not in _made_dirs:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _made_dirs.add(directory)
    path = directory / f"{pgid}.json"
    # A live group's id is unique on the machine, so a temporary name from it is ours
    # alone; what a crashed run left under it is replaced.
    tmp = directory / f".{pgid}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except FileNotFoundError:  # the directory went away (a cleanup): make it again
        _made_dirs.discard(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _made_dirs.add(directory)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps(entry).encode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


# Record directories known to exist, so a stage's record costs no mkdir.
_made_dirs: set[Path] = set()


def forget(path: Path | None) -> None:
    """Drop a group's record once nothing of it is left."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (zombies waiting to be reaped don't)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not _PROC.is_dir():
        return True
    return any(p.pgid == pgid and not p.zombie for p in _processes())


def kill_recorded(directory: Path, *, grace: float = 0.0) -> list[int]:
    """Kill every recorded group that is still ours; returns the pgids signalled.

    With `grace`, SIGTERM first and SIGKILL for what is left after `grace` seconds.
    """
    if not directory.is_dir():
        return []
    killed: list[int] = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            pgid = int(entry["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            forget(path)
            continue
        if _still_ours(pgid, entry.get("start"), entry.get("boot")):
            _stop(pgid, grace)
            killed.append(pgid)
        forget(path)
    return killed


def _stop(pgid: int, grace: float) -> None:
    if grace > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _still_ours(pgid: int, start: int | None, boot: str | None) -> bool:
    if start is None or boot is None or boot != _boot_id():
        return False
    members = [p for p in _processes() if p.pgid == pgid and not p.zombie]
    if not members:
        return False
    leader = next((p for p in members if p.pid == pgid), None)
    if leader is not None:
        return leader.start == start
    return all(p.session == pgid and p.start >= start for p in members)


def _processes() -> list[_Process]:
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(_PROC):
            if entry.name.isdigit():
                process = _read_stat(int(entry.name))
                if process is not None:
                    found.append(process)
    return found


def _read_stat(pid: int) -> _Process | None:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return _Process(
            pid=pid,
            pgid=int(fields[2]),
            session=int(fields[3]),
            start=int(fields[19]),
            zombie=fields[0] == "Z",
        )
    except (IndexError, ValueError):
        return None


@functools.cache
def _boot_id() -> str | None:
    """This boot's id; it stays the same for as long as this process lives."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None
