"""Waiting out the user's own git: bounded, jittered retries of transient failures.

A run writes beside whatever git the user runs in the same repository. `git gc`,
`git pack-refs` and `git reflog expire` hold ref locks and `packed-refs.lock` for a few
milliseconds at a time, and `git prune` removes object fan-out directories it has
emptied, so a `git add` in a run worktree may find the directory for its temporary file
gone. Such a failure means "not now", not "no": the operation is tried again after a
short, jittered pause, for a bounded time, and only then is git's own error reported.

The caller says which failures are transient. A lost compare-and-swap never is: a ref
that moved to another value is refused at first sight, never retried into an
overwrite. This module is the one place that decides how long to wait.

The waiting is done on a `Clock` the caller may pass: the real one by default, and in
the tests a fake one whose `sleep` moves time at once, so that a lock held past the
deadline is reported without four real seconds of waiting.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")

# Long enough to outlast a `git gc` on a large repository holding packed-refs.lock,
# short enough that a lock left behind by a crash is reported within seconds. A ref
# move waits instead as long as git's `core.filesRefLockTimeout` says, when it is set
# (`GitRepo.ref_lock_deadline`).
DEADLINE_SECONDS = 4.0
_FIRST_DELAY = 0.005
_MAX_DELAY = 0.25

# What git prints when another git process holds a lock (index.lock, a ref's lock,
# packed-refs.lock: "cannot lock ref ...: Unable to create '....lock': File exists"),
# just removed an object directory, or (`git worktree prune`, run by `git gc`) removed
# the admin directory of a worktree that `git worktree add` was still setting up.
# Not "cannot lock ref ...: is at X but expected Y": that is a lost compare-and-swap.
_TRANSIENT_GIT = re.compile(
    r"unable to create temporary file"
    r"|Unable to create '[^']*\.lock': File exists"
    r"|unable to write (?:loose )?object"
    r"|could not (?:open|create) '[^']*worktrees/[^']*' for writing"
)


class Clock(Protocol):
    """What a backoff reads the time from and waits on."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: `time.monotonic` and a blocking `time.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()


def is_transient_git_failure(stderr: str) -> bool:
    """Whether git's message says another git process was in the way, not a real error."""
    return _TRANSIENT_GIT.search(stderr) is not None


def retrying(
    operation: Callable[[], T],
    *,
    transient: Callable[[Exception], bool],
    deadline: float = DEADLINE_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
) -> T:
    """`operation()`, tried again while it raises an exception `transient` accepts,
    until `deadline` seconds have passed on `clock`; then the last exception propagates."""
    end = clock.monotonic() + deadline
    delay = _FIRST_DELAY
    while True:
        try:
            return operation()
        except Exception as err:
            pause = delay * random.uniform(0.5, 1.5)
            if not transient(err) or clock.monotonic() + pause > end:
                raise
        clock.sleep(pause)
        delay = min(delay * 2, _MAX_DELAY)
