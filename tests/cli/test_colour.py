"""`ps`, `inspect` and `logs --pretty` colour statuses at a terminal (a pty), and never
when piped or when NO_COLOR is set."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

import pytest
from helpers import fabro_exe, run_fabro


def _on_a_pty(args: list[str], cwd: Path, *, no_color: bool) -> bytes:
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    if no_color:
        env["NO_COLOR"] = "1"
    proc = subprocess.Popen(
        [*fabro_exe(), *args], cwd=cwd, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the pty is closed once the command ends
                break
            if not chunk:
                break
            out += chunk
    finally:
        proc.wait(timeout=60)
        os.close(leader)
    assert proc.returncode == 0, out
    return out


@pytest.mark.parametrize(
    "command", [["ps"], ["inspect", "hello"], ["logs", "hello", "--pretty"]], ids=lambda c: c[0]
)
def test_status_colour_only_at_a_terminal(repo: Path, command: list[str]) -> None:
    assert run_fabro("run", "hello", cwd=repo).returncode == 0
    green = b"\x1b[32m"
    assert green in _on_a_pty(command, repo, no_color=False)
    assert b"\x1b[" not in _on_a_pty(command, repo, no_color=True)
    piped = run_fabro(*command, cwd=repo)
    assert piped.returncode == 0 and "\x1b[" not in piped.stdout
