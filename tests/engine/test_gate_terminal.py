"""A human gate at a real terminal (a pty): the live display steps aside while the
question is asked, the question shows what it is about, and it is asked once."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from pathlib import Path

from helpers import TERMINAL_ESCAPES, fabro_exe, read_until


def _drain(fd: int, seconds: float) -> bytes:
    """Whatever the terminal receives within `seconds` (nothing, when all is quiet)."""
    got = b""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    return got


def test_gate_on_a_terminal_is_asked_cleanly(repo: Path) -> None:
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [*fabro_exe(), "run", "human-gate"],
        cwd=repo,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
        env=env,
    )
    os.close(follower)
    try:
        seen = read_until(leader, b"\n> ", b"")
        # Asked: the spinner must not redraw over the prompt while a person types.
        quiet = _drain(leader, 0.6)
        assert quiet == b"", quiet
        os.write(leader, b"A\n")
        seen = read_until(leader, b"Result: branch", seen + quiet)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            while os.read(leader, 4096):
                pass
        os.close(leader)
    assert code == 0, seen.decode(errors="replace")
    text = TERMINAL_ESCAPES.sub(b"", seen).decode(errors="replace")
    asked = text[: text.index("\n> ")]
    assert text.count("? Publish these notes?") == 1, text
    # What it asks about: the notes the previous stage printed, right above the question.
    assert "│ # Release notes" in asked and "│ - First draft." in asked
    assert asked.rindex("│ - First draft.") < asked.index("? Publish these notes?")
    assert "[A] Approve" in asked and "[R] Revise" in asked
