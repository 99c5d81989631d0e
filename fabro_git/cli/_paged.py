"""git's output shown safely: through the sanitiser, to the pager git would start.

`git fabro log` and `git fabro diff` hand their work to git, whose output holds what a
run's author wrote (commit messages, the files an agent made). git writes those bytes
to the terminal as they are; these helpers put them through `fabro_git.terminal`
first, and start the user's pager the way git does, since git's own pager would see
them raw.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO


def printable_line(line: bytes) -> str:
    """One line of git's output as it may be shown: every control character escaped,
    except a line's CRLF ending, which moves no text (a file with Windows line endings
    reads as it is). Bytes that are not UTF-8 are escaped too (`\\udce9`)."""
    from fabro_git.terminal import printable

    text = line.decode("utf-8", "surrogateescape")
    if text.endswith("\r\n"):
        return printable(text[:-2]) + "\r\n"
    return printable(text)


def shown_as_is(line: bytes) -> bool:
    """Whether `printable_line` leaves `line` as it is: nothing in it a terminal acts on."""
    return printable_line(line) == line.decode("utf-8", "surrogateescape")


def copy_printable(lines: Iterable[bytes], out: IO[str]) -> None:
    for line in lines:
        out.write(printable_line(line))
    out.flush()


def show_output(lines: Iterable[bytes], pager: str | None, cwd: Path) -> None:
    """Every line, made printable, on standard output or in `pager`."""
    if pager is None:
        copy_printable(lines, sys.stdout)
    else:
        _page(lines, pager, cwd)


def _page(lines: Iterable[bytes], pager: str, cwd: Path) -> None:
    """Show the lines in `pager`, started as git starts it (through the shell, with
    `LESS=FRX` and `LV=-c` unless they are set), and wait for it to end. Ctrl-C stops
    git, not this wait, as in git; quitting the pager early is no failure."""
    env = {"LESS": "FRX", "LV": "-c", **os.environ}
    shown = subprocess.Popen(
        pager,
        shell=True,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
    )
    assert shown.stdin is not None
    # Only once the pager and git have started, so that each takes Ctrl-C its own way.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with contextlib.suppress(BrokenPipeError):
            copy_printable(lines, shown.stdin)
        with contextlib.suppress(BrokenPipeError):
            shown.stdin.close()
        shown.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def git_pager(cwd: Path, command: str) -> str | None:
    """The pager git would start for `git COMMAND` here; None when standard output is
    not a terminal or paging is off (`pager.COMMAND=false`, a pager of `cat` or
    nothing)."""
    from fabro_git.store._gitcli import run_git

    if not sys.stdout.isatty():
        return None
    key = f"pager.{command}"
    overrides: list[str] = []
    setting = run_git(["config", "--get", key], cwd=cwd, check=False)
    if setting.returncode == 0:
        as_bool = run_git(["config", "--type=bool", "--get", key], cwd=cwd, check=False)
        if as_bool.returncode != 0:  # not a boolean: the pager itself
            overrides = ["-c", "core.pager=" + setting.stdout.decode().removesuffix("\n")]
        elif as_bool.stdout.strip() == b"false":
            return None
    chosen = run_git([*overrides, "var", "GIT_PAGER"], cwd=cwd).stdout.decode().strip()
    return None if chosen in ("", "cat") else chosen


def exit_status(returncode: int) -> int:
    """git's exit status as this command's: a reader that went away (the pager quit
    early) is no failure; a signal (Ctrl-C) gives the status a shell gives it."""
    if returncode == -signal.SIGPIPE:
        return 0
    return returncode if returncode >= 0 else 128 - returncode
