"""Services that misbehave, end to end: `git fabro run` against MCP servers and model
endpoints of the suite's own that die, stall or flood. A broken service is a tool error
the model reads or a stage failure with a clear message, never a hang or a crash.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run_events, run_json, write_workflow
from llm_server import DripHeaders, LlmServer, Reply, ToolUse

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="claude-sonnet-4-6", permissions="full", prompt="Use the tools"]
    start -> work -> exit
}
"""

# Exits (without answering) on its first `tools/call` of a fresh directory; a restarted
# process finds the marker and answers.
DYING_SERVER = """\
import os
import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("flaky")
MARKER = sys.argv[1]


@app.tool()
def echo(text: str) -> str:
    \"\"\"Say the text back.\"\"\"
    if not os.path.exists(MARKER):
        open(MARKER, "w").close()
        os._exit(3)
    return f"echo: {text}"


app.run()
"""


AGENT_ON = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="%s", prompt="Read a file"]
    start -> work -> exit
}
"""


def _run_config(repo: Path, servers: str) -> None:
    (repo / "run.toml").write_text(f'[workflow]\ngraph = "wf.fabro"\n\n{servers}')


def _stdio(name: str, argv: list[str]) -> str:
    return f'[run.agent.mcps.{name}]\ntype = "stdio"\ncommand = {json.dumps(argv)}\n'


def _of(events: list[dict], name: str) -> list[dict]:
    return [event for event in events if event["event"] == name]


def test_an_mcp_server_that_dies_during_a_call_is_a_tool_error_and_is_restarted(
    repo: Path, llm_server: LlmServer, tmp_path: Path
) -> None:
    script = tmp_path / "dying_server.py"
    script.write_text(DYING_SERVER)
    write_workflow(repo, AGENT)
    _run_config(repo, _stdio("flaky", [sys.executable, str(script), str(tmp_path / "died")]))
    llm_server.script(
        Reply(text="Once.", tool_calls=(ToolUse("mcp__flaky__echo", {"text": "a"}, id="e1"),)),
        Reply(text="Again.", tool_calls=(ToolUse("mcp__flaky__echo", {"text": "b"}, id="e2"),)),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "echo", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    events = run_events(result["run_id"], repo)
    completed = {e["properties"]["tool_call_id"]: e for e in _of(events, "agent.tool.completed")}
    # The model read the first call's failure as the tool's error ...
    first = completed["e1"]["properties"]
    assert first["is_error"] is True
    assert "flaky" in first["output"] and "restarted" in first["output"]
    assert "mcp__flaky__echo" in json.dumps(llm_server.requests[1].body["messages"])
    # ... and the later call reached the restarted server.
    second = completed["e2"]["properties"]
    assert second["is_error"] is False, second
    assert second["output"] == "echo: b"
    assert len(llm_server.requests) == 3
    [warning] = _of(events, "agent.warning")
    assert warning["properties"]["kind"] == "mcp_server_restarted"
    assert warning["properties"]["details"]["server_name"] == "flaky"


def _tool_results(body: dict) -> list[tuple[str, bool | None]]:
    """The tool results a request carries, in any of the three wire formats: their text,
    and the error flag where the format has one."""
    found: list[tuple[str, bool | None]] = []
    for message in body.get("messages") or body.get("input") or []:
        if message.get("type") == "function_call_output":
            found.append((message["output"], None))
        elif message.get("role") == "tool":
            found.append((message["content"], None))
        elif isinstance(message.get("content"), list):
            found += [
                (block["content"], block["is_error"])
                for block in message["content"]
                if block.get("type") == "tool_result"
            ]
    return found


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "gpt-5.4", "gemini-3-flash-preview"])
def test_arguments_with_a_lone_surrogate_are_a_tool_error_the_model_can_correct(
    repo: Path, llm_server: LlmServer, model: str
) -> None:
    write_workflow(repo, AGENT_ON % model)
    # The server writes the arguments with json.dumps: the surrogate goes out as the
    # JSON escape "\\udc80", which no UTF-8 text can hold.
    llm_server.script(
        Reply(text="Reading.", tool_calls=(ToolUse("read_file", {"path": "\udc80"}, id="r1"),)),
        Reply(
            text="Reading again.",
            tool_calls=(ToolUse("read_file", {"path": "README.md"}, id="r2"),),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "read", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert len(llm_server.requests) == 3
    [(text, is_error)] = _tool_results(llm_server.requests[1].body)
    assert "could not be read" in text and "read_file" in text
    assert is_error in (True, None)
    [(text, is_error)] = _tool_results(llm_server.requests[2].body)[1:]
    assert "hello" in text and not is_error
    events = run_events(result["run_id"], repo)
    [stage] = [e for e in _of(events, "stage.completed") if e["node_id"] == "work"]
    assert stage


def test_a_model_endpoint_that_drips_its_headers_is_cut_off_by_the_idle_timeout(
    repo: Path, llm_server: LlmServer
) -> None:
    """One header byte every fifth of a second never lets a read wait the idle timeout
    (1 s here): only a deadline on the whole wait for the response ends the attempt,
    which is then retried (the drip alone would hold it for ever)."""
    write_workflow(repo, AGENT)
    (repo / "run.toml").write_text(
        '[workflow]\ngraph = "wf.fabro"\n\n[run.agent]\nstream_idle_timeout = "1s"\n'
        'request_retry_delay = "10ms"\n'
    )
    llm_server.script(DripHeaders(interval=0.2), Reply(text="Answered at last."))
    proc, result = run_json("run", "run.toml", "--goal", "drip", cwd=repo, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    events = run_events(result["run_id"], repo)
    [retry] = [e for e in _of(events, "agent.llm.retry") if e["node_id"] == "work"]
    error = retry["properties"]["error"]
    assert "no response from the provider within 1s (stream_idle_timeout)" in error["message"]
    assert len(llm_server.requests) == 2


# Three thousand tools, each with a long description (about 2 KB of schema apiece),
# made once as plain records: the low-level server answers `tools/list` with them, with
# no function to inspect for each (which took the high-level server seconds).
FLOODING_SERVER = """\
import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
TOOLS = [
    types.Tool(name=f"tool_{number:04d}", description="padding " * 250, input_schema=SCHEMA)
    for number in range(3000)
]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


server = Server("flood", on_list_tools=list_tools)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
"""


def test_an_mcp_server_offering_thousands_of_tools_is_capped_with_a_warning(
    repo: Path, llm_server: LlmServer, tmp_path: Path
) -> None:
    from fabro_git.agent.mcp import MAX_SERVER_TOOL_BYTES, MAX_SERVER_TOOLS

    script = tmp_path / "flooding_server.py"
    script.write_text(FLOODING_SERVER)
    write_workflow(repo, AGENT)
    _run_config(repo, _stdio("flood", [sys.executable, str(script)]) + 'startup_timeout = "120s"\n')
    llm_server.script(Reply(text="Done."))
    proc, result = run_json("run", "run.toml", "--goal", "flood", cwd=repo, timeout=300)
    assert proc.returncode == 0, proc.stderr
    [request] = llm_server.requests
    offered = [tool for tool in request.body["tools"] if tool["name"].startswith("mcp__flood__")]
    assert 0 < len(offered) <= MAX_SERVER_TOOLS
    assert len(json.dumps(offered)) <= MAX_SERVER_TOOL_BYTES + 64 * len(offered)
    events = run_events(result["run_id"], repo)
    [warning] = [
        e for e in _of(events, "agent.warning") if e["properties"]["kind"] == "mcp_tools_capped"
    ]
    details = warning["properties"]["details"]
    assert details["server_name"] == "flood"
    assert details["offered"] == 3000 and details["kept"] == len(offered)
    assert details["left_out_count"] == 3000 - len(offered)
    assert details["left_out"][0] == f"tool_{len(offered):04d}"
    assert "flood" in warning["properties"]["message"]
    [ready] = _of(events, "agent.mcp.ready")
    assert ready["properties"]["tool_count"] == len(offered)
