"""Run data never drives the user's terminal: escapes in a command's output, a goal, a
label or an error are printed visible (`\\x1b`), never executed, by every command that
prints them; `show --raw` alone gives the bytes unchanged, for pipes.

The sanitiser itself is checked here on any text (hypothesis); the commands through the
real `git fabro`, on a pty where a terminal matters and through pipes elsewhere.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import on_a_terminal, run_fabro, write_workflow
from hypothesis import given
from hypothesis import strategies as st

from fabro_git.terminal import printable

UNSAFE = [
    *(chr(c) for c in range(0x20) if chr(c) not in "\t\n"),
    "\x7f",
    *(chr(c) for c in range(0x80, 0xA0)),
    *(chr(c) for c in range(0x202A, 0x202F)),
    *(chr(c) for c in range(0x2066, 0x206A)),
]
# Text that leans to the characters that matter, among ordinary ones.
TEXT = st.text(
    alphabet=st.one_of(st.sampled_from([*UNSAFE, "\t", "\n", "\\"]), st.characters()),
    max_size=60,
)


def _unsafe_left(text: str, *, one_line: bool) -> list[str]:
    kept = "" if one_line else "\t\n"
    return [
        c
        for c in text
        if (ord(c) < 0x20 and c not in kept)
        or 0x7F <= ord(c) <= 0x9F
        or 0x202A <= ord(c) <= 0x202E
        or 0x2066 <= ord(c) <= 0x2069
        or 0xD800 <= ord(c) <= 0xDFFF
    ]


@given(TEXT)
def test_printable_leaves_no_control_character(text: str) -> None:
    assert _unsafe_left(printable(text), one_line=False) == []
    assert _unsafe_left(printable(text, one_line=True), one_line=True) == []
    # A multi-line text keeps its lines and tabs where they were.
    assert printable(text).count("\n") == text.count("\n")
    assert printable(text).count("\t") == text.count("\t")
    assert "\n" not in printable(text, one_line=True)
    # Ordinary text is left as it is.
    if not _unsafe_left(text, one_line=True):
        assert printable(text) == text


@given(st.sampled_from(UNSAFE), st.sampled_from(UNSAFE))
def test_distinct_control_characters_stay_distinct(first: str, second: str) -> None:
    if first != second:
        assert printable(first) != printable(second)
        assert printable(f"a{first}b") != printable(f"a{second}b")


def test_printable_writes_escapes_as_python_does() -> None:
    assert printable("\x1b[2J\r\x08\x9b\u202e\x7f") == "\\x1b[2J\\r\\x08\\x9b\\u202e\\x7f"
    assert printable("one\n\ttwo") == "one\n\ttwo"
    assert printable("one\n\ttwo", one_line=True) == "one\\n\\ttwo"


# A command stage that prints what an attacker would: a clipboard write (OSC 52), a
# screen clear, an OSC 8 link, and CR / backspace overwrites; then fails with the same
# on stderr, so its error carries them too.
OSC52 = "\x1b]52;c;aGVsbG8=\x07"
CLEAR = "\x1b[2J"
LINK = "\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07"
HOSTILE = r"""
digraph H {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    loud  [shape=parallelogram, script="printf 'clip \\033]52;c;aGVsbG8=\\007 clear \\033[2J link \\033]8;;http://evil.example/\\007click\\033]8;;\\007 safe\\rEVIL x\\bY\\n'"]
    start -> loud -> exit
}
"""


def _run(repo: Path, *args: str) -> str:
    proc = run_fabro("run", "wf.fabro", "--json", *args, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def _on_a_pty(repo: Path, *args: str) -> bytes:
    """What `git fabro ARGS` writes to a terminal, stdout and stderr both."""
    code, seen = on_a_terminal(list(args), repo)
    assert code == 0, seen.decode(errors="replace")
    return seen


def test_show_prints_a_commands_escapes_visible_on_a_terminal(repo: Path) -> None:
    write_workflow(repo, HOSTILE)
    run_id = _run(repo)
    seen = _on_a_pty(repo, "show", run_id, "loud")
    assert b"--- stdout (stdout.log)" in seen
    assert b"\x1b]" not in seen and b"\x1b[2J" not in seen and b"\x08" not in seen
    # The terminal turns the newlines it is sent into CR LF; no other CR is left.
    assert b"\r" not in seen.replace(b"\r\n", b"\n")
    text = seen.decode()
    assert "clip \\x1b]52;c;aGVsbG8=\\x07 clear \\x1b[2J link \\x1b]8;;" in text
    assert "safe\\rEVIL x\\x08Y" in text


def test_show_raw_gives_the_stage_files_bytes_unchanged(repo: Path) -> None:
    write_workflow(repo, HOSTILE)
    run_id = _run(repo)
    proc = subprocess.run(
        ["git", "fabro", "show", "--raw", run_id, "loud"], cwd=repo, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    output = f"clip {OSC52} clear {CLEAR} link {LINK} safe\rEVIL x\bY\n".encode()
    assert b"\n--- stdout (stdout.log)\n" + output in proc.stdout


def test_ps_inspect_show_and_logs_show_a_goals_and_labels_escapes(repo: Path) -> None:
    write_workflow(repo, HOSTILE)
    goal = f"fix {OSC52} it\u202eevil"
    run_id = _run(repo, "--goal", goal, "--label", f"team={CLEAR}", "--label", "note=a\nb")
    outputs = {
        "ps": run_fabro("ps", cwd=repo),
        "inspect": run_fabro("inspect", run_id, cwd=repo),
        "inspect --retro": run_fabro("inspect", "--retro", run_id, cwd=repo),
        "show": run_fabro("show", run_id, cwd=repo),
        "logs --pretty": run_fabro("logs", "--pretty", run_id, cwd=repo),
    }
    for name, proc in outputs.items():
        assert proc.returncode == 0, (name, proc.stderr)
        assert "\x1b" not in proc.stdout + proc.stderr, name
        assert "\u202e" not in proc.stdout, name
    for name in ("inspect", "inspect --retro", "show", "logs --pretty"):
        assert "fix \\x1b]52;c;aGVsbG8=\\x07 it\\u202eevil" in outputs[name].stdout, name
    for name in ("ps", "inspect"):
        assert "team=\\x1b[2J" in outputs[name].stdout, name
        # A one-line field keeps its line: the newline in a label is shown, not printed.
        assert "note=a\\nb" in outputs[name].stdout, name


# A stage that prints escapes, then a gate (its label holds one too) that asks about it.
ASKS = """
digraph G {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    talk  [shape=parallelogram, script="printf 'look \\\\033]52;c;aGk=\\\\007 here\\\\n'"]
    gate  [shape=hexagon, label="Ship \x1b[2J these?"]
    start -> talk -> gate
    gate -> exit [label="[A] Approve"]
}
"""


def test_a_gate_shows_its_question_and_the_output_it_is_about_escaped(repo: Path) -> None:
    write_workflow(repo, ASKS)
    proc = run_fabro("run", "wf.fabro", cwd=repo, input="A\n")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr
    assert "│ look \\x1b]52;c;aGk=\\x07 here" in proc.stderr
    assert "? Ship \\x1b[2J these?" in proc.stderr


FAILS = r"""
digraph F {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    bad   [shape=parallelogram, script="printf 'oops \\033]52;c;aGk=\\007 \\033[2J\\n' >&2; exit 3"]
    start -> bad -> exit
}
"""


def test_a_failed_stages_error_is_shown_escaped_by_every_command(repo: Path) -> None:
    write_workflow(repo, FAILS)
    failed = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert failed.returncode == 1, failed.stderr
    run_id = json.loads(failed.stdout.strip().splitlines()[-1])["run_id"]
    shown = "oops \\x1b]52;c;aGk=\\x07 \\x1b[2J"
    # Each command, what it exits with, and what it prints of the failure: the error
    # itself, or (wait, fork) only that the stage or run failed.
    for args, code, printed in (
        (("show", run_id, "bad"), 0, shown),
        (("inspect", run_id), 0, shown),
        (("attach", run_id), 1, shown),
        (("wait", run_id), 1, f"run {run_id} failed"),
        (("logs", "--pretty", run_id), 0, shown),
        (("fork", run_id, "--list"), 0, "bad@1"),
    ):
        proc = run_fabro(*args, cwd=repo)
        assert proc.returncode == code, (args, proc.stderr)
        assert printed in proc.stdout + proc.stderr, args
        assert "\x1b" not in proc.stdout + proc.stderr, args
    assert "\x1b" not in failed.stderr and shown in failed.stderr


def test_json_output_writes_what_a_terminal_could_act_on_as_escapes(repo: Path) -> None:
    """JSON escapes C0 controls, not C1 (U+009B is a CSI), bidi controls or line
    separators: `logs` and `run --json` write those as \\uXXXX, the same JSON values."""
    write_workflow(repo, HOSTILE)
    goal = "fix \x9b2J it\u202eevil\u2028"
    proc = run_fabro("run", "wf.fabro", "--goal", goal, "--json", cwd=repo)
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    logs = run_fabro("logs", run_id, cwd=repo)
    for name, text in (("run --json", proc.stdout), ("logs", logs.stdout)):
        for char in ("\x9b", "\u202e", "\u2028"):
            assert char not in text, (name, repr(char))
    events = [json.loads(line) for line in logs.stdout.splitlines()]
    assert goal in [e["properties"].get("goal") for e in events]
    assert "\\u009b2J" in logs.stdout


# An agent's work that hides a line from the review: `ESC [8m` conceals what follows,
# a bidi override reverses it; beside it a file with Windows line endings, whose CR LF
# moves nothing.
HIDING = r"""
digraph Hiding {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    edit  [shape=parallelogram, script="printf 'ok = 1\\n\\033[8mrun(evil)\\033[0m\\nx = \\342\\200\\256cba\\n' > app.py; printf 'one\\r\\ntwo\\r\\n' > win.txt"]
    start -> edit -> exit
}
"""


def test_diff_shows_escapes_in_a_runs_files_visible_and_raw_on_request(repo: Path) -> None:
    write_workflow(repo, HIDING)
    run_id = _run(repo)
    code, seen = on_a_terminal(["diff", run_id], repo, env={"GIT_PAGER": "cat"})
    assert code == 0, seen
    assert b"\x1b[8m" not in seen and "\u202e".encode() not in seen
    text = seen.decode()
    assert "+\\x1b[8mrun(evil)\\x1b[0m" in text and "+x = \\u202ecba" in text
    # CR LF is left as it is (the terminal makes the LF a CR LF of its own).
    assert "+one\r\r\n+two\r\r\n" in text
    assert "shown escaped" in text

    piped = run_fabro("diff", run_id, cwd=repo)
    assert piped.returncode == 0 and "+\\x1b[8mrun(evil)" in piped.stdout
    assert "`--raw`" in piped.stderr
    raw = subprocess.run(
        ["git", "fabro", "diff", "--raw", run_id], cwd=repo, capture_output=True, check=True
    )
    assert b"+\x1b[8mrun(evil)\x1b[0m\n" in raw.stdout and raw.stderr == b""


def test_diff_with_escapes_goes_through_the_users_pager_escaped(repo: Path) -> None:
    from helpers import git

    write_workflow(repo, HIDING)
    run_id = _run(repo)
    git(repo, "config", "pager.diff", "sed s/^/PAGED:/")
    seen = _on_a_pty(repo, "diff", run_id)
    assert b"\x1b[8m" not in seen
    assert "PAGED:+\\x1b[8mrun(evil)\\x1b[0m" in seen.decode()


LINE_PARTS = st.sampled_from(
    [b"a", b"\t", b"\x1b[8m", b"\r", b"\r\n", b"\n", "é".encode(), "\u202e".encode(),
     "\x9b".encode(), b"\xff", b"\x7f", "日".encode()]
)  # fmt: skip


@given(parts=st.lists(LINE_PARTS, max_size=30), block=st.integers(1, 9))
def test_git_output_is_copied_block_by_block_as_line_by_line(
    parts: list[bytes], block: int
) -> None:
    """`diff` reads git's output in blocks of whole lines, copying a block that needs
    nothing escaped as it is: the same bytes as escaping each line, however the blocks
    fall (a CR LF, a character of several bytes, across a block's edge)."""
    import io

    from fabro_git.cli._paged import copy_shown, printable_line, shown_as_is

    data = b"".join(parts)
    lines = list(io.BytesIO(data))
    expected = "".join(printable_line(line) for line in lines).encode()
    out = io.BytesIO()
    escaped = copy_shown(io.BytesIO(data), out, block)
    assert out.getvalue() == expected
    changed = expected != data
    assert escaped == changed
    assert shown_as_is(io.BytesIO(data), block) == (not changed)
