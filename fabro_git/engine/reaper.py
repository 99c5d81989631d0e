"""Killing what a run's stages left running, from the records the run keeps; also from a
small watcher process that outlives a killed `git fabro`.

A stage command runs as the leader of its own process group (and session), so a kill -9
of `git fabro` does not reach it: the command, and whatever it started in the
background, would go on writing into the worktree a resumed run is about to restore.
Each group is recorded in the run's scratch dir while it may be alive (one small file
per group, written atomically), and killed when the run ends, when a resumed run
starts, and by the watcher the moment `git fabro` dies.

The watcher is a shell (`WAIT`, ~1 ms to start) that reads its stdin, a pipe whose
other end only `git fabro` holds: end of file means that process is gone, however it
went. Only then does it become a bare interpreter (`exec`, the same process) that loads
this file (standard library only), kills the groups its parent recorded and exits. A
run that ends as it should kills what it recorded itself and then writes `done` down
the pipe: the shell exits, and no interpreter is started. That
replaces asking the kernel for a parent-death signal per command (`PR_SET_PDEATHSIG`),
which Python can only request by forking instead of vforking, or through `setpriv`,
one more program started per command; and the watcher kills the whole group, where the
signal reached the leader only.

A group does not hold everything a stage starts: `setsid`, a double fork or `nohup ... &`
under a new session leaves it. Three nets catch what leaves:

- Ancestry. `git fabro` makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`,
  through `prctl`, Linux only), so a process whose parent dies is re-parented to it
  rather than to init, however it left its group and whatever its environment. What is
  re-parented to it in another session than its own (`adopted`) it did not start
  itself: that is what its stages left behind, killed with the whole tree under it
  (`descendants`, from the parent pid in `/proc/<pid>/stat`) when the stage ends
  (`fabro_git.engine.process_groups.sweep_adopted`), and all of it when the run ends.
  Which stage an adopted process came from is told by its mark (below); one with no
  mark (its environment cleared) is killed at the end of a stage only when no other
  stage of the run is running, else at the end of the last one. `git fabro`'s own
  children in a session of their own are told apart by a mark of their own
  (`own.<nonce>`, set in its environment, so what git itself leaves, a detached
  `git gc --auto`, is spared too), and the watcher by its pid; an MCP server carries
  its stage's mark, and is left running at the end of another stage. Killing a recorded group
  kills everything descended from its members too, found before the group is killed.
- The mark. Each stage's processes carry `FABRO_PROCESS_MARK=<nonce>.<kind>.<n>` in
  their environment (the nonce random per run and process, the kind `stage` or `hook`,
  n a count), and every process whose `/proc/<pid>/environ` holds the stage's mark is
  killed (with its descendants) when the stage ends; the run's nonce, recorded beside
  the groups, lets the run's end, a resume and the watcher kill whatever carries it.
- Records of adopted processes. After a kill -9 of `git fabro` what it had adopted is
  re-parented to init, where ancestry no longer finds it, so `git fabro` records each
  adopted process it sees (pid and start time) beside the groups, each time a shell
  tool call ends, and the watcher kills those too.

Left out: a process that clears its environment, leaves its group's session, and whose
parent then dies, in a stage still running when `git fabro` is killed with -9 before
it saw that process (a cgroup per stage would catch that, but needs a delegated cgroup
tree, which a user's shell seldom has); and a stage that reads `git fabro`'s own mark
from `/proc` and puts it on its process. Elsewhere than Linux only the groups and the
marks hold.

The watcher cannot be the subreaper: it is no ancestor of the stages' processes, and a
subreaper only receives its descendants' orphans.

A pid can be recycled once its group is gone, so a record also holds the leader's start
time (as `/proc/<pid>/stat` gives it, in clock ticks since boot) and the boot id. For a
command `git fabro` started itself the start time is not read back but bracketed: the
boot clock read just before the spawn and just after it (`start` and `start_max`, most
often one tick), since reading a fresh child's `/proc/<pid>/stat` waits while it
loads. A group is only signalled when its leader is the very process recorded, or, with the leader gone,
when every member started after it and still sits in the leader's session: Linux never
hands out an id that a live group or session still uses. Without `/proc` a record is
never trusted, only removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple, TypedDict

_PROC = Path("/proc")


class ProcessRecord(TypedDict, total=False):
    """A record `process_groups` writes, one JSON file each: a process group
    (`pgid`, `kind`), a run's mark (`mark`) or an adopted orphan (`orphan`); `start`
    and `boot` tell the process from a later one given the same pid."""

    pgid: int
    kind: str
    mark: str
    orphan: int
    start: int | None
    start_max: int  # the latest start a bracketed one may have (see above)
    boot: str | None
    owner: int


class ProcessInfo(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    session: int
    start: int
    zombie: bool


def trusts_records() -> bool:
    """Whether records can be checked here (Linux's `/proc`); elsewhere they are never
    trusted, only removed."""
    return _PROC.is_dir()


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
    return any(p.pgid == pgid and not p.zombie for p in processes())


MARK_VARIABLE = "FABRO_PROCESS_MARK"


# What `pids` read last, and when (`time.monotonic`).
_last_read: tuple[float, frozenset[int]] | None = None
# How old a read `pids_lately` takes.
RECENT = 0.25


def pids() -> set[int]:
    """The pids of the processes now alive (or waiting to be reaped)."""
    global _last_read
    with contextlib.suppress(OSError):
        found = {int(name) for name in os.listdir(_PROC) if name.isdigit()}
        _last_read = (time.monotonic(), frozenset(found))
        return found
    return set()


def pids_lately(max_age: float = RECENT) -> set[int]:
    """Pids that were alive a moment ago: the last read of `pids` if it is at most
    `max_age` seconds old, else a new one. What a stage is about to start is in neither,
    so either serves as the pids it did not start (`kill_marked`'s `since`); a process
    started in between is looked at too, which costs one read of its environment. In a
    pipeline of short stages, each takes the read its predecessor's sweep made: one read
    of `/proc` a stage rather than two."""
    last = _last_read
    if last is not None and time.monotonic() - last[0] <= max_age:
        return set(last[1])
    return pids()


def marked(mark: str, among: set[int] | None = None) -> list[int]:
    """The live processes (of `among`, else all) whose environment carries `mark` or a
    mark under it (`<mark>.<more>`)."""
    exact = f"{MARK_VARIABLE}={mark}".encode()
    under = exact + b"."
    found = []
    for pid in sorted(pids() if among is None else among):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or another user's
            continue
        if exact not in environ:
            continue
        if any(v == exact or v.startswith(under) for v in environ.split(b"\0")):
            process = read_stat(pid)
            if process is not None and not process.zombie:
                found.append(pid)
    return found


def kill_marked(
    mark: str, *, since: set[int] | None = None, alive: set[int] | None = None
) -> list[int]:
    """SIGKILL every process carrying `mark` (see `marked`); with `since`, only those
    whose pid was not alive then (a stage's, started after it began). Repeated until
    none is found, so a child forked during the sweep goes too. `alive`: the pids alive
    now, read by the caller a moment ago (the first look takes them rather than reading
    `/proc` again)."""
    killed: list[int] = []
    for _ in range(50):
        now = pids() if alive is None or killed else alive
        among = None if since is None else now - since
        found = [pid for pid in marked(mark, among) if pid != os.getpid()]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += found
        killed += kill_processes(descendants(found))
    return killed


PR_SET_CHILD_SUBREAPER = 36


# Whether this process may become a subreaper: the `git fabro` command may, a library
# user's process (a test's) is left as it is.
def become_subreaper() -> bool:
    """Make this process the one that orphans among its descendants are re-parented to
    (Linux's `PR_SET_CHILD_SUBREAPER`), if it is the `git-fabro` command itself
    (`fabro_git.running_as_command`); whether it now is."""
    import fabro_git

    if not fabro_git.running_as_command or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(
    roots: Iterable[int], table: list[ProcessInfo] | None = None, *, zombies: bool = False
) -> list[ProcessInfo]:
    """The live processes descended from `roots` (the roots left out), by the parent
    each has now (and those waiting to be reaped, with `zombies`)."""
    children: dict[int, list[ProcessInfo]] = {}
    for process in processes() if table is None else table:
        children.setdefault(process.ppid, []).append(process)
    stack = list(roots)
    seen = set(stack)
    found = []
    while stack:
        for child in children.get(stack.pop(), ()):
            if child.pid not in seen:
                seen.add(child.pid)
                stack.append(child.pid)
                if zombies or not child.zombie:
                    found.append(child)
    return found


def adopted(table: list[ProcessInfo] | None = None) -> list[ProcessInfo]:
    """This process's live children in another session than its own: those it started
    in a session of their own (told apart by the caller), and what was re-parented to it
    as a subreaper."""
    me, session = os.getpid(), os.getsid(0)
    return [
        p
        for p in (processes() if table is None else table)
        if p.ppid == me and p.session != session and not p.zombie
    ]


def children() -> set[int] | None:
    """This process's children, living or not yet reaped: what each of its threads
    started, and what was re-parented to it. None where the kernel does not list them
    (`/proc/<pid>/task/<tid>/children`), or when a thread ended while they were read
    (its children move to another thread, perhaps one read already).

    The kernel reads a list a child at a time, and a child reaped between two steps can
    make it skip the one after: a list that holds only children the caller knows (its
    watchers, which live as long as the run, and children it started itself, reaped on
    the thread that reads this) tells that nothing else is there."""
    found: set[int] = set()
    tasks = _PROC / "self" / "task"
    try:
        threads = os.listdir(tasks)
        for tid in threads:
            with open(tasks / tid / "children", "rb") as fh:
                found.update(int(pid) for pid in fh.read().split())
        if sorted(os.listdir(tasks)) != sorted(threads):
            return None
    except (OSError, ValueError):
        return None
    return found


def mark_of(pid: int) -> str | None:
    """The `MARK_VARIABLE` in process `pid`'s environment; None without one (or when
    it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
    except OSError:
        return None
    prefix = MARK_VARIABLE.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode("utf-8", "replace")
    return None


def kill_processes(targets: Iterable[ProcessInfo]) -> list[int]:
    """SIGKILL each of `targets` that is still the process it was (same start time)."""
    killed = []
    for process in targets:
        now = read_stat(process.pid)
        if now is None or now.start != process.start or now.zombie:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)
            killed.append(process.pid)
    return killed


def kill_recorded(
    directory: Path, *, grace: float = 0.0, owner: int | None = None, kind: str | None = None
) -> list[int]:
    """Kill every recorded group that is still ours, and every process carrying a
    recorded run's mark; returns the pgids and marked pids signalled.

    With `grace`, SIGTERM first and SIGKILL for what is left after `grace` seconds. With
    `owner`, only the groups that process recorded (another process may since have
    resumed the run and recorded its own); with `kind`, only those of that kind
    (`stage`, `hook`).
    """
    if not directory.is_dir():
        return []
    killed: list[int] = []
    for path in sorted(directory.glob("*.json")):
        try:
            entry: ProcessRecord = json.loads(path.read_text())
            orphan = entry.get("orphan")
            mark = entry.get("mark")
            pgid = int(entry["pgid"]) if mark is None and orphan is None else 0
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            if owner is None:
                forget(path)
            continue
        if owner is not None and entry.get("owner") != owner:
            continue
        if isinstance(orphan, int):
            if kind in (None, "stage"):
                killed += _kill_adopted(path, entry, orphan)
        elif isinstance(mark, str):
            killed += _kill_run_mark(path, entry, mark, kind)
        elif kind is None or entry.get("kind", "stage") == kind:
            killed += _kill_group(path, entry, pgid, grace)
    return killed


def _kill_adopted(path: Path, entry: ProcessRecord, orphan: int) -> list[int]:
    """A process `git fabro` adopted: killed, with all under it, if still itself."""
    killed: list[int] = []
    process = read_stat(orphan) if entry.get("boot") == boot_id() else None
    if process is not None and process.start == entry.get("start"):
        killed = kill_processes([process, *descendants([orphan])])
    forget(path)
    return killed


def _kill_run_mark(path: Path, entry: ProcessRecord, mark: str, kind: str | None) -> list[int]:
    """The run's nonce: every process of this kind (or any) carrying it goes; the record
    stays while hooks may still run."""
    killed: list[int] = []
    if entry.get("boot") == boot_id() and _PROC.is_dir():
        killed = kill_marked(mark if kind is None else f"{mark}.{kind}")
    if kind is None:
        forget(path)
    return killed


def _kill_group(path: Path, entry: ProcessRecord, pgid: int, grace: float) -> list[int]:
    """A recorded process group, if it is still the one recorded."""
    killed: list[int] = []
    if still_ours(pgid, entry.get("start"), entry.get("boot"), entry.get("start_max")):
        # What left the group from under its members goes too: found first, as a
        # member's death re-parents its children.
        table = processes()
        below = descendants([p.pid for p in table if p.pgid == pgid], table)
        _stop(pgid, grace)
        kill_processes(p for p in below if p.pgid != pgid)
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


def still_ours(
    pgid: int, start: int | None, boot: str | None, start_max: int | None = None
) -> bool:
    """Whether group `pgid`, recorded with its leader's `start` time (or a start between
    `start` and `start_max`) in boot `boot`, is still the group recorded (see the
    module's docstring)."""
    if start is None or boot is None or boot != boot_id():
        return False
    members = [p for p in processes() if p.pgid == pgid and not p.zombie]
    if not members:
        return False
    leader = next((p for p in members if p.pid == pgid), None)
    if leader is not None:
        return start <= leader.start <= max(start, start_max or start)
    return all(p.session == pgid and p.start >= start for p in members)


def processes() -> list[ProcessInfo]:
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(_PROC):
            if entry.name.isdigit():
                process = read_stat(int(entry.name))
                if process is not None:
                    found.append(process)
    return found


class ProcessTable:
    """`processes()` for a sweep after every stage, reading again only the processes
    whose entries may have changed since the last read: the new ones, and this
    process's descendants.

    Reading `/proc/<pid>/stat` for every process on a busy machine costs milliseconds
    (a few hundred processes), at every stage. Most of them are nothing of the run's,
    and cannot become so: a process's parent changes only when the parent dies, and
    then its new parent is one of its own ancestors (a subreaper) or init, so a process
    that does not descend from this one never will. Such a process is not read again
    while its `/proc` entry is the same one: a pid used again by a later process is a
    new entry, with a new inode number. An entry kept is only used to tell that it is
    no descendant; `kill_processes` reads each target again before killing it.
    """

    def __init__(self) -> None:
        # Processes that do not descend from this one: pid -> (inode, what was read).
        self._unrelated: dict[int, tuple[int, ProcessInfo]] = {}
        import threading  # here: the watcher, which loads this file, needs none

        self._lock = threading.Lock()

    def read(self) -> list[ProcessInfo]:
        with self._lock:
            return self._read()

    def _read(self) -> list[ProcessInfo]:
        table: list[ProcessInfo] = []
        inodes: dict[int, int] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(_PROC):
                if not entry.name.isdigit():
                    continue
                pid = int(entry.name)
                inode = entry.inode()
                known = self._unrelated.get(pid)
                process = known[1] if known is not None and known[0] == inode else read_stat(pid)
                if process is not None:
                    table.append(process)
                    inodes[pid] = inode
        me = os.getpid()
        related = {me, *(p.pid for p in descendants([me], table, zombies=True))}
        self._unrelated = {p.pid: (inodes[p.pid], p) for p in table if p.pid not in related}
        return table


def read_stat(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcessInfo(
            pid=pid,
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            session=int(fields[3]),
            start=int(fields[19]),
            zombie=fields[0] == "Z",
        )
    except (IndexError, ValueError):
        return None


_boot: list[str | None] = []


def boot_ticks() -> int:
    """The boot clock now, in the clock ticks since boot `/proc/<pid>/stat` counts a
    process's start time in (rounded down as the kernel rounds it)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // (1_000_000_000 // _TICKS_PER_SECOND)


_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def boot_id() -> str | None:
    """This boot's id; it stays the same for as long as this process lives."""
    if not _boot:
        try:
            _boot.append((_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip())
        except OSError:
            _boot.append(None)
    return _boot[0]


# The watcher: `sh -c WAIT PYTHON WATCHER REAPER_PY RECORDS_DIR OWNER_PID`. At end of
# file on its stdin the shell replaces itself with `PYTHON -I -S -c WATCHER REAPER_PY
# RECORDS_DIR OWNER_PID`, which loads this file; at a `done` line (the run killed what
# it recorded: nothing is left for it) it just exits. Neither the terminal's Ctrl-C nor
# a hang-up is meant for it: it goes when its parent does (an ignored signal stays
# ignored across the `exec`).
WAIT = """\
trap '' INT HUP TERM PIPE
while read -r line; do [ "$line" = done ] && exit 0; done
exec "$0" -I -S -c "$@"
"""
WATCHER = """\
import signal, sys
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
import importlib.util

spec = importlib.util.spec_from_file_location("fabro_reaper", sys.argv[1])
reaper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reaper)
reaper.kill_recorded(reaper.Path(sys.argv[2]), owner=int(sys.argv[3]))
"""
