"""JSONL event sinks: every event of a run, as it is emitted, to a file or a program.

`[[run.events.sinks]]` in the run's configuration (recorded in its manifest, so a
resume feeds the same sinks) names where each envelope goes as one JSON line, exactly
the line `git fabro logs` prints for it (redacted on the bus, as every event):

- `type = "file"`: appended to `path` with one unbuffered `O_APPEND` write per event,
  so the file is flushed per event and a reader never sees half a line;
- `type = "command"`: written to the stdin of a program started for the run (`command`,
  an argv list, or `script`, a shell line), in the repository's root, with a stage's
  environment (`fabro_git.engine.stage_env`: no secret-named variable but what
  `[run.sandbox.env]` passes) and the run's process mark, so the run's watcher kills it
  should `git fabro` die. It lives as long as the run: at the run's end its stdin is
  closed, it has CLOSE_GRACE seconds to read to the end, and then its process group is
  killed.

A sink is an observer: one that cannot be opened, started or written to is reported
once as a `run.notice` warning (`event_sink_failed`) and left out for the rest of the
run, which goes on. A program's pipe is fed by a thread of its own, so a program that
reads slowly never holds up the run's trio loop. Sinks act only from a trusted
configuration (`fabro_git.config.trust`), as hooks do.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from fabro_git.config.locations import open_private
from fabro_git.events.bus import EventBus, Sink
from fabro_git.events.catalogue import RunNotice
from fabro_git.events.envelope import Envelope, EventProps
from fabro_git.terminal import json_printable

if TYPE_CHECKING:
    from fabro_git.config.run_config import RunSection

NOTICE_CODE = "event_sink_failed"
# How long a sink's program has to read its last lines once its stdin is closed.
CLOSE_GRACE = 2.0

Notice = Callable[[str], object]


def _line(line: bytes) -> bytes:
    """The line as `git fabro logs` prints it."""
    return (json_printable(line.decode("utf-8", "replace")) + "\n").encode()


class _Reporting:
    """A sink that reports its first failure as a notice, then takes nothing more."""

    def __init__(self, number: int, describe: str, notice: Notice) -> None:
        self.number = number
        self.describe = describe
        self._notice = notice
        self.failed = False

    def fail(self, problem: str) -> None:
        if self.failed:
            return
        self.failed = True
        self._notice(
            f"event sink {self.number} ({self.describe}) failed: {problem}; "
            "the run goes on without it"
        )


class FileSink(_Reporting):
    """Appends each event to a file, one write per event."""

    def __init__(self, number: int, path: Path, notice: Notice) -> None:
        super().__init__(number, f"file {path}", notice)
        self.path = path
        self._fd: int | None = None

    def handle(self, env: Envelope, line: bytes) -> None:
        if self.failed:
            return
        try:
            if self._fd is None:
                # Created private; a file the user made keeps its mode.
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._fd, _line(line))
        except OSError as exc:
            self.close()
            self.fail(exc.strerror or str(exc))

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class CommandSink(_Reporting):
    """Feeds each event to a program's stdin, from a thread of its own."""

    def __init__(
        self,
        number: int,
        argv: list[str],
        *,
        cwd: Path,
        env: Callable[[], dict[str, str]],
        stderr: Path,
        notice: Notice,
    ) -> None:
        super().__init__(number, f"command {' '.join(argv)}", notice)
        self.argv = argv
        self.cwd = cwd
        self._env = env
        self._stderr = stderr
        self.process: subprocess.Popen[bytes] | None = None
        self._lines: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._broken: str | None = None  # what the writer met, told on the run's thread

    def handle(self, env: Envelope, line: bytes) -> None:
        if self.failed:
            return
        if self.process is None:
            if not self._start():
                return
        elif (code := self.process.poll()) is not None:
            self.fail(f"it exited with code {code} before the run ended")
            return
        if self._broken is not None:
            self.fail(self._broken)
            return
        self._lines.put(_line(line))

    def _start(self) -> bool:
        from fabro_git.errors import FabroError

        try:
            errors = open_private(self._stderr, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self.fail(f"cannot open {self._stderr}: {exc.strerror}")
            return False
        except FabroError as exc:  # a place refused for good (`open_private`)
            self.fail(exc.message)
            return False
        try:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self._env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,  # its own group: killed whole at the end
            )
        except (OSError, FabroError) as exc:
            self.fail(f"cannot start it: {getattr(exc, 'strerror', None) or exc}")
            return False
        finally:
            os.close(errors)
        from fabro_git.engine import process_groups

        process_groups.own_child(self.process.pid)  # its own session: not an orphan
        assert self.process.stdin is not None
        self._writer = threading.Thread(
            target=self._feed, args=(self.process.stdin,), name="event-sink", daemon=True
        )
        self._writer.start()
        return True

    def _feed(self, stdin: IO[bytes]) -> None:
        try:
            while (data := self._lines.get()) is not None:
                stdin.write(data)
                stdin.flush()
        except (OSError, ValueError) as exc:
            self._broken = f"writing to it: {exc}"
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def close(self) -> None:
        """Let the program read to the end, then end its process group."""
        process = self.process
        if process is None:
            return
        self._lines.put(None)
        if self._writer is not None:
            self._writer.join(CLOSE_GRACE)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(CLOSE_GRACE)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        from fabro_git.engine import process_groups

        process_groups.child_ended(process.pid)


# The sinks attached to each bus, so the run's end can close them before it kills
# what the run started.
_attached: weakref.WeakKeyDictionary[EventBus, list[Sink]] = weakref.WeakKeyDictionary()


def attach(
    bus: EventBus,
    run: RunSection,
    *,
    emit: Callable[[EventProps], object],
    host_dir: Path,
    scratch: Path,
    warn: Callable[[str], object] | None = None,
) -> None:
    """Add the sinks the run's configuration (its manifest's `run_config`) names to
    `bus`. Nothing is opened or started before the first event reaches a sink. `warn`
    also tells the terminal of a failure, while the run's renderer is not attached yet
    (the first events of a new run)."""
    sinks_config = run.events.sinks if run.events is not None else []
    if not sinks_config:
        return
    sandbox = run.sandbox_env

    def notice(message: str) -> None:
        emit(RunNotice(level="warn", code=NOTICE_CODE, message=message))
        if warn is not None:
            warn(bus.redactor.mask_text(message))

    def environment() -> dict[str, str]:
        from fabro_git.engine import process_groups
        from fabro_git.engine.stage_env import stage_environment

        mark = process_groups.process_mark(process_groups.records_dir(scratch), "sink")
        env = stage_environment(sandbox=sandbox, mark=mark)
        env["FABRO_RUN_ID"] = bus.run_id
        return env

    sinks: list[Sink] = []
    for number, entry in enumerate(sinks_config, start=1):
        if entry.type == "file" and entry.path is not None:
            sinks.append(FileSink(number, host_dir / entry.path, notice))
        elif entry.type == "command":
            argv = (
                [shutil.which("sh") or "/bin/sh", "-c", entry.script]
                if entry.script is not None
                else list(entry.command or [])
            )
            if argv:
                sinks.append(
                    CommandSink(
                        number,
                        argv,
                        cwd=host_dir,
                        env=environment,
                        stderr=scratch / f"sink-{number}.stderr",
                        notice=notice,
                    )
                )
    for sink in sinks:
        bus.add_sink(sink)
    _attached.setdefault(bus, []).extend(sinks)


def close(bus: EventBus) -> None:
    """Detach and close the sinks `attach` added to `bus` (the run has ended)."""
    for sink in _attached.pop(bus, []):
        bus.remove_sink(sink)
        sink.close()
