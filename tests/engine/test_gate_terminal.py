"""A human gate at a real terminal (a pty): the live display steps aside while the
question is asked, the question shows what it is about, and it is asked once."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import (
    TERMINAL_ESCAPES,
    Terminal,
    git,
    typed_at_a_terminal,
    write_workflow,
)


def test_gate_on_a_terminal_is_asked_cleanly(repo: Path) -> None:
    with Terminal(["run", "human-gate"], repo, env={"NO_COLOR": None}) as terminal:
        terminal.read_until(b"\n> ")
        # Asked: the spinner must not redraw over the prompt while a person types.
        quiet = terminal.received_within(0.6)
        assert quiet == b"", quiet
        terminal.type("A\n")
        terminal.read_until(b"Result: branch")
        code = terminal.close(timeout=60)
    seen = terminal.seen
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
