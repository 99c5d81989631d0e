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
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
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


# What `printable_line` would escape, as UTF-8 bytes: C0 controls but tab and LF, a CR
# that does not end its line, DEL, C1 controls, the bidi controls. (Bytes that are not
# UTF-8 are found by decoding.)
_ESCAPED = re.compile(
    rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|\xc2[\x80-\x9f]|\xd8\x9c"
    rb"|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]"
)


def _line_blocks(stream: IO[bytes], block: int = 1 << 20) -> Iterator[bytes]:
    """What `stream` gives, a block of whole lines at a time (the last may lack its
    newline). None of the characters `_ESCAPED` finds spans a line."""
    rest = b""
    while data := stream.read(block):
        cut = data.rfind(b"\n") + 1
        if cut:
            yield rest + data[:cut]
            rest = data[cut:]
        else:
            rest += data
    if rest:
        yield rest


def shown_as_is(stream: IO[bytes], block: int = 1 << 20) -> bool:
    """Whether `printable_line` would leave every line `stream` gives as it is: nothing
    in it a terminal acts on (read up to the first block that holds something)."""
    return all(_plain(lines) for lines in _line_blocks(stream, block))


def copy_shown(stream: IO[bytes], out: IO[bytes], block: int = 1 << 20) -> bool:
    """Copy `stream` to `out`, each line as `printable_line` gives it (a block of lines
    that needs nothing escaped, nearly all of them, is copied as it is): whether
    anything was escaped."""
    import io

    escaped = False
    for lines in _line_blocks(stream, block):
        if _plain(lines):
            out.write(lines)
            continue
        escaped = True
        for line in io.BytesIO(lines):
            out.write(printable_line(line).encode())
    out.flush()
    return escaped


def _plain(lines: bytes) -> bool:
    try:
        lines.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _ESCAPED.search(lines) is None


def show_output(stream: IO[bytes], pager: str | None, cwd: Path) -> bool:
    """Every line of `stream`, made printable, on standard output or in `pager`:
    whether anything was escaped."""
    if pager is None:
        sys.stdout.flush()
        return copy_shown(stream, sys.stdout.buffer)
    return _page(stream, pager, cwd)


def _page(stream: IO[bytes], pager: str, cwd: Path) -> bool:
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
    )
    assert shown.stdin is not None
    escaped = False
    # Only once the pager and git have started, so that each takes Ctrl-C its own way.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with contextlib.suppress(BrokenPipeError):
            escaped = copy_shown(stream, shown.stdin)
        with contextlib.suppress(BrokenPipeError):
            shown.stdin.close()
        shown.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return escaped


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
