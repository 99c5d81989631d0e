"""Running the model's shell commands: one process group each, never outliving the call.

`bash -c` starts in a session of its own, so the command, its children and anything
they leave running in the background form one process group. When the command ends,
times out or the stage is cancelled, the group gets SIGTERM, two seconds to go, then
SIGKILL: a watcher loop or a server the model started does not survive its tool call.
The kill runs shielded, so a cancelled stage still cleans up before it unwinds.

Output (stdout and stderr merged, as a terminal shows them) is streamed to a callback
as it arrives (the event bus masks that stream and bounds it) and kept up to a bound
(head and tail), so `yes` cannot fill the memory. What is kept is masked as one stream
before it is cut: a secret across a cut would otherwise leave a half no pattern knows.
A non-zero exit is a result the model reads, not an error of the tool.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec
import trio

from fabro_git import redact

TERM_GRACE = 2.0
# After the command exits, how long a background job may keep its output pipe open
# before the group is stopped; the job is killed either way.
DRAIN_GRACE = 1.0
KEEP_CHARS = 500_000


class ShellResult(msgspec.Struct, frozen=True, kw_only=True):
    output: str
    exit_code: int | None
    timed_out: bool
    duration_ms: int


class _Capture:
    """The first and last `KEEP_CHARS` characters of the masked output, and how many
    fell between."""

    def __init__(self) -> None:
        self.head: list[str] = []
        self.head_size = 0
        self.tail = ""
        self.dropped = 0
        self.masker = redact.for_process().stream()

    def add(self, text: str) -> None:
        self._keep(self.masker.feed(text))

    def _keep(self, text: str) -> None:
        room = KEEP_CHARS - self.head_size
        if room > 0:
            self.head.append(text[:room])
            self.head_size += len(text[:room])
            text = text[room:]
        if text:
            self.tail += text
            if len(self.tail) > KEEP_CHARS:
                self.dropped += len(self.tail) - KEEP_CHARS
                self.tail = self.tail[-KEEP_CHARS:]

    def text(self) -> str:
        self._keep(self.masker.flush())
        middle = f"\n[... {self.dropped} characters not kept ...]\n" if self.dropped else ""
        return "".join(self.head) + middle + self.tail


async def run_shell(
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    on_output: Callable[[str], object],
    on_process_group: Callable[[int, bool], object] | None = None,
) -> ShellResult:
    """Run `command`; `on_process_group(pgid, running)` hears when its group starts and
    when it is gone, so a stage can record groups to kill after a crash."""
    started = time.monotonic()
    process = await trio.lowlevel.open_process(
        ["bash", "-c", command],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    capture = _Capture()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert process.stdout is not None
    stdout = process.stdout
    reader_done = trio.Event()

    def take(text: str) -> None:
        if not text:
            return
        capture.add(text)
        on_output(text)

    async def read_output() -> None:
        try:
            while chunk := await stdout.receive_some(65536):
                take(decoder.decode(chunk))
            take(decoder.decode(b"", final=True))
        finally:
            reader_done.set()

    if on_process_group is not None:
        on_process_group(process.pid, True)
    timed_out = False
    try:
        with trio.move_on_after(timeout) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_output)
                await process.wait()
                with trio.move_on_after(DRAIN_GRACE):
                    await reader_done.wait()
                # Background jobs still holding the pipe end with the command.
                await _stop_group(process)
        timed_out = deadline.cancelled_caught
    finally:
        with trio.CancelScope(shield=True):
            await _stop_group(process)
            await process.wait()
            await stdout.aclose()
            if on_process_group is not None:
                on_process_group(process.pid, False)
    output = capture.text()
    if timed_out:
        output += (
            f"\n[error: the command timed out after {int(timeout * 1000)} ms and was killed "
            "with its process group; the output so far is above. Set timeout_ms to allow "
            "it longer.]"
        )
    return ShellResult(
        output=output,
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


async def _stop_group(process: trio.Process) -> None:
    """SIGTERM the group, give it `TERM_GRACE` seconds, then SIGKILL what is left."""
    pgid = process.pid
    if not _signal_group(pgid, signal.SIGTERM):
        return
    with trio.move_on_after(TERM_GRACE):
        # poll() reaps the leader, whose zombie would otherwise keep the group alive.
        while process.poll() is None or _group_alive(pgid):
            await trio.sleep(0.05)
        return
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """True while a process of the group runs. Zombies do not count: a job orphaned by
    the command is reaped by init, which in a container may never happen."""
    proc = Path("/proc")
    if not proc.is_dir():
        return _signal_group(pgid, 0)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
