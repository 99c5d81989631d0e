"""MCP servers' tools in agent stages, end to end: `git fabro run` with a run config
naming a small MCP server of our own (written with the official SDK), the agent driven
by the local wire-format LLM server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    events_named,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    trust_project,
    write_workflow,
)
from llm_server import LlmServer, Reply, ToolUse

NOTES_SERVER = """\
import os
import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("notes")


@app.tool()
def add_note(text: str) -> str:
    \"\"\"Append a line to notes.md in the working directory.\"\"\"
    with open("notes.md", "a", encoding="utf-8") as f:
        f.write(text + "\\n")
    return f"noted: {text}"


@app.tool()
def environment(name: str) -> str:
    \"\"\"Say whether a variable is set in the server's environment.\"\"\"
    return f"{name}={os.environ.get(name, '<unset>')}"


@app.tool()
def parent_command() -> str:
    \"\"\"The command line of the process that started this server.\"\"\"
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        return f.read().replace(b"\\0", b" ").decode("utf-8", "replace")


@app.tool()
def block(marker: str) -> str:
    \"\"\"Write this server's pid to `marker`, then never answer.\"\"\"
    import time

    with open(marker, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)


@app.tool()
def explode(reason: str) -> str:
    \"\"\"Always fails.\"\"\"
    raise RuntimeError(reason)


if len(sys.argv) > 1:
    app.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
else:
    app.run()
"""

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="claude-sonnet-4-6", permissions="full", prompt="Keep notes"]
    start -> work -> exit
}
"""


@pytest.fixture
def notes_server(tmp_path: Path) -> Path:
    path = tmp_path / "tools" / "notes_server.py"
    path.parent.mkdir()
    path.write_text(NOTES_SERVER)
    return path


def _run_config(repo: Path, servers: str) -> None:
    (repo / "run.toml").write_text(f'[workflow]\ngraph = "wf.fabro"\n\n{servers}')


def _stdio(name: str, script: Path, extra: str = "") -> str:
    return (
        f"[run.agent.mcps.{name}]\n"
        f'type = "stdio"\n'
        f"command = {json.dumps([sys.executable, str(script)])}\n"
        f"{extra}\n"
    )


def _tool_names(request_body: dict) -> list[str]:
    return [tool["name"] for tool in request_body.get("tools", [])]


def test_the_agent_calls_a_stdio_servers_tool_in_its_worktree(
    repo: Path, llm_server: LlmServer, notes_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTES_TOKEN", "tok-abcdefgh-1234")
    write_workflow(repo, AGENT)
    _run_config(
        repo,
        _stdio(
            "notes",
            notes_server,
            '[run.agent.mcps.notes.env]\nNOTES_TOKEN = "{{ env.NOTES_TOKEN }}"',
        ),
    )
    llm_server.script(
        Reply(
            text="Noting.",
            tool_calls=(
                ToolUse("mcp__notes__add_note", {"text": "first note"}, id="t1"),
                ToolUse("mcp__notes__environment", {"name": "NOTES_TOKEN"}, id="t2"),
                ToolUse("mcp__notes__environment", {"name": "ANTHROPIC_API_KEY"}, id="t3"),
                ToolUse("mcp__notes__explode", {"reason": "kaboom"}, id="t4"),
            ),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]

    # The tool ran in the stage's worktree: its file is on the run branch.
    assert git(repo, "show", f"fabro/run/{run_id}:notes.md") == "first note\n"
    first, second = llm_server.requests
    offered = _tool_names(first.body)
    assert {
        "mcp__notes__add_note",
        "mcp__notes__environment",
        "mcp__notes__explode",
        "read_file",
    } <= set(offered)
    sent = json.dumps(second.body["messages"])
    assert "noted: first note" in sent
    # The server got its configured variable, and not the run's provider key.
    assert "NOTES_TOKEN=tok-abcdefgh-1234" in sent
    assert "ANTHROPIC_API_KEY=<unset>" in sent

    events = run_events(run_id, repo)
    [ready] = events_named(events, "agent.mcp.ready")
    assert ready["node_id"] == "work"
    assert ready["properties"]["server_name"] == "notes"
    assert ready["properties"]["tool_count"] == 5
    assert {t["original_name"] for t in ready["properties"]["tools"]} == {
        "add_note",
        "block",
        "environment",
        "explode",
        "parent_command",
    }
    completed = {
        e["properties"]["tool_call_id"]: e for e in events_named(events, "agent.tool.completed")
    }
    assert completed["t1"]["properties"]["is_error"] is False
    assert completed["t4"]["properties"]["is_error"] is True
    assert [e["properties"]["tool_name"] for e in events_named(events, "agent.tool.started")] == [
        "mcp__notes__add_note",
        "mcp__notes__environment",
        "mcp__notes__environment",
        "mcp__notes__explode",
    ]
    # The `{{ env.NAME }}` reference is what the manifest keeps, never the value.
    manifest = meta_file(repo, run_id, "manifest.json")
    assert "{{ env.NOTES_TOKEN }}" in manifest
    assert "tok-abcdefgh-1234" not in git(repo, "log", "-p", "--all")


def test_a_script_servers_env_references_reach_it_as_values_not_as_shell_text(
    repo: Path, llm_server: LlmServer, notes_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `{{ env.NAME }}` in a `script` is handed to the shell as a variable: quotes and
    command substitutions in the value stay characters, and the value (a credential,
    often) is not in the command line other users can read."""
    value = 'it\'s "$(touch pwned1)" `touch pwned2`; touch pwned3 # tok-9f8e7d6c'
    monkeypatch.setenv("NOTES_ARG", value)
    write_workflow(repo, AGENT)
    script = f'NOTES_SEEN="{{{{ env.NOTES_ARG }}}}" {sys.executable} {notes_server}'
    _run_config(repo, f'[run.agent.mcps.notes]\ntype = "stdio"\nscript = {json.dumps(script)}\n')
    llm_server.script(
        Reply(
            text="Looking.",
            tool_calls=(
                ToolUse("mcp__notes__environment", {"name": "NOTES_SEEN"}, id="t1"),
                ToolUse("mcp__notes__parent_command", {}, id="t2"),
            ),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    results = {
        e["properties"]["tool_call_id"]: e["properties"]["output"]
        for e in events_named(run_events(result["run_id"], repo), "agent.tool.completed")
    }
    assert results["t1"] == f"NOTES_SEEN={value}"
    assert "/bin/sh -c NOTES_SEEN=" in results["t2"]
    assert "tok-9f8e7d6c" not in results["t2"]
    worktrees = [repo, *Path(os.environ["FABRO_HOME"]).rglob("worktree")]
    assert not [p for w in worktrees for p in w.glob("pwned*")]
    # The stage's worktree is gone after the run; what was made in it is on its branch.
    branch = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{result['run_id']}")
    assert branch.split() and not [p for p in branch.split() if "pwned" in p]


def test_a_secret_put_on_a_servers_command_line_is_warned_of(
    repo: Path, llm_server: LlmServer, notes_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A credential in `command` is in the server's argv, which every local user can
    read: the stage says so, and where to put it instead; a plain value is no news."""
    monkeypatch.setenv("NOTES_TOKEN", "tok-5a4b3c2d1e")
    monkeypatch.setenv("NOTES_MODE", "plain")
    write_workflow(repo, AGENT)
    command = [
        "env",
        "X={{ env.NOTES_TOKEN }}",
        "Y={{ env.NOTES_MODE }}",
        sys.executable,
        str(notes_server),
    ]
    _run_config(repo, f'[run.agent.mcps.notes]\ntype = "stdio"\ncommand = {json.dumps(command)}\n')
    llm_server.script(Reply(text="Done."))
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    assert events_named(events, "agent.mcp.ready")
    [notice] = [
        e["properties"]
        for e in events_named(events, "run.notice")
        if e["properties"]["code"] == "secret_on_command_line"
    ]
    assert notice["level"] == "warn"
    assert "run.agent.mcps.notes.command puts NOTES_TOKEN on" in notice["message"]
    assert "NOTES_MODE" not in notice["message"] and "tok-5a4b3c2d1e" not in notice["message"]
    assert "[run.agent.mcps.notes.env]" in notice["message"]


def test_a_server_that_fails_to_start_is_left_out(
    repo: Path, llm_server: LlmServer, notes_server: Path
) -> None:
    write_workflow(repo, AGENT)
    broken = (
        "[run.agent.mcps.broken]\n"
        'type = "stdio"\n'
        f"command = {json.dumps([sys.executable, '-c', 'import sys; sys.exit(3)'])}\n"
    )
    _run_config(repo, broken + "\n" + _stdio("notes", notes_server))
    llm_server.script(Reply(text="Fine without it."))
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    [failed] = events_named(events, "agent.mcp.failed")
    assert failed["properties"]["server_name"] == "broken"
    assert failed["properties"]["error"]
    [ready] = events_named(events, "agent.mcp.ready")
    assert ready["properties"]["server_name"] == "notes"
    offered = _tool_names(llm_server.requests[0].body)
    assert "mcp__notes__add_note" in offered
    assert not [name for name in offered if name.startswith("mcp__broken__")]


def test_a_required_server_that_fails_fails_the_stage(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, AGENT)
    _run_config(
        repo,
        "[run.agent.mcps.needed]\n"
        'type = "stdio"\n'
        'command = ["/nonexistent/mcp-server"]\n'
        "required = true\n",
    )
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert llm_server.requests == []
    events = run_events(result["run_id"], repo)
    [failed] = events_named(events, "agent.mcp.failed")
    assert failed["properties"]["server_name"] == "needed"
    [stage] = [e for e in events_named(events, "stage.failed") if e["node_id"] == "work"]
    assert "'needed' is required" in json.dumps(stage["properties"])


def test_a_missing_env_reference_is_a_server_failure(
    repo: Path, llm_server: LlmServer, notes_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_MCP_VAR", raising=False)
    write_workflow(repo, AGENT)
    _run_config(
        repo,
        _stdio(
            "notes", notes_server, '[run.agent.mcps.notes.env]\nX = "{{ env.NO_SUCH_MCP_VAR }}"'
        ),
    )
    llm_server.script(Reply(text="Done."))
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [failed] = events_named(run_events(result["run_id"], repo), "agent.mcp.failed")
    assert "run.agent.mcps.notes.env.X" in failed["properties"]["error"]
    assert "NO_SUCH_MCP_VAR" in failed["properties"]["error"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_notes(notes_server: Path, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    workdir = tmp_path / "http-server"
    workdir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(notes_server), str(port)],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # until it listens: a readiness poll, not a timing guess
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "the MCP HTTP server exited"
                assert time.monotonic() < deadline, "the MCP HTTP server never listened"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_http_server_is_reached_by_url(
    repo: Path, llm_server: LlmServer, http_notes: str
) -> None:
    write_workflow(repo, AGENT)
    _run_config(
        repo,
        f'[run.agent.mcps.remote]\ntype = "http"\nurl = "{http_notes}"\n'
        '[run.agent.mcps.remote.headers]\nX-Trace = "fabro-test"\n',
    )
    llm_server.script(
        Reply(
            text="Asking.",
            tool_calls=(ToolUse("mcp__remote__environment", {"name": "HOME"}, id="h1"),),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    [ready] = events_named(events, "agent.mcp.ready")
    assert ready["properties"]["server_name"] == "remote"
    [done] = events_named(events, "agent.tool.completed")
    assert done["properties"]["is_error"] is False
    assert done["properties"]["output"].startswith("HOME=")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('type = "stdio"\n', "exactly one of `command`"),
        ('type = "http"\n', "needs `url`"),
        ('type = "sandbox"\ncommand = ["x"]\nport = 3100\n', "remote sandbox"),
        ('type = "stdio"\ncommand = ["x"]\nstartup_timeout = "soon"\n', "duration"),
        ('type = "stdio"\ncommand = ["x"]\nenv = { A = "{{ goal }}" }\n', "env.NAME"),
        ('type = "stdio"\ncommand = ["x"]\ncolour = 1\n', "colour"),
    ],
)
def test_a_bad_server_table_is_refused_with_its_line(repo: Path, table: str, message: str) -> None:
    write_workflow(repo, AGENT)
    _run_config(repo, "[run.agent.mcps.srv]\n" + table)
    proc = run_fabro("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 1
    assert message in proc.stderr and "run.toml:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_servers_from_the_project_config_and_literal_credentials_stay_out_of_git(
    repo: Path, llm_server: LlmServer, notes_server: Path
) -> None:
    secret = "literal-secret-987654"
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text(
        _stdio("notes", notes_server, f'[run.agent.mcps.notes.env]\nNOTES_API_KEY = "{secret}"')
    )
    trust_project(repo)
    write_workflow(repo, AGENT)
    llm_server.script(
        Reply(
            text="Checking.",
            tool_calls=(ToolUse("mcp__notes__environment", {"name": "NOTES_API_KEY"}, id="e1"),),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    # The server saw the real value (it went back to the model) ...
    assert f"NOTES_API_KEY={secret}" in json.dumps(llm_server.requests[1].body["messages"])
    # ... and no git object holds it: not the manifest, not the tool's output event.
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    assert secret.encode() not in objects
    events = run_events(result["run_id"], repo)
    [done] = events_named(events, "agent.tool.completed")
    assert done["properties"]["output"] == "NOTES_API_KEY=***7654"
    assert events_named(events, "agent.mcp.ready")[0]["properties"]["server_name"] == "notes"


def test_ctrl_c_during_a_tool_call_stops_the_server(
    repo: Path, llm_server: LlmServer, notes_server: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "server.pid"
    write_workflow(repo, AGENT)
    _run_config(repo, _stdio("notes", notes_server))
    llm_server.script(
        Reply(
            text="Waiting.",
            tool_calls=(ToolUse("mcp__notes__block", {"marker": str(marker)}, id="b1"),),
        )
    )
    proc = start_fabro(
        ["run", "run.toml", "--goal", "g"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()):  # the tool call is running
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the MCP tool never ran"
            time.sleep(0.05)
        server_pid = int(marker.read_text())
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in err.decode()
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)


def test_a_sub_agent_uses_the_stages_mcp_servers(
    repo: Path, llm_server: LlmServer, notes_server: Path
) -> None:
    """One server for the stage: the child calls the tool the parent's run started."""
    write_workflow(repo, AGENT)
    _run_config(repo, _stdio("notes", notes_server))
    llm_server.script(
        Reply(
            text="Delegating.",
            tool_calls=(
                ToolUse("spawn_agent", {"task": "CHILD-M: note it"}, id="s1"),
                ToolUse("wait", {"agent_id": "sub_1"}, id="w1"),
            ),
        ),
        Reply(text="Done."),
    )
    llm_server.script_when(
        "CHILD-M",
        Reply(
            text="Noting.",
            tool_calls=(ToolUse("mcp__notes__add_note", {"text": "from the child"}, id="c1"),),
        ),
        Reply(text="Noted it."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:notes.md") == "from the child\n"
    events = run_events(run_id, repo)
    assert len(events_named(events, "agent.mcp.ready")) == 1
    [call] = [
        e
        for e in events_named(events, "agent.tool.completed")
        if e["properties"]["tool_call_id"] == "c1"
    ]
    assert call["properties"]["is_error"] is False
    assert call.get("parent_session_id")  # the child's, not the parent's
