"""The process groups a run's stages start, so none of them outlives the run.

A stage command runs as the leader of its own process group (and session), recorded in
the run's scratch dir while it may be alive, and killed when the run ends, when a
resumed run starts, and by the run's watcher process the moment `git fabro` dies
(`fabro_git.engine.reaper` tells how, and how a recycled pid is never mistaken for a
recorded group), and how what leaves its group is still found: by ancestry, `git
fabro` being the subreaper its stages' orphans are re-parented to (`sweep_adopted`,
`record_adopted`), and by the mark each stage's processes carry in their environment
(`process_mark`). On Linux a command is started on the thread trio runs on and waited
for through a pidfd, without a thread of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import IO, Protocol

import trio

from fabro_git.engine import reaper
from fabro_git.engine.reaper import (
    MARK_VARIABLE,
    ProcessRecord,
    alive,
    boot_id,
    forget,
    kill_marked,
    read_stat,
)

__all__ = [
    "alive",
    "end_run",
    "forget",
    "kill_marked",
    "kill_recorded",
    "process_mark",
    "record",
    "record_adopted",
    "records_dir",
    "running_stages",
    "start",
    "stop_watcher",
    "sweep_adopted",
    "sweep_stage",
]


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
    source = subprocess.DEVNULL if stdin is None else stdin
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return await trio.lowlevel.open_process(
            argv,
            cwd=str(cwd),
            stdin=source,
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )
    earliest = reaper.boot_ticks()
    popen = subprocess.Popen(
        argv,
        cwd=str(cwd),
        stdin=source,
        stdout=stdout,
        stderr=stderr,
        env=env,
        start_new_session=True,
    )
    started = (earliest, reaper.boot_ticks())
    own_child(popen.pid, started)
    return _Child(popen, started=started)


# The children this process started in sessions of their own (stages, hooks, event
# sinks' programs) and has not waited for yet. Such a child looks like an adopted
# orphan (`reaper.adopted`), and between its fork and its exec it carries this
# process's environment, without its mark: a sweep at that moment (the walk's end
# while a last hook starts) would take it for something left behind.
# Each by pid, with the ticks its start time lies between: should one never be waited
# for, a later process given its pid is not spared for it.
_own_children: dict[int, tuple[int, int] | None] = {}


def own_child(pid: int, started: tuple[int, int] | None = None) -> None:
    """Count `pid`, a child this process just started, among its own until
    `child_ended`: no sweep kills it as adopted. `started` brackets its start time
    (`start`); else it is read now (a child not waited for keeps its pid)."""
    if started is None:
        process = read_stat(pid)
        started = None if process is None else (process.start, process.start)
    _own_children[pid] = started


def child_ended(pid: int) -> None:
    _own_children.pop(pid, None)


def _own(process: reaper.ProcessInfo) -> bool:
    """Whether `process` is one of this process's own children (`own_child`)."""
    if process.pid not in _own_children:
        return False
    started = _own_children[process.pid]
    return started is None or started[0] <= process.start <= started[1]


class _Child:
    """A child waited for through a pidfd, without a thread (Linux). `started` brackets
    its start time, in `/proc/<pid>/stat`'s ticks: `record` need not read it back."""

    def __init__(self, popen: subprocess.Popen[bytes], *, started: tuple[int, int]) -> None:
        self._popen = popen
        self.started = started
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
        child_ended(self._popen.pid)
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            self._finalizer()
            self._pidfd = None
        return self._popen.returncode


def started_between(process: StageProcess) -> tuple[int, int] | None:
    """The ticks `process`'s start time lies between, when `start` bracketed it."""
    return process.started if isinstance(process, _Child) else None


def records_dir(scratch: Path) -> Path:
    """Where a run's scratch dir keeps its process group records."""
    return scratch / "process-groups"


def record(
    directory: Path, pgid: int, *, kind: str = "stage", started: tuple[int, int] | None = None
) -> Path | None:
    """Note that group `pgid` (led by the process `pgid`) belongs to this run, and make
    sure the run's watcher is there to kill it should this process die. `kind` is
    `stage` (what stages run) or `hook` (lifecycle hooks, which may outlive the walk
    until the run's very end). `started`: the leader's start time as bracketed when
    this process started it (`start`), else it is read from `/proc`, which waits while
    a fresh process loads."""
    entry: ProcessRecord = {"pgid": pgid, "boot": boot_id(), "kind": kind}
    if started is not None:
        entry["start"], latest = started
        if latest != started[0]:
            entry["start_max"] = latest
    else:
        leader = read_stat(pgid)
        entry["start"] = leader.start if leader else None
    return _write_record(directory, str(pgid), entry)


# Record files this process released when their group ended (`release`), by directory:
# the next record goes into one, so a command stage neither makes nor removes a file for
# its group. A released record starts with `RELEASED`, which no JSON does: read, it is
# no record (as an empty file is). The run's end removes them.
_free_records: dict[Path, list[Path]] = {}
RELEASED = b"#"


def release(path: Path | None) -> None:
    """Drop the record at `path`, which this process wrote, once its group is gone: its
    first byte becomes `RELEASED`, and the file is kept for the next record. One byte
    written in place: emptying the file instead (a truncation, then a record written
    into an empty file) costs the file system a block freed and one allocated again, at
    every stage."""
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, RELEASED, 0)
        finally:
            os.close(fd)
    except OSError:
        forget(path)
        return
    _free_records.setdefault(path.parent, []).append(path)


def _write_record(directory: Path, name: str, entry: ProcessRecord) -> Path:
    entry["owner"] = os.getpid()
    if directory not in _made_dirs:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _made_dirs.add(directory)
    if directory not in _watchers:
        _watchers[directory] = _start_watcher(directory)
    try:
        # A file's name is only a name: what a record says is in it.
        path = _free_records[directory].pop()
    except (KeyError, IndexError):
        path = directory / f"{name}.json"
    # Written in place, in one write: a live group's id (a nonce) is unique on the
    # machine, so the name is ours alone, and what a crashed run left under it is
    # replaced. Records are read only once their writer is gone (the watcher, a resume,
    # the run's own end), and one cut short by a kill reads as no record, as a record
    # not yet renamed into place would; a renamed temporary file would cost a stage one
    # more file to make. The file is not truncated: what is written covers what was
    # there, padded with spaces (JSON's own whitespace) when shorter.
    data = json.dumps(entry).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    except FileNotFoundError:  # the directory went away (a cleanup): make it again
        _made_dirs.discard(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _made_dirs.add(directory)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        data = data.ljust(os.fstat(fd).st_size, b" ")
        written = os.pwrite(fd, data, 0)
        if written != len(data):
            raise OSError(f"short write of {path}")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path


def process_mark(directory: Path, kind: str = "stage") -> str:
    """A new mark for the processes of one stage (`kind` `stage`) or of the run's hooks
    (`hook`), to set as `MARK_VARIABLE` in their environment. The first records this
    process's nonce for the run in `directory`, so the run's end, a resume and the
    watcher find every process carrying it (`fabro_git.engine.reaper`)."""
    _become_subreaper()
    nonce = _nonces.get(directory)
    if nonce is None:
        import secrets

        nonce = _nonces[directory] = secrets.token_hex(8)
        _write_record(directory, f"mark-{nonce}", {"mark": nonce, "boot": boot_id()})
    return f"{nonce}.{kind}.{next(_marks)}"


# This process's nonce for each record directory, and the count its marks end with.
_nonces: dict[Path, str] = {}
_marks = itertools.count(1)

# Record directories known to exist, so a stage's record costs no mkdir.
_made_dirs: set[Path] = set()


# The watcher of each record directory this process has recorded in (None where none
# could be started: the records still serve the run's end and a resume).
_watchers: dict[Path, _Watcher | None] = {}
# How long the run's end waits for a watcher told `done` to exit.
_WATCHER_EXIT = 5.0


class _Watcher:
    """A `reaper` process waiting for this one to end (see `fabro_git.engine.reaper`)."""

    def __init__(self, write_end: int, process: subprocess.Popen[bytes]) -> None:
        self._write_end: int | None = write_end
        self.process = process

    def close(self) -> None:
        """Let the watcher go: this process has killed what it recorded itself, so the
        watcher exits without starting the interpreter that would find nothing left.
        It is waited for (a shell reading a line: a millisecond), so a process that
        runs on after the run keeps no child of it."""
        if self._write_end is not None:
            with contextlib.suppress(OSError):  # the watcher is gone already
                os.write(self._write_end, b"done\n")
            os.close(self._write_end)
            self._write_end = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_WATCHER_EXIT)


def _start_watcher(directory: Path) -> _Watcher | None:
    if not reaper.trusts_records():
        return None
    read_end, write_end = os.pipe()  # neither is inherited by what this process starts
    watched = [reaper.__file__, str(directory), str(os.getpid())]
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", reaper.WAIT, sys.executable, reaper.WATCHER, *watched],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # out of reach of the terminal's Ctrl-C
        )
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    return _Watcher(write_end, process)


def end_run(directory: Path, *, grace: float) -> None:
    """The run's end, for the processes it recorded in `directory`: what is left of
    them is killed (TERM, then KILL after `grace` seconds), then the watcher goes."""
    kill_recorded(directory, grace=grace)
    stop_watcher(directory)


def stop_watcher(directory: Path) -> None:
    """At the run's end, after its own `kill_recorded`: the watcher of `directory`
    exits, having nothing of this process's left to kill."""
    _nonces.pop(directory, None)
    for path in _free_records.pop(directory, []):
        forget(path)
    watcher = _watchers.pop(directory, None)
    if watcher is not None:
        watcher.close()


# -- this process as the subreaper of what its stages leave behind ----------------------


class _Subreaper:
    tried = False
    on = False
    own_mark: str | None = None  # the mark of this process's own children


# The marks of the stages running in this process (`Stage.process_mark` adds, its sweep
# takes away): an adopted process with no mark is only killed when no other runs.
running_stages: set[str] = set()

# The processes this process killed as adopted (pid: start time), reaped once they are
# zombies (never one it did not kill: that may be a child a stage still waits for); and
# the record of each adopted process recorded.
_adopted_seen: dict[int, int] = {}
_adopted_records: dict[int, Path] = {}


def _become_subreaper() -> None:
    if _Subreaper.tried:
        return
    _Subreaper.tried = True
    _Subreaper.on = reaper.become_subreaper()
    if _Subreaper.on:
        import secrets

        # What this process starts itself inherits this (a stage's environment drops it).
        _Subreaper.own_mark = f"own.{secrets.token_hex(8)}"
        os.environ[MARK_VARIABLE] = _Subreaper.own_mark


def _spared(process: reaper.ProcessInfo) -> bool:
    """Whether no sweep of adopted processes kills `process`: a watcher, or one of this
    process's own children (`own_child`)."""
    return _own(process) or any(
        w is not None and w.process.pid == process.pid for w in _watchers.values()
    )


def _ours(value: str | None) -> bool:
    """Whether `value` is a mark of this process's, a stage's or hook's of one of its runs."""
    return value is not None and value.split(".", 1)[0] in _nonces.values()


def _outlives_the_walk(mark: str) -> bool:
    """Whether a process of this mark lives until the run's very end rather than the
    walk's: a non-blocking hook still running, an event sink's program still reading."""
    return any(f".{kind}." in mark for kind in ("hook", "sink"))


def sweep_stage(mark: str, *, since: set[int] | None) -> None:
    """At the end of the stage of `mark`: kill what carries its mark (`kill_marked`,
    among the processes started since the pids `since`), then what was re-parented to
    this process (`sweep_adopted`). One read of `/proc` serves both when the first
    kills nothing: the table read for the second names the pids alive for the first.

    When this process is the subreaper and has no child but its watchers and what it
    started itself (`_nothing_adopted`), nothing the stage left running was re-parented
    to it: the table (a read of every process's `/proc` entry) is not needed. What
    carries the stage's mark is still looked for among the new pids: below this
    process's own children, and outside its tree (a job handed to a daemon with the
    stage's environment)."""
    if _Subreaper.on and _nothing_adopted():
        if kill_marked(mark, since=since):
            sweep_adopted(mark)
        return
    table = _table.read() if _Subreaper.on else None
    alive = None if table is None else {process.pid for process in table}
    killed = kill_marked(mark, since=since, alive=alive)
    # A kill re-parents what was under the killed process: the table is read again.
    sweep_adopted(mark, table=None if killed else table)


def _nothing_adopted() -> bool:
    """Whether every child of this process (`reaper.children`) is a watcher or one it
    started itself (`own_child`: a hook, an event sink's program): nothing was
    re-parented to it, so `sweep_adopted` would find nothing to kill."""
    found = reaper.children()
    if found is None:
        return False
    found -= {w.process.pid for w in _watchers.values() if w is not None}
    for pid in found:
        process = read_stat(pid) if pid in _own_children else None
        if process is None or not _own(process):
            return False
    return True


def sweep_adopted(
    mark: str | None, *, hooks_too: bool = True, table: list[reaper.ProcessInfo] | None = None
) -> list[int]:
    """Kill what was re-parented to this process (see `fabro_git.engine.reaper`), with
    everything under it: at the end of the stage of `mark`, what carries that mark, and
    what carries no mark of this run's when no other stage is running; with `mark` None
    (the run's end), all of it but this process's own helpers (and, unless `hooks_too`,
    what carries a hook's or an event sink's mark). Returns the pids killed. `table`:
    the processes as read a moment ago (`ProcessTable.read`), for the first look."""
    if not _Subreaper.on:
        return []
    others = running_stages - {mark}
    killed: list[int] = []
    for _ in range(50):
        if table is None or killed:
            table = _table.read()
        targets = [
            process
            for process in reaper.adopted(table)
            if not _spared(process)
            and _swept(reaper.mark_of(process.pid), mark, others=bool(others), hooks_too=hooks_too)
        ]
        if not targets:
            break
        targets += reaper.descendants([p.pid for p in targets], table)
        found = reaper.kill_processes(targets)
        _adopted_seen.update((p.pid, p.start) for p in targets if p.pid in found)
        if not found:
            break
        killed += found
    for pid in killed:
        forget(_adopted_records.pop(pid, None))
    _reap()
    return killed


# What the sweeps after each stage read of `/proc` (`reaper.ProcessTable`).
_table = reaper.ProcessTable()


def _swept(value: str | None, mark: str | None, *, others: bool, hooks_too: bool) -> bool:
    """Whether `sweep_adopted(mark)` kills an adopted process that carries the mark
    `value`; `others` tells whether another stage is running."""
    if value == _Subreaper.own_mark and value is not None:
        return False  # this process's own helper
    if mark is None:
        return hooks_too or not (_ours(value) and _outlives_the_walk(str(value)))
    if value == mark or (value or "").startswith(f"{mark}."):
        return True
    return not (_ours(value) or others)


def record_adopted(directory: Path) -> None:
    """Record what this process has adopted, so the watcher kills it should this process
    be killed (after which ancestry no longer leads to it)."""
    if not _Subreaper.on:
        return
    for process in reaper.adopted():
        if _spared(process) or process.pid in _adopted_records:
            continue
        if reaper.mark_of(process.pid) == _Subreaper.own_mark:
            continue
        entry: ProcessRecord = {"orphan": process.pid, "start": process.start, "boot": boot_id()}
        _adopted_records[process.pid] = _write_record(directory, f"orphan-{process.pid}", entry)


def _reap() -> None:
    """Wait for the processes killed as adopted that have died (re-parented to this
    process by then, if their parent was killed too)."""
    me = os.getpid()
    for pid, started in list(_adopted_seen.items()):
        process = read_stat(pid)
        if process is None or process.start != started:
            del _adopted_seen[pid]
        elif process.zombie and process.ppid == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            del _adopted_seen[pid]
            forget(_adopted_records.pop(pid, None))


def kill_recorded(
    directory: Path, *, grace: float = 0.0, owner: int | None = None, kind: str | None = None
) -> list[int]:
    """`reaper.kill_recorded`, and, at the run's end (no `owner`, `kind` None or
    `stage`), what this process adopted (`sweep_adopted`)."""
    killed = reaper.kill_recorded(directory, grace=grace, owner=owner, kind=kind)
    if owner is None and kind in (None, "stage"):
        killed += sweep_adopted(None, hooks_too=kind is None)
    if kind is None:
        _adopted_records.clear()
    return killed
