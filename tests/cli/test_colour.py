"""`ps`, `inspect` and `logs --pretty` colour statuses at a terminal (a pty), and never
when piped or when NO_COLOR is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import on_a_terminal, run_fabro


def _on_a_pty(args: list[str], cwd: Path, *, no_color: bool) -> bytes:
    code, seen = on_a_terminal(args, cwd, env={"NO_COLOR": "1" if no_color else None})
    assert code == 0, seen
    return seen


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
