"""The shell tool and cancellation: process groups die with their call, and a cancelled
session still closes properly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from llm_server import Reply, ToolUse, provider_env

from fabro_git.agent.session import AgentLimits, AgentSession
from fabro_git.events.envelope import EventProps

from .conftest import Harness


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


# A background job that would write for ever, the shell waiting on it.
BACKGROUND = (
    "(while true; do echo tick >> ticks; sleep 0.05; done) & echo $! > job.pid; echo started; wait"
)


def test_a_timed_out_command_is_killed_with_its_process_group(
    agent: Harness, worktree: Path
) -> None:
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": BACKGROUND, "timeout_ms": 3000}),)),
        Reply(text="it hung"),
    )
    groups: list[tuple[int, bool]] = []
    result = agent.run(
        "run it", on_process_group=lambda pgid, running: groups.append((pgid, running))
    )

    pid = int((worktree / "job.pid").read_text())
    assert not alive(pid)
    assert len(groups) == 2 and groups[0][0] == groups[1][0]
    assert [running for _, running in groups] == [True, False]
    assert result.status == "completed"
    [completed] = agent.of("agent.tool.completed")
    assert completed["is_error"] is True
    assert completed["output"].startswith("started\n")
    assert "timed out after 3000 ms" in completed["output"]
    assert [e["delta"] for e in agent.of("agent.tool.output.delta")] == ["started\n"]


def test_background_jobs_end_with_the_command(agent: Harness, worktree: Path) -> None:
    command = "(sleep 600; echo late > late.txt) & echo $! > job.pid; echo done"
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": command}),)), Reply(text="ok")
    )
    agent.run("run it")

    assert not alive(int((worktree / "job.pid").read_text()))
    [completed] = agent.of("agent.tool.completed")
    assert completed["is_error"] is False
    assert completed["output"].startswith("done\n[exit code 0;")


def test_a_failing_command_is_a_result_and_keys_stay_out_of_its_environment(
    agent: Harness, worktree: Path
) -> None:
    command = "env | sort; echo oops >&2; exit 3"
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": command}),)), Reply(text="ok")
    )
    env = {
        **provider_env(agent.server),
        "FABRO_TEST_SETTING": "kept",
        "GIT_DIR": "/elsewhere/.git",
        "SOME_API_KEY": "sk-secret",
    }
    agent.run("run it", env=env)

    [completed] = agent.of("agent.tool.completed")
    assert completed["is_error"] is False
    output = completed["output"]
    assert "[exit code 3;" in output and "oops" in output
    assert "FABRO_TEST_SETTING=kept" in output
    assert "ANTHROPIC_BASE_URL=" in output
    assert "_API_KEY" not in output and "sk-secret" not in output
    assert "GIT_DIR" not in output
    assert f"PWD={os.path.realpath(worktree)}" in output


def test_the_timeout_is_capped_by_the_limit(agent: Harness, worktree: Path) -> None:
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("shell", {"command": "echo go; sleep 30", "timeout_ms": 3_600_000}),
            ),
        ),
        Reply(text="ok"),
    )
    agent.run("run it", limits=AgentLimits(shell_max_timeout=1.0))
    [completed] = agent.of("agent.tool.completed")
    assert "timed out after 1000 ms" in completed["output"]


def run_cancelled(agent: Harness, session: AgentSession, when: str) -> None:
    """Run `session`, cancelling it from inside `emit` when the first `when` event comes."""

    async def main() -> None:
        with trio.CancelScope() as scope:

            def cancel_on(props: EventProps) -> None:
                if when == props.NAME:
                    scope.cancel()

            agent.on_event = cancel_on
            await session.run("work")
        assert scope.cancelled_caught

    trio.run(main)


@pytest.mark.parametrize("provider", ["anthropic", "openai", "gemini"])
def test_cancelling_mid_stream_still_closes_the_session(agent: Harness, provider: str) -> None:
    agent.server.script(Reply(text="a long answer that will not be read to its end"))
    session = agent.session(provider)
    run_cancelled(agent, session, "agent.text.delta")

    names = agent.names
    assert "agent.message" not in names
    assert names[-2:] == ["agent.session.deactivated", "agent.session.ended"]
    assert "agent.processing.end" not in names
    assert session.result().status == "cancelled"


def test_cancelling_during_a_command_kills_its_process_group(
    agent: Harness, worktree: Path
) -> None:
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": BACKGROUND}),)),
        Reply(text="never asked for"),
    )
    session = agent.session()
    run_cancelled(agent, session, "agent.tool.output.delta")

    assert not alive(int((worktree / "job.pid").read_text()))
    assert len(agent.requests("anthropic")) == 1
    assert agent.names[-2:] == ["agent.session.deactivated", "agent.session.ended"]
    result = session.result()
    assert result.status == "cancelled" and result.turns == 1

    # A later visit carries on the thread: the interrupted call gets an error result.
    again = agent.session(conversation=session.conversation, visit=2)
    agent.on_event = None
    assert trio.run(again.run, "carry on").text == "never asked for"
    messages = agent.requests("anthropic")[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "user"]
    [interrupted] = messages[2]["content"]
    assert interrupted["is_error"] is True
    assert interrupted["content"].startswith("This tool call was interrupted")
    assert messages[3]["content"] == "carry on"
