"""Running a program for a stage or a setup command: through trio, in its own process
group, with its output streamed to files.

A command that prints a gigabyte costs disk, not memory; callers read back a bounded
excerpt. Stopping it (a timeout, Ctrl-C) stops everything it started, not just the
shell, and the group is recorded while alive so a crash's resume can kill it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path

import trio

from fabro_git import redact
from fabro_git.config.locations import open_private
from fabro_git.engine import process_groups

META_LIMIT = 1_000_000  # bytes of each stream kept on the meta ref
KILL_GRACE = 2.0


def excerpt(path: Path, limit: int) -> bytes:
    """The whole file when small, else its head and tail around an omission marker;
    masked either way, so that what a stage makes of a command's output (its context
    values, its error, a later prompt) holds no secret to cut in two or send away.

    A large file is masked whole, as one stream (a chunk at a time, so memory stays
    bounded), before it is cut: a secret across a cut would leave a part of it that
    no pattern recognises. The cuts fall on line ends when a line end is near.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size <= limit:
            return redact.for_process().mask_bytes(fh.read())
        half = limit // 2
        masker = redact.for_process().stream_bytes()
        head = bytearray()
        tail = bytearray()
        total = 0
        while True:
            block = fh.read(_EXCERPT_CHUNK)
            masked = masker.feed(block) if block else masker.flush()
            total += len(masked)
            if len(head) < half:
                head += masked[: half - len(head)]
            tail += masked
            if len(tail) > limit:
                del tail[:-half]
            if not block:
                break
    if total <= limit:  # masking made it small: the tail holds all of it
        return bytes(tail)
    del tail[:-half]
    end = head.rfind(b"\n")
    if end >= half // 2:
        del head[end + 1 :]
    start = tail.find(b"\n")
    if 0 <= start < half // 2:
        del tail[: start + 1]
    marker = f"\n[... {total - len(head) - len(tail)} bytes omitted ...]\n".encode()
    return bytes(head + marker + tail)


_EXCERPT_CHUNK = 1 << 20


def argv_for(script: str, language: str) -> list[str]:
    if language == "python":
        # The user's Python, as a shell stage's `python3` is: git fabro's own interpreter
        # (a pipx or venv install) has none of the project's packages.
        return [shutil.which("python3") or sys.executable, "-c", script]
    shell = shutil.which("bash") or "/bin/sh"
    return [shell, "-c", script]


async def run_script(
    argv: list[str],
    *,
    cwd: Path,
    stdout: Path,
    stderr: Path,
    env: dict[str, str],
    timeout: float | None,
    groups: Path | None = None,
    group_kind: str = "stage",
    stdin: Path | None = None,
) -> tuple[int | None, bool]:
    """Run to completion; returns (exit code or None when killed, timed out?).

    A program that cannot be started (say, an environment over the system's limits)
    exits 126, as in a shell, with the reason in `stderr`. With `groups` (the run's
    record directory), the process group is recorded there while any of it is alive,
    so that the run's end, or a resume after a crash, can kill what the command left
    running (`group_kind`: see `process_groups.record`). With `stdin`, the command
    reads that file.
    """
    truncate = os.O_WRONLY | os.O_TRUNC
    with (
        open(open_private(stdout, truncate), "wb") as out,
        open(open_private(stderr, truncate), "wb") as err,
        open(os.devnull if stdin is None else stdin, "rb") as feed,
    ):
        try:
            process = await process_groups.start(
                argv, cwd=cwd, stdout=out, stderr=err, env=env, stdin=feed
            )
        except OSError as exc:
            err.write(f"cannot start {argv[0]}: {exc.strerror or exc}\n".encode())
            return 126, False
    recorded = (
        process_groups.record(
            groups, process.pid, kind=group_kind, started=process_groups.started_between(process)
        )
        if groups is not None
        else None
    )
    timed_out = False
    try:
        with trio.move_on_after(timeout if timeout else float("inf")) as scope:
            await process.wait()
        if scope.cancelled_caught:
            timed_out = True
            await _stop_group(process)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _stop_group(process)
        _forget_unless_alive(process.pid, recorded)
        raise
    _forget_unless_alive(process.pid, recorded)
    return (None if timed_out else process.returncode), timed_out


def _forget_unless_alive(pgid: int, recorded: Path | None) -> None:
    # What a command leaves running in the background keeps its record until the run
    # ends, when it is killed.
    if recorded is not None and not process_groups.alive(pgid):
        process_groups.release(recorded)


async def _stop_group(process: process_groups.StageProcess) -> None:
    for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with trio.move_on_after(grace):
            await process.wait()
            return


# Less free space than this (for an unprivileged writer) after a command failed means the
# disk filled up under it.
NEARLY_FULL = 64 * 1024


def out_of_space(*paths: Path) -> Path | None:
    """The first of `paths` on a filesystem with (next to) no room left, if any."""
    for path in paths:
        try:
            info = os.statvfs(path)
        except OSError:
            continue
        if info.f_bavail * info.f_frsize < NEARLY_FULL:
            return path
    return None
