"""A stage's `timeout` cutting off a model call, an agent's sub-agents and an agent CLI,
in this process through the real walk, on a MockClock that moves only when the test
moves it: once the stage is seen waiting where the test wants it cut off, the clock
jumps by the node's timeout. No real time is waited, and the deadline cannot come
before the stage has reached that point, however loaded the machine. The end-to-end
tests (test_llm_stages, test_subagents, test_cli_agents) keep one short run each."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from helpers import git, read_checkpoint, wait_until
from llm_server import LlmServer, Reply, Stall, ToolUse

from engine.inprocess.harness import Walked, walk
from engine.test_cli_agents import _plan, _wait_dead, install_fake_agent

AGENT = """
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, permissions="full", timeout="15s", prompt="Tidy the notes"]
    start -> work -> exit
}
"""


def walk_cut_off(
    source: str, tmp_path: Path, reached: Callable[[], object], seconds: float
) -> Walked:
    """Walk `source` on a clock that stands still until `reached()` holds, then jumps
    `seconds` (the node's timeout) at once."""
    clock = trio.testing.MockClock(autojump_threshold=math.inf)

    async def jump_when_reached() -> None:
        await trio.to_thread.run_sync(lambda: wait_until(reached, what="the stage's wait"))
        clock.jump(seconds)

    return walk(source, tmp_path, clock=clock, alongside=jump_when_reached)


def test_a_timeout_cancels_the_model_call_and_keeps_what_the_agent_touched(
    tmp_path: Path, llm_server: LlmServer
) -> None:
    llm_server.script(
        Reply(
            text="",
            tool_calls=(ToolUse("write_file", {"path": "notes.txt", "content": "y\n"}, id="w"),),
        ),
        Stall(seconds=120),
    )
    # The clock moves once the second model call is waiting on the server.
    walked = walk_cut_off(AGENT, tmp_path, lambda: len(llm_server.requests) == 2, 15)
    assert walked.status == "failed"
    [completed] = [e for e in walked.named("stage.completed") if e.node_id == "work"]
    props = completed.properties
    assert props.status == "failed" and props.failure_class == "transient_infra"
    assert "timed out after 15s (1 model calls)" in (props.error or "")
    assert props.files_touched == ["notes.txt"]
    assert (walked.worktree / "notes.txt").read_text() == "y\n"
    # The session closed its events although it was cut off mid-call.
    sessions = [e.event for e in walked.events if e.event.startswith("agent.session.")]
    assert sessions[-2:] == ["agent.session.deactivated", "agent.session.ended"]


LEAD = """
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="sonnet", timeout="15s", prompt="Lead the work"]
    start -> work -> exit
}
"""


def test_a_stage_timeout_closes_running_sub_agents(tmp_path: Path, llm_server: LlmServer) -> None:
    llm_server.script(
        Reply(
            text="Delegating.",
            tool_calls=(
                ToolUse("spawn_agent", {"task": "CHILD-T: take long"}, id="s1"),
                ToolUse("wait", {"agent_id": "sub_1"}, id="w1"),
            ),
        ),
    )
    llm_server.script_when("CHILD-T", Stall(seconds=120))

    def child_asking() -> bool:
        return any("CHILD-T" in str(r.body["messages"][0]) for r in llm_server.requests)

    # The clock moves once the child's model call is waiting on the server.
    walked = walk_cut_off(LEAD, tmp_path, child_asking, 15)
    assert walked.status == "failed"
    [closed] = walked.named("agent.sub.closed")
    assert (closed.properties.agent_id, closed.properties.depth) == ("sub_1", 1)
    assert walked.named("agent.sub.completed") == walked.named("agent.sub.failed") == []
    [stage] = [e for e in walked.named("stage.completed") if e.node_id == "work"]
    assert "timed out after 15s" in (stage.properties.error or "")
    # Both sessions ended, the child's before its parent's.
    [root] = [
        e.session_id for e in walked.named("agent.session.started") if not e.parent_session_id
    ]
    ended = [e.session_id for e in walked.named("agent.session.ended")]
    assert len(ended) == 2 and ended[-1] == root


CLI_AGENT = """
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, backend="cli", timeout="10s", prompt="Work on it"]
    start -> work -> exit
}
"""


def test_a_timeout_kills_the_agent_cli_and_keeps_what_it_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_agent(tmp_path, monkeypatch)
    pidfile = tmp_path / "agent.pids"
    # The CLI writes a file, then hangs (with a child of its own) past the timeout.
    _plan(tmp_path, monkeypatch, write={"half.txt": "half done\n"}, hang=str(pidfile), reply="-")
    # The clock moves once the CLI has written its file and tells it is hanging.
    walked = walk_cut_off(CLI_AGENT, tmp_path, pidfile.exists, 10)
    assert walked.status == "failed"
    pids = [int(p) for p in pidfile.read_text().split()]
    assert _wait_dead(pids)
    [completed] = [e for e in walked.named("stage.completed") if e.node_id == "work"]
    props = completed.properties
    assert props.status == "failed" and "timed out after 10s" in (props.error or "")
    assert props.failure_class == "transient_infra"
    # What it changed before it was cut off is told as a finished stage's would be.
    assert props.files_touched == ["half.txt"]
    meta = "refs/fabro/meta/RUN"
    status = json.loads(git(walked.worktree, "show", f"{meta}:nodes/work/status.json"))
    assert status["files_touched"] == ["half.txt"]
    checkpoint = read_checkpoint(walked.worktree, meta)
    assert checkpoint["node_outcomes"]["work"]["files_touched"] == ["half.txt"]
    assert (walked.worktree / "half.txt").read_text() == "half done\n"
    started = [e.session_id for e in walked.named("agent.session.started")]
    ended = [e.session_id for e in walked.named("agent.session.ended")]
    assert started and sorted(started) == sorted(ended)  # type: ignore[type-var]
