"""Terminal streams that a run outlives.

A run writes progress to stderr and results to stdout, but neither is what the run is
for: `git fabro run hello | head -3` or quitting a pager must not stop it halfway. A
command that only prints (`logs`, `ps`) still ends when its reader goes away; a run
swaps its streams for these wrappers, which drop everything after the first broken
write and let the stages carry on.
"""

from __future__ import annotations

import errno
import sys
from typing import IO

_GONE = (errno.EPIPE, errno.ECONNRESET, errno.EBADF, errno.EIO)


class _Outliving:
    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        if not self.closed_by_reader:
            try:
                self._stream.write(text)
            except (OSError, ValueError) as exc:
                self._give_up(exc)
        return len(text)

    def flush(self) -> None:
        if not self.closed_by_reader:
            try:
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        if isinstance(exc, OSError) and exc.errno not in _GONE:
            raise exc
        self.closed_by_reader = True

    def isatty(self) -> bool:
        return not self.closed_by_reader and self._stream.isatty()

    def __getattr__(self, name: str) -> object:
        # The rest of the stream (encoding, fileno, buffer...) as it is: code reaches it
        # through `sys.stdout`, typed as the stream, never through this class.
        return getattr(self._stream, name)


def outlive_readers() -> None:
    """Make this process's stdout and stderr survive their readers going away."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Outliving):
            setattr(sys, name, _Outliving(stream))
