"""Running the git CLI for the few jobs the store leaves to git itself.

The store reads and writes objects and refs with dulwich, but some jobs belong to git:
repository discovery (GIT_CEILING_DIRECTORIES, safe.directory, gitdir files), worktree
administration, scanning a working tree through its index (clean filters, .gitignore,
the stat cache) and talking to remotes (credentials, ssh config).

Every call runs with the repository-locating environment variables removed. Inside a
git hook, `GIT_DIR` and `GIT_INDEX_FILE` point at the *user's* repository and index; a
`git add` in a run worktree that inherited them would stage into the user's index.
The directory a command runs in is always explicit instead.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.errors import DiskFull, FabroError, StoreError, ToolMissing, disk_full_message

if TYPE_CHECKING:
    from fabro_git.store.backoff import Clock

# Variables that point git at another repository, other objects or another ref
# namespace than those of the directory it runs in, or hold it in a push's quarantine
# (a `pre-receive` hook's, where git refuses every ref update). Neither git fabro's own
# git nor a stage's program gets them (`fabro_git.engine.stage_env`).
GIT_LOCATION_VARIABLES = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_COMMON_DIR",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_PREFIX",
        "GIT_NAMESPACE",
        "GIT_QUARANTINE_PATH",
    }
)


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GIT_LOCATION_VARIABLES}
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str],
    *,
    cwd: Path,
    input: bytes | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    retry_transient: bool = False,
    clock: Clock | None = None,
    on_fifo: Callable[[], FabroError] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `git ARGS` in `cwd`, capturing output. StoreError (with git's stderr) on failure.

    With `retry_transient`, a failure git blames on another git process (a held lock, a
    directory removed by `git prune`) is retried with a bounded backoff first; use it
    only for commands that are safe to run twice. The backoff waits on `clock` (by
    default the real one).

    With `on_fifo`, for a command that walks a worktree (git opens every `.gitignore`
    and `.gitattributes` it meets, and a FIFO by that name has it wait for a writer for
    ever): git found waiting to open a FIFO is killed, and the error `on_fifo` makes is
    raised (`waiting_on_fifo`).
    """
    if not retry_transient:
        proc = _run_once(args, cwd, input, env, on_fifo)
    else:
        from fabro_git.store.backoff import SYSTEM_CLOCK, is_transient_git_failure, retrying

        def attempt() -> subprocess.CompletedProcess[bytes]:
            proc = _run_once(args, cwd, input, env, on_fifo)
            if proc.returncode != 0 and is_transient_git_failure(
                proc.stderr.decode("utf-8", "replace")
            ):
                raise _TransientFailure(proc)
            return proc

        try:
            proc = retrying(
                attempt,
                transient=lambda err: isinstance(err, _TransientFailure),
                clock=clock or SYSTEM_CLOCK,
            )
        except _TransientFailure as err:
            proc = err.proc
    if check and proc.returncode != 0:
        raise git_failure(args, cwd, proc)
    return proc


def start_git(
    args: Sequence[str], *, cwd: Path
) -> Callable[[], subprocess.CompletedProcess[bytes]]:
    """Start `git ARGS` in `cwd` now and return what waits for it (with `run_git`'s
    errors, `check=False`): for an answer needed only later, so that git works while
    this process does something else. The waiter must be called, once."""
    popen = popen_git(args, cwd=cwd, stdin=None)

    def wait() -> subprocess.CompletedProcess[bytes]:
        stdout, stderr = popen.communicate()
        return subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)

    return wait


def popen_git(
    args: Sequence[str],
    *,
    cwd: Path,
    stdin: int | None = subprocess.DEVNULL,
    stderr: int = subprocess.PIPE,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`git ARGS` started in `cwd` with its output piped (`git_env(env)`, as every git
    here); a `FabroError` saying what is missing when it cannot start."""
    try:
        return subprocess.Popen(
            ["git", *args],
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=git_env(env),
        )
    except FileNotFoundError as err:
        raise _not_started(cwd) from err


def _not_started(cwd: Path) -> FabroError:
    """Why git could not be started in `cwd`: the directory, or git itself, is missing."""
    if not Path(cwd).is_dir():
        return StoreError(f"{cwd} does not exist or is not a directory")
    return ToolMissing("git is not installed or not on PATH", hint="install git 2.31 or newer")


class _TransientFailure(Exception):
    def __init__(self, proc: subprocess.CompletedProcess[bytes]) -> None:
        super().__init__("transient git failure")
        self.proc = proc


def _run_once(
    args: Sequence[str],
    cwd: Path,
    input: bytes | None,
    env: Mapping[str, str] | None,
    on_fifo: Callable[[], FabroError] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    if on_fifo is None or not SEES_FIFO_WAITS:
        try:
            return subprocess.run(
                ["git", *args],
                cwd=cwd,
                input=input,
                capture_output=True,
                env=git_env(env),
                check=False,
            )
        except FileNotFoundError as err:
            raise _not_started(cwd) from err
    stdin = subprocess.DEVNULL if input is None else subprocess.PIPE
    popen = popen_git(args, cwd=cwd, stdin=stdin, env=env)
    stdout, stderr = communicate_watching(popen, input, on_fifo)
    return subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)


# Whether this system tells what a process sleeps in (Linux: a FIFO's open waits in
# `wait_for_partner`); elsewhere `on_fifo` is not called, and a caller looks first.
SEES_FIFO_WAITS = os.path.exists(f"/proc/{os.getpid()}/wchan")
# How often a git that has not finished is looked at: most are done before the first.
_FIFO_LOOK = 0.1


def waiting_on_fifo(pid: int) -> bool:
    """Whether a thread of process `pid` waits to open a FIFO until a writer comes
    (Linux)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/wchan", "rb") as fh:
                if fh.read().strip() == b"wait_for_partner":
                    return True
        except OSError:
            continue
    return False


def communicate_watching(
    popen: subprocess.Popen[bytes], input: bytes | None, on_fifo: Callable[[], FabroError]
) -> tuple[bytes, bytes]:
    """`popen.communicate(input)`, looking every `_FIFO_LOOK` seconds whether the
    process waits to open a FIFO: then it is killed, and `on_fifo()` raised."""
    pending = input
    with popen:  # its pipes closed, and it waited for, however this ends
        while True:
            try:
                return popen.communicate(pending, timeout=_FIFO_LOOK)
            except subprocess.TimeoutExpired:
                pending = None  # what was sent stays sent
                if waiting_on_fifo(popen.pid):
                    popen.kill()
                    popen.communicate()
                    raise on_fifo() from None
            except BaseException:  # Ctrl-C, as `subprocess.run` does
                popen.kill()
                raise


def git_failure(
    args: Sequence[str], cwd: Path, proc: subprocess.CompletedProcess[bytes]
) -> FabroError:
    """The error for a failed git command: `DiskFull` when git ran out of space."""
    message = describe_failure(args, cwd, proc)
    if disk_full_message(proc.stderr.decode("utf-8", "replace")):
        return DiskFull(message)
    return StoreError(message)


def describe_failure(
    args: Sequence[str], cwd: Path, proc: subprocess.CompletedProcess[bytes]
) -> str:
    verb = next((a for a in args if not a.startswith("-") and "=" not in a), "")
    detail = (
        proc.stderr.decode("utf-8", "replace").strip()
        or proc.stdout.decode("utf-8", "replace").strip()
    )
    message = f"git {verb} failed in {cwd} (exit {proc.returncode})"
    return f"{message}: {detail}" if detail else message


def out(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stdout.decode("utf-8", "surrogateescape")


def out_lines(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    r"""`out(proc)` cut into git's lines, at "\n" alone. `str.splitlines` also cuts at
    characters a ref name, a path or a commit message may hold (U+2028, U+0085,
    \x1c-\x1e): a ref named `refs/fabro/parallel/ID/x\u2028refs/heads/main`, which a
    stage may make, would list `refs/heads/main` too."""
    return lines_of(out(proc))


def lines_of(text: str) -> list[str]:
    r"""`text`, as git prints it, cut at "\n" alone (see `out_lines`)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def config_entries(proc: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    """The entries `git config --null --list` (or `--get-regexp`) printed, by name as
    git prints it (section and key lower-cased, a subsection as written): each entry is
    "name\nvalue\0", "name\0" for a key with no value; the last one of a name wins, as
    it does for git."""
    values: dict[str, str] = {}
    for entry in out(proc).split("\0"):
        if entry:
            name, _, value = entry.partition("\n")
            values[name] = value
    return values
