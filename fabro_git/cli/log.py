"""`git fabro log [RUN] [git log options]`: `git log` over a run's metadata history.

A run's checkpoints are commits on `refs/fabro/meta/<id>`, which `git log fabro/meta/*`
does not reach: git globs no revisions. This names the ref (or, with no run, every
run's through `--glob`) and hands the rest of the command line to `git log` as argv,
never through a shell, so the user's `log.*` settings and formats apply.

What git prints is not git's own words, though: the commit messages, their trailers and
the ref names of a fetched run are whoever made it. So git's output comes here, through
the sanitiser (`fabro_git.terminal`), and goes on to the pager git would have started
(`pager.log`, `GIT_PAGER`, `core.pager`, `PAGER`) when standard output is a terminal.
git colours nothing: its colour escapes and a message's are the same bytes, and only
a message's may reach the terminal, shown.
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


def run(args: list[str]) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.store import runs as runrefs
    from fabro_git.store._gitcli import git_env
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    if args and not args[0].startswith("-"):
        revisions, rest = [runrefs.meta_ref(resolve_run(repo, args[0]))], args[1:]
    else:
        if not runrefs.list_run_ids(repo):
            print("no runs here", file=sys.stderr)
            return 0
        revisions, rest = [f"--glob={runrefs.META_PREFIX}*"], args
    pager = _pager(repo.root)
    sys.stdout.flush()
    argv = ["git", "log", "--no-color", *revisions, *rest]
    with subprocess.Popen(argv, cwd=repo.root, env=git_env(), stdout=subprocess.PIPE) as log:
        assert log.stdout is not None
        if pager is None:
            _copy(log.stdout, sys.stdout)
        else:
            _page(log.stdout, pager, repo.root)
    if log.returncode == -signal.SIGPIPE:
        return 0  # the reader went away (the pager quit early): not a failure
    # Killed by a signal (Ctrl-C): the status a shell gives it.
    return log.returncode if log.returncode >= 0 else 128 - log.returncode


def _copy(lines: Iterable[bytes], out: IO[str]) -> None:
    from fabro_git.terminal import printable

    for line in lines:
        out.write(printable(line.decode("utf-8", "replace")))
    out.flush()


def _page(lines: Iterable[bytes], pager: str, cwd: Path) -> None:
    """Show the lines in `pager`, started as git starts it (through the shell, with
    `LESS=FRX` and `LV=-c` unless they are set), and wait for it to end. Ctrl-C stops
    git, not this wait, as in git; quitting the pager early is no failure."""
    env = {"LESS": "FRX", "LV": "-c", **os.environ}
    shown = subprocess.Popen(
        pager, shell=True, cwd=cwd, env=env, stdin=subprocess.PIPE, text=True, encoding="utf-8"
    )
    assert shown.stdin is not None
    # Only once the pager and git have started, so that each takes Ctrl-C its own way.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with contextlib.suppress(BrokenPipeError):
            _copy(lines, shown.stdin)
        with contextlib.suppress(BrokenPipeError):
            shown.stdin.close()
        shown.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def _pager(cwd: Path) -> str | None:
    """The pager git would start for `git log` here; None when standard output is not a
    terminal or paging is off (`pager.log=false`, a pager of `cat` or nothing)."""
    from fabro_git.store._gitcli import run_git

    if not sys.stdout.isatty():
        return None
    overrides: list[str] = []
    setting = run_git(["config", "--get", "pager.log"], cwd=cwd, check=False)
    if setting.returncode == 0:
        as_bool = run_git(["config", "--type=bool", "--get", "pager.log"], cwd=cwd, check=False)
        if as_bool.returncode != 0:  # not a boolean: the pager itself
            overrides = ["-c", "core.pager=" + setting.stdout.decode().removesuffix("\n")]
        elif as_bool.stdout.strip() == b"false":
            return None
    chosen = run_git([*overrides, "var", "GIT_PAGER"], cwd=cwd).stdout.decode().strip()
    return None if chosen in ("", "cat") else chosen
