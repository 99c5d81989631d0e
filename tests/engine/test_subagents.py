"""Sub-agents end to end: `git fabro run` with an agent stage whose model spawns child
agents, against the local wire-format server. Each child's replies are scripted by its
task (`script_when`), so the parent's and the children's conversations can interleave
in any order. Every event of every run is checked against the events contract.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    events_named,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    wait_until,
    write_workflow,
)
from llm_server import (
    LlmServer,
    Recorded,
    Reply,
    Stall,
    Together,
    ToolUse,
    unauthorized,
)

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="sonnet", prompt="Lead the work"%s]
    start -> work -> exit
}
"""


def _first_user(request: Recorded) -> str:
    return json.dumps(request.body["messages"][0])


def _asking(server: LlmServer, marker: str) -> list[Recorded]:
    """The requests of the conversation whose first message holds `marker`."""
    return [r for r in server.requests if marker in _first_user(r)]


def _spawn(task: str, call: str) -> ToolUse:
    return ToolUse("spawn_agent", {"task": task}, id=call)


def _wait(agent_id: str, call: str) -> ToolUse:
    return ToolUse("wait", {"agent_id": agent_id}, id=call)


def _root_session(events: list[dict[str, Any]]) -> str:
    [completed] = [
        e for e in events_named(events, "agent.session.started") if not e.get("parent_session_id")
    ]
    return str(completed["session_id"])


def test_a_sub_agent_edits_a_file_and_reports_back(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, AGENT % "")
    llm_server.script(
        Reply(
            text="Delegating.",
            tool_calls=(_spawn("CHILD-A: write the greeting", "s1"), _wait("sub_1", "w1")),
            input_tokens=100,
            output_tokens=10,
        ),
        Reply(text="All done.", input_tokens=200, output_tokens=20),
    )
    llm_server.script_when(
        "CHILD-A",
        Reply(
            text="Writing.",
            tool_calls=(
                ToolUse("write_file", {"path": "greeting.txt", "content": "hello\n"}, id="c1"),
            ),
            input_tokens=40,
            output_tokens=4,
        ),
        Reply(text="REPORT: greeting.txt says hello", input_tokens=50, output_tokens=6),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:greeting.txt") == "hello\n"

    # The child had its own conversation, told it is a sub-agent, with the same tools.
    child = _asking(llm_server, "CHILD-A")
    assert len(child) == 2 and len(child[0].body["messages"]) == 1
    assert "sub-agent" in json.dumps(child[0].body["system"])
    assert {"write_file", "spawn_agent"} <= {tool["name"] for tool in child[0].body["tools"]}
    # The parent's next request holds the child's report as the wait tool's result.
    parent = [r for r in llm_server.requests if r not in child]
    assert len(parent) == 2
    assert "REPORT: greeting.txt says hello" in json.dumps(parent[1].body["messages"][-1])

    events = run_events(run_id, repo)
    root = _root_session(events)
    [spawned] = events_named(events, "agent.sub.spawned")
    assert spawned["session_id"] == root and spawned["node_id"] == "work"
    assert spawned["properties"] == {
        "agent_id": "sub_1",
        "depth": 1,
        "task": "CHILD-A: write the greeting",
    }
    [completed] = events_named(events, "agent.sub.completed")
    assert completed["properties"] == {
        "agent_id": "sub_1",
        "depth": 1,
        "success": True,
        "turns_used": 2,
    }
    [closed] = events_named(events, "agent.sub.closed")  # the parent's end closed it
    assert closed["properties"]["agent_id"] == "sub_1"
    # The child's own events carry its session and name the parent's.
    [write] = [
        e
        for e in events_named(events, "agent.tool.started")
        if e["properties"]["tool_name"] == "write_file"
    ]
    assert write["session_id"] != root and write["parent_session_id"] == root
    assert write["node_id"] == "work"
    child_session = write["session_id"]
    started = [
        e for e in events_named(events, "agent.session.started") if e["session_id"] == child_session
    ]
    assert [e.get("parent_session_id") for e in started] == [root]
    # Its streamed deltas are not forwarded; its messages are.
    assert not [
        e for e in events if e["event"].endswith(".delta") and e.get("session_id") == child_session
    ]
    assert (
        len([e for e in events_named(events, "agent.message") if e["session_id"] == child_session])
        == 2
    )

    # Its tokens, cost and files are the stage's.
    [stage] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "work"]
    usage = stage["properties"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (390, 40)
    assert "greeting.txt" in stage["properties"]["files_touched"]
    [done] = events_named(events, "run.completed")
    assert done["properties"]["total_cost"] == pytest.approx(usage["cost"])

    # logs --pretty shows the child's lines indented under the stage's agent.
    lines = run_fabro("logs", run_id, "--pretty", cwd=repo).stdout.splitlines()
    [parent_spawn] = [line for line in lines if "agent.sub.spawned" in line]
    [child_tool] = [line for line in lines if "agent.tool.started" in line and "write_file" in line]
    assert re.search(r"\d  agent\.sub\.spawned", parent_spawn)
    assert re.search(r"\d    agent\.tool\.started", child_tool)


def test_sub_agents_run_concurrently_up_to_the_limit(repo: Path, llm_server: LlmServer) -> None:
    """Four children each hold their reply until all four have asked: they can only
    finish if they ran at once. A fifth, spawned while they run, is refused."""
    tasks = [f"CHILD-{n}: look at part {n}" for n in range(1, 6)]
    llm_server.script(
        Reply(
            text="Fanning out.",
            tool_calls=(
                *(_spawn(task, f"s{n}") for n, task in enumerate(tasks, 1)),
                *(_wait(f"sub_{n}", f"w{n}") for n in range(1, 5)),
            ),
        ),
        Reply(text="Merged."),
    )
    for n in range(1, 5):
        llm_server.script_when(
            f"CHILD-{n}:", Together("four", 4, Reply(text=f"part {n} is fine"), timeout=30)
        )
    write_workflow(repo, AGENT % "")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    assert [e["properties"]["agent_id"] for e in events_named(events, "agent.sub.spawned")] == [
        "sub_1",
        "sub_2",
        "sub_3",
        "sub_4",
    ]
    completed = events_named(events, "agent.sub.completed")
    assert sorted(e["properties"]["agent_id"] for e in completed) == [
        "sub_1",
        "sub_2",
        "sub_3",
        "sub_4",
    ]
    assert all(e["properties"]["success"] for e in completed)
    assert _asking(llm_server, "CHILD-5") == []
    [refused] = [
        e
        for e in events_named(events, "agent.tool.completed")
        if e["properties"]["tool_call_id"] == "s5"
    ]
    assert refused["properties"]["is_error"] is True
    assert "4 sub-agents are running" in refused["properties"]["output"]
    last = json.dumps(llm_server.requests[-1].body["messages"][-1])
    assert all(f"part {n} is fine" in last for n in range(1, 5))


def test_a_failed_sub_agent_is_an_error_result_for_its_parent(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, AGENT % "")
    llm_server.script(
        Reply(
            text="Delegating.", tool_calls=(_spawn("CHILD-F: try it", "s1"), _wait("sub_1", "w1"))
        ),
        Reply(text="The helper failed; I did it myself."),
    )
    llm_server.script_when("CHILD-F", unauthorized())
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr  # the parent decides; the stage succeeds
    assert "work: sub-agent error" in proc.stderr
    events = run_events(result["run_id"], repo)
    [failed] = events_named(events, "agent.sub.failed")
    props = failed["properties"]
    assert props["agent_id"] == "sub_1" and props["depth"] == 1
    assert props["error"]["kind"] == "authentication"
    assert events_named(events, "agent.sub.completed") == []
    [waited] = [
        e
        for e in events_named(events, "agent.tool.completed")
        if e["properties"]["tool_call_id"] == "w1"
    ]
    assert waited["properties"]["is_error"] is True
    assert "status: failed" in waited["properties"]["output"]
    last = llm_server.requests[-1].body["messages"][-1]
    assert "Incorrect API key" in json.dumps(last) and '"is_error": true' in json.dumps(last)
    [stage] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "work"]
    assert stage["properties"]["status"] == "succeeded"


def test_the_depth_limit_refuses_a_sub_sub_agent_unless_raised(
    repo: Path, llm_server: LlmServer
) -> None:
    def script() -> None:
        llm_server.script(
            Reply(
                text="Delegating.", tool_calls=(_spawn("CHILD-D: dig", "s1"), _wait("sub_1", "w1"))
            ),
            Reply(text="Done."),
        )
        llm_server.script_when(
            "CHILD-D",
            Reply(
                text="Deeper.",
                tool_calls=(_spawn("GRANDCHILD: dig more", "g1"), _wait("sub_2", "g2")),
            ),
            Reply(text="Dug."),
        )
        llm_server.script_when("GRANDCHILD", Reply(text="Dug deeper."))

    # The default limit: a child (depth 1) may not spawn.
    script()
    write_workflow(repo, AGENT % "")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    assert [e["properties"]["agent_id"] for e in events_named(events, "agent.sub.spawned")] == [
        "sub_1"
    ]
    assert _asking(llm_server, "GRANDCHILD") == []
    answer = json.dumps(_asking(llm_server, "CHILD-D")[-1].body["messages"][-1])
    assert "may nest 1 deep" in answer

    # max_subagent_depth=2: the grandchild runs, its events name the child as parent.
    llm_server.requests.clear()
    script()
    write_workflow(repo, AGENT % ", max_subagent_depth=2", name="deep.fabro")
    proc, result = run_json("run", "deep.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    root = _root_session(events)
    spawned = events_named(events, "agent.sub.spawned")
    assert [(e["properties"]["agent_id"], e["properties"]["depth"]) for e in spawned] == [
        ("sub_1", 1),
        ("sub_2", 2),
    ]
    child = spawned[1]["session_id"]
    assert spawned[0]["session_id"] == root and spawned[1]["parent_session_id"] == root
    [grand] = [
        e for e in events_named(events, "agent.message") if e["session_id"] not in (root, child)
    ]
    assert grand["parent_session_id"] == child
    assert "Dug deeper." in json.dumps(_asking(llm_server, "CHILD-D")[-1].body["messages"][-1])
    lines = run_fabro("logs", run_id, "--pretty", cwd=repo).stdout.splitlines()
    assert any(re.search(r"\d      agent\.message", line) for line in lines)  # depth 2


def test_ctrl_c_closes_sub_agents_and_the_resumed_stage_starts_fresh(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, AGENT % "")
    llm_server.script(
        Reply(
            text="Delegating.",
            tool_calls=(_spawn("CHILD-C: take long", "s1"), _wait("sub_1", "w1")),
        ),
    )
    llm_server.script_when("CHILD-C", Stall(seconds=120))
    proc = start_fabro(
        ["run", "wf.fabro", "--goal", "g"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # The child is mid-call.
    wait_until(lambda: _asking(llm_server, "CHILD-C"), process=proc, limit=60, what="the child")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    run_id = re.findall(r"git fabro resume ([0-9A-Z]{26})", err.decode())[-1]
    events = run_events(run_id, repo)
    assert [e["properties"]["agent_id"] for e in events_named(events, "agent.sub.closed")] == [
        "sub_1"
    ]

    llm_server.requests.clear()
    llm_server.script(Reply(text="Done without help."))
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Done without help."
    [again] = llm_server.requests  # a fresh conversation, no child
    assert len(again.body["messages"]) == 1
    events = run_events(run_id, repo)
    assert len(events_named(events, "agent.sub.spawned")) == 1


def test_send_input_steers_or_restarts_a_sub_agent_and_close_agent_removes_it(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, AGENT % "")
    say = ToolUse(
        "send_input", {"agent_id": "sub_1", "message": "MORE: also check the tests"}, id="i2"
    )
    llm_server.script(
        Reply(
            text="Delegating.",
            tool_calls=(
                _spawn("CHILD-S: check the code", "s1"),
                # Sent before the child's first model call: it joins that request.
                ToolUse("send_input", {"agent_id": "sub_1", "message": "STEER: be brief"}, id="i1"),
                _wait("sub_1", "w1"),
            ),
        ),
        Reply(
            text="One more thing.",
            tool_calls=(
                say,  # to a finished child: it works again, on the same conversation
                _wait("sub_1", "w2"),
                ToolUse("close_agent", {"agent_id": "sub_1"}, id="c1"),
                _wait("sub_1", "w3"),
            ),
        ),
        Reply(text="Done."),
    )
    llm_server.script_when(
        "CHILD-S", Reply(text="FIRST: code is fine"), Reply(text="SECOND: tests are fine")
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    first, second = _asking(llm_server, "CHILD-S")
    assert "STEER: be brief" in json.dumps(first.body["messages"])
    sent = json.dumps(second.body["messages"])
    assert "FIRST: code is fine" in sent and "MORE: also check the tests" in sent

    events = run_events(result["run_id"], repo)
    assert [e["properties"]["turns_used"] for e in events_named(events, "agent.sub.completed")] == [
        1,
        1,
    ]
    results = {
        e["properties"]["tool_call_id"]: e["properties"]
        for e in events_named(events, "agent.tool.completed")
    }
    assert "SECOND: tests are fine" in results["w2"]["output"]
    assert results["c1"]["is_error"] is False
    assert results["w3"]["is_error"] is True and "was closed" in results["w3"]["output"]
    # Closed once, by close_agent, before the parent's last model call.
    names = [e["event"] for e in events]
    [closed] = [i for i, name in enumerate(names) if name == "agent.sub.closed"]
    assert closed < max(i for i, name in enumerate(names) if name == "agent.message")


def test_a_malformed_max_subagent_depth_is_refused_before_the_run(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, AGENT % ', max_subagent_depth="deep"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "wf.fabro:4" in proc.stderr and "max_subagent_depth" in proc.stderr
    assert llm_server.requests == []
