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
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


def records_dir(scratch: Path) -> Path:
    """Where a run's scratch dir keeps its process group records."""
    return scratch / "process-groups"


@dataclass(frozen=True)
class _Process:
    pid: int
    pgid: int
    session: int
    start: int


def record(directory: Path, pgid: int) -> Path | None:
    """Note that group `pgid` (led by the process `pgid`) belongs to this run."""
    leader = _read_stat(pgid)
    entry = {"pgid": pgid, "start": leader.start if leader else None, "boot": _boot_id()}
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{pgid}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{pgid}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(entry, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def forget(path: Path | None) -> None:
    """Drop a group's record once nothing of it is left."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    members = [p for p in _processes() if p.pgid == pgid]
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
        return _Process(pid=pid, pgid=int(fields[2]), session=int(fields[3]), start=int(fields[19]))
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None
