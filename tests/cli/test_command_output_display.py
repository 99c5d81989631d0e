"""What a person sees of a command's output: `run -v` shows it live, line by line as it
is printed (on a terminal); an offloaded output is shown as its text, never as its
`file://` pointer, both under its stage and above a human gate's question."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

from helpers import TERMINAL_ESCAPES, read_until, run_fabro, start_fabro, write_workflow

# Prints a line, then waits for a file that the test makes only once it has seen it.
WAITS = """\
digraph W {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    talk  [shape=parallelogram, script="echo READY-LINE; echo on-stderr >&2; while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done; echo AFTER-LINE"]
    start -> talk -> exit
}
"""


def test_verbose_shows_a_commands_lines_while_it_runs(repo: Path, hermetic_env: Path) -> None:
    import pty

    write_workflow(repo, WAITS)
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color"}
    proc = start_fabro(
        ["run", "wf.fabro", "-v"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
        env=env,
    )
    os.close(follower)
    try:
        # The stage is still running (it waits for `go`): the line can only be on the
        # terminal if it was shown as it was printed.
        seen = read_until(leader, b"READY-LINE", b"", plain=True)
        seen = read_until(leader, b"on-stderr", seen, plain=True)
        assert not (hermetic_env / "go").exists() and proc.poll() is None
        (hermetic_env / "go").write_text("")
        seen = read_until(leader, b"Result: branch", seen, plain=True)
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
    # Each line once: the stage's end does not print its output a second time.
    assert text.count("│ READY-LINE") == 1 and text.count("│ AFTER-LINE") == 1, text
    assert text.index("│ AFTER-LINE") < text.index("talk: succeeded")


def test_without_verbose_the_output_comes_at_the_stages_end(repo: Path) -> None:
    write_workflow(repo, WAITS.replace('while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done; ', ""))
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    done = next(i for i, line in enumerate(lines) if line.startswith("talk: succeeded"))
    assert [line.strip() for line in lines[done + 1 : done + 3]] == ["│ READY-LINE", "│ AFTER-LINE"]


def test_verbose_shows_each_command_its_own_lines(repo: Path) -> None:
    """The walk's command stages write one pair of files in turn: the second stage's
    lines are its own, not the first's again."""
    write_workflow(
        repo,
        """\
digraph T {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    a     [shape=parallelogram, script="echo FIRST-LINE; echo first-err >&2"]
    b     [shape=parallelogram, script="echo SECOND-LINE"]
    start -> a -> b -> exit
}
""",
    )
    proc = run_fabro("run", "wf.fabro", "-v", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    shown = [line.strip() for line in proc.stderr.splitlines() if "│" in line]
    assert sorted(shown) == ["│ FIRST-LINE", "│ SECOND-LINE", "│ first-err"]
    lines = proc.stderr.splitlines()
    b_at = next(i for i, line in enumerate(lines) if line.startswith("b: started"))
    assert lines[b_at + 1].strip() == "│ SECOND-LINE"
    assert lines[b_at + 2].startswith("b: succeeded")


# 3,000 numbered lines of 60 bytes (about 180 KB, over the 100 KB offload threshold),
# then a gate that asks about them.
BIG_THEN_GATE = """\
digraph B {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    big   [shape=parallelogram, script="for i in $(seq 1 3000); do printf 'line %05d %s\\\\n' $i 0123456789012345678901234567890123456789012345; done; echo LAST-OF-ALL"]
    gate  [shape=hexagon, label="Ship these?"]
    start -> big -> gate
    gate -> exit [label="[A] Approve"]
    gate -> exit [label="[R] Reject"]
}
"""


def test_an_offloaded_output_is_shown_as_text_not_as_its_pointer(repo: Path) -> None:
    write_workflow(repo, BIG_THEN_GATE)
    proc = run_fabro("run", "wf.fabro", cwd=repo, input="A\n")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "file://" not in err, err
    # The progress display: the tail under the stage.
    lines = err.splitlines()
    done = next(i for i, line in enumerate(lines) if line.startswith("big: succeeded"))
    assert [line.strip() for line in lines[done + 1 : done + 4]] == [
        "│ line 02999 0123456789012345678901234567890123456789012345",
        "│ line 03000 0123456789012345678901234567890123456789012345",
        "│ LAST-OF-ALL",
    ]
    # The gate: what it asks about, right above its question.
    asked = err[: err.index("? Ship these?")]
    assert asked.rstrip().endswith("│ LAST-OF-ALL"), asked[-400:]
    assert "│ line 02990" in asked
    run_id = proc.stderr.split("run ", 1)[1].split()[0]
    checkpoint = run_fabro("inspect", run_id, "--json", cwd=repo).stdout
    assert "file://" in checkpoint  # it was offloaded: the context holds a pointer


# Prints a line, waits for the test to have seen it beside the spinner, then prints one
# line of 150 kB.
LONG_LINE = """\
digraph W {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    talk  [shape=parallelogram, script="echo first-line; echo PROGRESS-NOW; while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done; printf '%0150000d\\\\n' 7"]
    start -> talk -> exit
}
"""


def test_without_verbose_a_terminal_shows_the_latest_line_cut_to_its_width(
    repo: Path, hermetic_env: Path
) -> None:
    import fcntl
    import pty
    import struct
    import termios

    write_workflow(repo, LONG_LINE)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    proc = start_fabro(
        ["run", "wf.fabro"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
        env=env,
    )
    os.close(follower)
    try:
        # The stage is still running (it waits for `go`): the line is beside its spinner.
        seen = read_until(leader, b"PROGRESS-NOW", b"", plain=True)
        assert not (hermetic_env / "go").exists() and proc.poll() is None
        (hermetic_env / "go").write_text("")
        seen = read_until(leader, b"Result: branch", seen, plain=True)
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
    # What the run's display printed (the summary after it may wrap as it will).
    rows = [row for row in re.split(r"[\r\n]", text[: text.index("Result:")]) if row]
    assert max(len(row) for row in rows) <= 60, [row for row in rows if len(row) > 60][:3]
    assert len(seen) < 20_000
    assert "│ 0000" in text and "talk: succeeded" in text
