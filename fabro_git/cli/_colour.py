"""Colour for people at a terminal, and none anywhere else.

`ps`, `inspect` and `logs --pretty` colour statuses the way the run display does:
only when standard output is a terminal, `TERM` is not `dumb` and `NO_COLOR` is unset.
"""

from __future__ import annotations

import os
from typing import IO

_CODES = {"green": "32", "red": "31", "yellow": "33", "cyan": "36", "dim": "2", "bold": "1"}

STATUS_STYLE = {
    "succeeded": "green",
    "partially_succeeded": "yellow",
    "failed": "red",
    "interrupted": "yellow",
    "running": "cyan",
    "superseded": "dim",
}


def wanted(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return (
        bool(isatty and isatty())
        and not os.environ.get("NO_COLOR")
        and os.environ.get("TERM") != "dumb"
    )


def paint(text: str, style: str | None, on: bool) -> str:
    if not on or not style or style not in _CODES:
        return text
    return f"\x1b[{_CODES[style]}m{text}\x1b[0m"


def status(text: str, on: bool, *, width: int = 0) -> str:
    """A status word, padded to `width` before colouring so columns stay aligned."""
    return paint(text.ljust(width), STATUS_STYLE.get(text), on)
