"""trio's MockClock for code that also waits on real things: worker threads, sockets,
processes.

A MockClock jumps to the next deadline once the loop has been idle for its
`autojump_threshold` of real time. At a threshold of 0 an idle loop never blocks: it
polls for I/O without waiting, over and over, while a socket, a process or a worker
thread does the real work, and that thread then fights the spinning loop for the GIL.
A first import of a provider's SDK in a worker thread took a minute of CPU that way,
against a second and a half on a real clock. So a loop that waits on real work jumps
only after it has been idle for a while (`IDLE`), and never while a worker thread runs,
however long a loaded machine makes it. A loop that waits on nothing real (virtual time
alone) can keep a threshold of 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import trio
import trio.testing

# Real seconds the loop must have been idle, with no worker thread running, before the
# clock jumps to the next deadline.
IDLE = 0.02


@contextlib.contextmanager
def virtual_clock(idle: float = IDLE) -> Iterator[trio.testing.MockClock]:
    """A MockClock for `trio.run` that jumps after `idle` real seconds of an idle loop,
    and not while a worker thread runs."""
    clock = trio.testing.MockClock(autojump_threshold=idle)
    with still_while_threads_run(clock):
        yield clock


@contextlib.contextmanager
def still_while_threads_run(clock: trio.testing.MockClock | None) -> Iterator[None]:
    """While inside, the clock's autojump is off whenever a worker thread runs (every
    `trio.to_thread.run_sync` of the process)."""
    if clock is None:
        yield
        return
    original = trio.to_thread.run_sync
    threshold = clock.autojump_threshold
    running = 0

    async def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        nonlocal running
        running += 1
        clock.autojump_threshold = math.inf
        try:
            return await original(fn, *args, **kwargs)
        finally:
            running -= 1
            if not running:
                clock.autojump_threshold = threshold

    trio.to_thread.run_sync = run_sync  # type: ignore[assignment]
    try:
        yield
    finally:
        trio.to_thread.run_sync = original
