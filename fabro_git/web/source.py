"""What the web view needs to read a run, as one small interface.

The server never opens a file or a ref itself: `RunSource` is the one door to the
repository it was started in, so no path from a URL reaches the file system. Every
method blocks (git reads), and the app calls them from worker threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class RunSource(Protocol):
    def rows(self) -> list[dict[str, Any]]:
        """Every run, newest first, as `git fabro ps --json` shows it (plus `live`)."""
        ...

    def exists(self, run_id: str) -> bool:
        """Whether `run_id` (a whole run id, already checked for shape) is a run here."""
        ...

    def summary(self, run_id: str) -> dict[str, Any]:
        """The run's row, its goal, branch and base, and its recorded graph's source."""
        ...

    def events(self, run_id: str) -> tuple[bytes, int]:
        """Every event recorded so far, one JSON line each, and how far into the live
        tail they reach (the offset to follow it from)."""
        ...

    def tail(self, run_id: str) -> Path:
        """The run's live event tail (it may not exist)."""
        ...

    def live(self, run_id: str) -> bool:
        """Whether a process runs it right now."""
        ...

    def scratch(self, run_id: str) -> Path:
        """The run's scratch dir, where its control socket lives."""
        ...
