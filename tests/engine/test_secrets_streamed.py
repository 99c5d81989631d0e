"""Secrets cut across the pieces of a stream never reach git, whole or in halves.

A model's reply and reasoning arrive as SSE deltas, a shell tool's output 64 KiB at a
time, a command's long output is read into git a megabyte at a time and cut to a head
and tail for the context. Here the secret straddles each such boundary: the server
cuts the reply inside it, the shell command stops writing in the middle of it until the
reader has taken the first 64 KiB, the command prints it across the 500 KB, 1 MiB,
2 MiB and tail cuts of a 3.2 MB line. Afterwards no git object and no file under the
scratch dir holds the secret or either half of it, and each stream's pieces joined show
it masked as the whole text would (`***` and its last four).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import run_config_passing, run_events, run_fabro, write_workflow
from llm_server import LlmServer, Reply, ToolUse

SECRET = "tok-PLANTEDTOKEN5555abcdef"
SPLIT = 13  # "tok-PLANTEDTO" | "KEN5555abcdef"
ENV = {"MY_SERVICE_TOKEN": SECRET}
MASKED = "***" + SECRET[-4:]
# The raw output files a command writes itself: scratch holds its output as printed.
RAW_OUTPUT = ("stdout.log", "stderr.log")

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="%s", permissions="full", prompt="Say the token"]
    start -> work -> exit
}
"""


def _all_objects(repo: Path) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout


def _pieces_of(data: bytes) -> list[bytes]:
    """The secret and both its halves, raw and as JSON holds them (the same here)."""
    return [SECRET.encode(), SECRET[:SPLIT].encode(), SECRET[SPLIT:].encode()]


def _assert_nowhere(repo: Path, run_id: str) -> None:
    objects = _all_objects(repo)
    assert not [p for p in _pieces_of(objects) if p in objects]
    assert MASKED.encode() in objects
    scratch = Path(os.environ["FABRO_HOME"])
    for path in scratch.rglob("*"):
        if path.is_file() and path.name not in RAW_OUTPUT:
            data = path.read_bytes()
            assert not [p for p in _pieces_of(data) if p in data], path


def _joined(events: list[dict], name: str) -> str:
    return "".join(e["properties"]["delta"] for e in events if e["event"] == name)


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "gpt-5.4"])
def test_a_secret_across_two_reply_deltas_is_masked(
    repo: Path, llm_server: LlmServer, model: str
) -> None:
    text, reasoning = f"The token: {SECRET} and more.", f"I recall {SECRET} now."
    cuts = (text.index(SECRET) + SPLIT, reasoning.index(SECRET) + SPLIT)
    llm_server.script(Reply(text=text, reasoning=reasoning, cuts=cuts))
    write_workflow(repo, AGENT % model)
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo, env=ENV)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    events = run_events(run_id, repo)
    assert _joined(events, "agent.text.delta") == f"The token: {MASKED} and more."
    assert _joined(events, "agent.reasoning.delta") == f"I recall {MASKED} now."
    _assert_nowhere(repo, run_id)


# Writes all but the secret's last part so that the pipe's first 64 KiB end in the
# middle of it, waits until the reader has taken them, then writes the rest.
SHELL = (
    'python3 -c "import os, sys, fcntl, termios, struct, time; out = sys.stdout.buffer; '
    "key = os.environb[b'MY_SERVICE_TOKEN']; "
    "out.write(b'x' * (65536 - 13) + key[:13]); out.flush(); "
    "left = lambda: struct.unpack('i', fcntl.ioctl(1, termios.FIONREAD, b'0000'))[0]; "
    "[time.sleep(0.01) for _ in iter(left, 0)]; "
    "out.write(key[13:] + b' end'); out.flush()\""
)


def test_a_secret_across_the_64k_boundary_of_shell_output_is_masked(
    repo: Path, llm_server: LlmServer
) -> None:
    llm_server.script(
        Reply(text="Running.", tool_calls=(ToolUse("shell", {"command": SHELL}, id="s1"),)),
        Reply(text="Done."),
    )
    write_workflow(repo, AGENT % "claude-sonnet-4-6")
    proc = run_fabro(
        "run", run_config_passing(repo, "MY_SERVICE_TOKEN"), "--json", cwd=repo, env=ENV
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    events = run_events(run_id, repo)
    deltas = [e["properties"]["delta"] for e in events if e["event"] == "agent.tool.output.delta"]
    assert len(deltas) >= 2
    assert "".join(deltas) == "x" * (65536 - 13) + MASKED + " end"
    _assert_nowhere(repo, run_id)


LONG_LINE = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    show [shape=parallelogram, language=python, script="%s"]
    start -> show -> exit
}
"""


def test_a_secret_at_the_cuts_of_a_long_line_is_masked(repo: Path) -> None:
    """One 3.2 MB line: the secret across the context excerpt's head cut (500 KB), the
    1 MiB and 2 MiB chunks it is read into git in, and the excerpt's tail cut."""
    size = 3_200_000
    starts = [500_000, 1 << 20, 2 << 20, size - 500_000]
    code = (
        "import os, sys; key = os.environb[b'MY_SERVICE_TOKEN']; line = bytearray(b'x' * "
        f"{size}); "
        f"[line.__setitem__(slice(at - {SPLIT}, at - {SPLIT} + len(key)), key) "
        f"for at in {starts}]; "
        "sys.stdout.buffer.write(bytes(line))"
    )
    write_workflow(repo, LONG_LINE % code)
    proc = run_fabro(
        "run", run_config_passing(repo, "MY_SERVICE_TOKEN"), "--json", cwd=repo, env=ENV
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    scratch = next((Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*"))
    printed = (scratch / "nodes" / "show" / "stdout.log").read_bytes()
    assert [printed.find(SECRET.encode(), at - SPLIT) + SPLIT for at in starts] == starts
    _assert_nowhere(repo, run_id)
    stored = run_fabro("logs", run_id, cwd=repo)
    assert SECRET not in stored.stdout
