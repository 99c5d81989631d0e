"""The stall watchdog: a run that shows no sign of life for `stall_timeout` is stopped.

A sign of life is any event the run emits, or git work in flight (a checkpoint of a big
worktree may take a while, and it runs on a worker thread while the watchdog watches).
Time is trio's clock, so tests can run the watchdog on a MockClock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio


class Lively(Protocol):
    @property
    def activity(self) -> int:
        """A counter that moves whenever the run does something."""

    @property
    def store_busy(self) -> int:
        """How many git calls are in flight."""


async def watch_for_stall(run: Lively, stall: float, on_stall: Callable[[float], None]) -> None:
    """Return after calling `on_stall(idle seconds)` once the run has been idle for
    `stall` seconds; never returns while the run keeps moving."""
    seen = run.activity
    since = trio.current_time()
    while True:
        await trio.sleep(min(1.0, stall / 4))
        now = trio.current_time()
        if run.activity != seen or run.store_busy:
            seen, since = run.activity, now
            continue
        if now - since >= stall:
            on_stall(now - since)
            return
