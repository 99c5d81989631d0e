"""Permission levels in process: the table of tools and levels, and the gate in the
agent loop's dispatch (a denied call is an error result the model reads; "always"
raises the level for the rest of the session)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llm_server import Reply, ToolUse

from fabro_git.agent.permissions import (
    LEVELS,
    Answer,
    PermissionGate,
    allows,
    category_of,
    level_needed,
)
from fabro_git.agent.tools import TOOLS

from .conftest import Harness
from .test_agent_loop import tool_results_anthropic


@pytest.mark.parametrize(
    ("level", "tool", "allowed"),
    [
        ("read-only", "read_file", True),
        ("read-only", "grep", True),
        ("read-only", "glob", True),
        ("read-only", "spawn_agent", True),
        ("read-only", "wait", True),
        ("read-only", "write_file", False),
        ("read-only", "edit_file", False),
        ("read-only", "apply_patch", False),
        ("read-only", "shell", False),
        ("read-write", "write_file", True),
        ("read-write", "apply_patch", True),
        ("read-write", "shell", False),
        ("read-write", "mcp__github__create_issue", False),
        ("full", "shell", True),
        ("full", "mcp__github__create_issue", True),
    ],
)
def test_each_level_lets_through_its_categories(level: Any, tool: str, allowed: bool) -> None:
    assert allows(level, tool) is allowed


def test_every_built_in_tool_has_a_category_short_of_shell_but_the_shell() -> None:
    for name in TOOLS:
        assert (category_of(name) == "shell") == (name == "shell"), name


@given(st.text(min_size=1))
def test_an_unknown_tool_counts_as_the_shell(name: str) -> None:
    if name in TOOLS or name in ("spawn_agent", "send_input", "wait", "close_agent"):
        return
    assert category_of(name) == "shell"
    assert level_needed(name) == "full"
    assert [allows(level, name) for level in LEVELS] == [False, False, True]


@given(st.sampled_from(LEVELS), st.sampled_from(LEVELS), st.sampled_from([*TOOLS, "x"]))
def test_levels_are_ordered(lower: Any, higher: Any, tool: str) -> None:
    if LEVELS.index(lower) <= LEVELS.index(higher) and allows(lower, tool):
        assert allows(higher, tool)


def test_a_read_only_agent_is_refused_writes_and_the_shell(agent: Harness, worktree: Path) -> None:
    agent.server.script(
        Reply(
            text="Fixing it myself.",
            tool_calls=(
                ToolUse("write_file", {"path": "a.txt", "content": "mine\n"}, id="w"),
                ToolUse("shell", {"command": "touch shelled.txt"}, id="s"),
                ToolUse("read_file", {"path": "a.txt"}, id="r"),
            ),
        ),
        Reply(text="I could only read."),
    )
    gate = PermissionGate("read-only", source="permissions=read-only on the node")
    result = agent.run("Review a.txt", permissions=gate)

    assert result.status == "completed"
    assert (worktree / "a.txt").read_text() == "alpha\nbeta\ngamma\n"
    assert not (worktree / "shelled.txt").exists()
    assert result.files_touched == []
    results = {
        r["tool_use_id"]: r for r in tool_results_anthropic(agent.requests("anthropic")[1].body)
    }
    assert results["w"]["is_error"] is True and results["s"]["is_error"] is True
    assert "permission level is read-only" in results["w"]["content"]
    assert "needs read-write" in results["w"]["content"]
    assert "needs full" in results["s"]["content"]
    assert results["r"]["is_error"] is False
    completed = {e["tool_call_id"]: e for e in agent.of("agent.tool.completed")}
    assert completed["w"]["is_error"] and completed["s"]["is_error"]
    # The model was told its level up front.
    assert "Your permission level is read-only" in agent.requests("anthropic")[0].body["system"]


def test_always_raises_the_level_for_the_rest_of_the_session(
    agent: Harness, worktree: Path
) -> None:
    asked: list[str] = []

    async def ask(tool: str, arguments: Mapping[str, Any]) -> Answer | None:
        asked.append(tool)
        return "always"

    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "touch one.txt"}, id="s1"),)),
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "touch two.txt"}, id="s2"),)),
        Reply(text="Done."),
    )
    gate = PermissionGate("read-write", ask=ask)
    agent.run("Touch two files", permissions=gate)

    assert asked == ["shell"]  # the second call runs at the raised level
    assert gate.level == "full"
    assert (worktree / "one.txt").exists() and (worktree / "two.txt").exists()
    [warning] = agent.of("agent.warning")
    assert warning["kind"] == "permission_raised" and warning["details"]["needed"] == "full"


def test_no_denies_one_call_and_asks_again_next_time(agent: Harness, worktree: Path) -> None:
    answers: list[Answer] = ["no", "yes"]

    async def ask(tool: str, arguments: Mapping[str, Any]) -> Answer | None:
        return answers.pop(0)

    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "touch one.txt"}, id="s1"),)),
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "touch two.txt"}, id="s2"),)),
        Reply(text="Done."),
    )
    gate = PermissionGate("read-write", ask=ask)
    agent.run("Touch two files", permissions=gate)

    assert not (worktree / "one.txt").exists() and (worktree / "two.txt").exists()
    assert gate.level == "read-write"
    assert [w["kind"] for w in agent.of("agent.warning")] == [
        "permission_denied",
        "permission_granted",
    ]


def test_a_project_file_granting_full_permissions_needs_trust() -> None:
    from fabro_git.config.run_config import AgentConfig, RunSection
    from fabro_git.config.trust import actions

    [action] = actions(RunSection(agent=AgentConfig(permissions="full")))
    assert action.key == "run.agent.permissions" and "shell" in action.words
    assert actions(RunSection(agent=AgentConfig(permissions="read-only"))) == []
