"""A human gate at a real terminal (a pty): the live display steps aside while the
question is asked, the question shows what it is about, and it is asked once."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

from helpers import (
    TERMINAL_ESCAPES,
    fabro_exe,
    git,
    read_until,
    received_within,
    typed_at_a_terminal,
    write_workflow,
)


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
        quiet = received_within(leader, 0.6)
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


MERGE = """\
digraph Merge {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fix   [shape=parallelogram, script="echo fixed"]
    gate  [shape=hexagon, label="Merge this fix?"%s]
    merged [shape=parallelogram, script="echo merged > merged.txt"]
    start -> fix -> gate
    gate -> merged [label="[Y] Yes"]
    gate -> exit [label="[N] No"]
    merged -> exit
}
"""


def _run_on_a_terminal(repo: Path, typed: list[bytes]) -> tuple[int, str]:
    """Run wf.fabro on a pty, typing each line of `typed` when a prompt is shown."""
    code, seen = typed_at_a_terminal(
        ["run", "wf.fabro"], repo, tuple(typed), until=b"Result: ", env={"TERM": "dumb"}
    )
    return code, TERMINAL_ESCAPES.sub(b"", seen).decode(errors="replace")


def test_a_stray_answer_at_a_terminal_is_asked_again(repo: Path) -> None:
    write_workflow(repo, MERGE % "")
    code, text = _run_on_a_terminal(repo, [b"maybe", b"", b"y"])
    assert code == 0, text
    assert "('maybe' is none of the choices; type one of: [Y] Yes, [N] No)" in (text)
    assert "(this question has no default; type one of: [Y] Yes, [N] No" in text
    assert text.count("? Merge this fix?") == 1, text
    assert "failing closed" not in text
    run_id = re.search(r"run (\S+) started", text).group(1)  # type: ignore[union-attr]
    assert git(repo, "show", f"fabro/run/{run_id}:merged.txt").strip() == "merged"


def test_enter_at_a_terminal_takes_the_gates_default(repo: Path) -> None:
    write_workflow(repo, MERGE % ', human.default_choice="merged"')
    code, text = _run_on_a_terminal(repo, [b""])
    assert code == 0, text
    assert "none of the choices" not in text and "no default" not in text
    run_id = re.search(r"run (\S+) started", text).group(1)  # type: ignore[union-attr]
    assert git(repo, "show", f"fabro/run/{run_id}:merged.txt").strip() == "merged"
