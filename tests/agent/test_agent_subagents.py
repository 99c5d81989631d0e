"""Sub-agents in process: the checks `spawn_agent` makes on its arguments, a child
confined to a directory, and a parent that fails while its children run."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from llm_server import Reply, Stall, ToolUse

from fabro_git.agent.subagents import SubAgents
from fabro_git.events.envelope import EventProps

from .conftest import Harness


def _crew(agent: Harness, **limits: int) -> SubAgents:
    def stamp(props: EventProps, session: str, parent: str | None) -> None:
        agent.bus.emit(
            props,
            **(
                {}
                if props.NAME in ("agent.session.started", "agent.session.ended")
                else {"node_id": "work", "node_label": "Work", "stage_id": "work@1"}
            ),
            session_id=session,
            parent_session_id=parent,
        )

    return SubAgents(stamp, **limits)


def test_a_child_confined_to_a_directory_reports_its_files_from_the_worktree(
    agent: Harness, worktree: Path
) -> None:
    (worktree / "pkg").mkdir()
    agent.server.script(
        Reply(
            text="Delegating.",
            tool_calls=(
                ToolUse("spawn_agent", {"task": "CHILD-W: note it", "working_dir": "pkg"}, id="s1"),
                ToolUse("wait", {"agent_id": "sub_1"}, id="w1"),
            ),
        ),
        Reply(text="Done."),
    )
    agent.server.script_when(
        "CHILD-W",
        Reply(
            text="",
            tool_calls=(ToolUse("write_file", {"path": "note.txt", "content": "n\n"}, id="c1"),),
        ),
        Reply(text="Noted."),
    )
    result = agent.run("Lead", toolsets=_crew(agent).toolsets())
    assert (worktree / "pkg" / "note.txt").read_text() == "n\n"
    assert "pkg/note.txt" in result.files_touched
    [waited] = [p for p in agent.of("agent.tool.completed") if p["tool_call_id"] == "w1"]
    assert "files_touched: pkg/note.txt" in waited["output"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"task": "x", "working_dir": "../"}, "outside the worktree"),
        ({"task": "x", "working_dir": "a.txt"}, "is not a directory"),
        ({"task": "x", "model": "sonet"}, "unknown model 'sonet'"),
        ({"task": "x", "max_turns": -1}, "max_turns"),
        ({"task": "  "}, "the task is empty"),
    ],
)
def test_spawn_agent_refuses_bad_arguments(
    agent: Harness, arguments: dict[str, object], message: str
) -> None:
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("spawn_agent", arguments, id="s1"),)),
        Reply(text="Fine."),
    )
    agent.run("Lead", toolsets=_crew(agent).toolsets())
    [refused] = agent.of("agent.tool.completed")
    assert refused["is_error"] is True
    assert message in refused["output"]
    assert agent.of("agent.sub.spawned") == []


def test_max_subagent_depth_0_offers_no_sub_agent_tools(agent: Harness) -> None:
    agent.run("Lead", toolsets=_crew(agent, max_depth=0).toolsets())
    [request] = agent.server.requests
    assert "spawn_agent" not in {tool["name"] for tool in request.body["tools"]}


def test_a_cancelled_parent_closes_its_running_children(agent: Harness) -> None:
    """The caller's cancellation reaches the children in flight; each is closed and its
    session ended before the parent's run returns."""
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("spawn_agent", {"task": "CHILD-1: wait"}, id="s1"),
                ToolUse("spawn_agent", {"task": "CHILD-2: wait"}, id="s2"),
                ToolUse("wait", {"agent_id": "sub_1"}, id="w1"),
            ),
        ),
    )
    agent.server.script_when("CHILD-1", Stall(seconds=60))
    agent.server.script_when("CHILD-2", Stall(seconds=60))
    session = agent.session(toolsets=_crew(agent).toolsets())

    async def main() -> None:
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.run, "Lead")
                while len(agent.server.requests) < 3:
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught

    trio.run(main)
    assert sorted(p["agent_id"] for p in agent.of("agent.sub.closed")) == ["sub_1", "sub_2"]
    assert session.result().status == "cancelled"
    assert len(agent.of("agent.session.ended")) == 3
    assert agent.of("agent.sub.completed") == []


def test_a_parents_own_error_passes_the_childrens_nursery_unwrapped(agent: Harness) -> None:
    """A bug in a parent's tool reaches the stage as itself, not as an exception group
    of the nursery its children run in."""
    from contextlib import asynccontextmanager
    from typing import Any

    from fabro_git.agent.tools import Tool, ToolContext, ToolOutcome
    from fabro_git.llm.types import ToolSpec

    async def broken(arguments: dict[str, Any], context: ToolContext) -> ToolOutcome:
        raise RuntimeError("a bug in a tool")

    tool = Tool(
        ToolSpec(
            name="broken", description="fails", parameters={"type": "object", "properties": {}}
        ),
        broken,
    )

    @asynccontextmanager
    async def extra(session: object) -> Any:
        yield {"broken": tool}

    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("spawn_agent", {"task": "CHILD-B: wait"}, id="s1"),
                ToolUse("broken", {}, id="b1"),
            ),
        ),
    )
    agent.server.script_when("CHILD-B", Stall(seconds=60))
    session = agent.session(toolsets=[*_crew(agent).toolsets(), extra])
    with pytest.raises(RuntimeError, match="a bug in a tool"):
        trio.run(session.run, "Lead")
    assert [p["agent_id"] for p in agent.of("agent.sub.closed")] == ["sub_1"]
