"""The agent loop end to end: real SDKs, the local wire-format server, a real worktree.

The model's tool calls are scripted; everything else is real: the requests the SDKs
send (checked for the tool results the model would read), the files the tools change,
and the events, each checked against the contract by the `agent` fixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from llm_server import Reply, ToolUse, server_error, unauthorized

from fabro_git.agent.session import AgentLimits, AgentSession, Conversation

from .conftest import Harness


def tool_results_anthropic(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def offered(body: dict[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools", []):
        names.add(tool.get("name") or tool["function"]["name"])
    return names


def test_anthropic_agent_reads_edits_and_creates_files(agent: Harness, worktree: Path) -> None:
    agent.server.script(
        Reply(text="Reading.", tool_calls=(ToolUse("read_file", {"path": "a.txt"}, id="t1"),)),
        Reply(
            text="",
            tool_calls=(
                ToolUse(
                    "edit_file", {"path": "a.txt", "old_string": "beta", "new_string": "BETA"}, "t2"
                ),
            ),
        ),
        Reply(
            text="",
            tool_calls=(
                ToolUse("write_file", {"path": "src/new.txt", "content": "fresh\n"}, id="t3"),
            ),
        ),
        Reply(text="All done."),
    )
    result = agent.run("Change beta to BETA and add src/new.txt", system_prompt="Stage rules.")

    assert (worktree / "a.txt").read_text() == "alpha\nBETA\ngamma\n"
    assert (worktree / "src" / "new.txt").read_text() == "fresh\n"
    assert result.status == "completed"
    assert result.text == "All done."
    assert result.turns == 4
    assert result.files_touched == ["a.txt", "src/new.txt"]
    assert result.usage.input_tokens == 4 * 12 and result.usage.output_tokens == 4 * 5
    assert result.cost is not None and result.cost > 0

    requests = agent.requests("anthropic")
    assert len(requests) == 4
    first = requests[0].body
    assert offered(first) == {"read_file", "write_file", "edit_file", "shell", "grep", "glob"}
    assert "Stage rules." in first["system"] and "<environment>" in first["system"]
    assert first["messages"] == [
        {"role": "user", "content": "Change beta to BETA and add src/new.txt"}
    ]
    [read] = tool_results_anthropic(requests[1].body)
    assert read["tool_use_id"] == "t1" and read["is_error"] is False
    assert read["content"] == "     1 | alpha\n     2 | beta\n     3 | gamma"
    edit = tool_results_anthropic(requests[2].body)[-1]
    assert edit["content"] == "edited a.txt: 1 replacement(s)"

    names = agent.names
    assert names[:6] == [
        "agent.session.started",
        "agent.session.activated",
        "agent.memory.loaded",
        "agent.skills.discovered",
        "agent.input",
        "agent.output.start",
    ]
    assert agent.of("agent.input") == [{"text": "Change beta to BETA and add src/new.txt"}]
    assert names[-3:] == [
        "agent.processing.end",
        "agent.session.deactivated",
        "agent.session.ended",
    ]
    assert "".join(e["delta"] for e in agent.of("agent.text.delta")) == "Reading.All done."
    messages = agent.of("agent.message")
    assert [m["tool_call_count"] for m in messages] == [1, 1, 1, 0]
    assert messages[0]["usage"] == {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}
    started = agent.of("agent.tool.started")
    assert [(e["tool_name"], e["tool_call_id"]) for e in started] == [
        ("read_file", "t1"),
        ("edit_file", "t2"),
        ("write_file", "t3"),
    ]
    assert [e["is_error"] for e in agent.of("agent.tool.completed")] == [False, False, False]


def test_openai_agent_edits_with_apply_patch(agent: Harness, worktree: Path) -> None:
    patch = "\n".join(
        [
            "*** Begin Patch",
            "*** Update File: a.txt",
            "@@ alpha",
            "-beta",
            "+beta patched",
            "*** Add File: docs/notes.md",
            "+# Notes",
            "+written by a patch",
            "*** End Patch",
        ]
    )
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("read_file", {"path": "a.txt"}, id="r1"),)),
        Reply(text="", tool_calls=(ToolUse("apply_patch", {"patch": patch}, id="p1"),)),
        Reply(text="Patched."),
    )
    result = agent.run("patch it", provider="openai")

    assert (worktree / "a.txt").read_text() == "alpha\nbeta patched\ngamma\n"
    assert (worktree / "docs" / "notes.md").read_text() == "# Notes\nwritten by a patch\n"
    assert result.status == "completed" and result.text == "Patched."
    assert result.files_touched == ["a.txt", "docs/notes.md"]
    requests = agent.requests("responses")
    assert offered(requests[0].body) == {
        "read_file",
        "apply_patch",
        "write_file",
        "shell",
        "grep",
        "glob",
    }
    outputs = [i for i in requests[2].body["input"] if i.get("type") == "function_call_output"]
    assert outputs[-1] == {
        "type": "function_call_output",
        "call_id": "p1",
        "output": "applied:\nM a.txt\nA docs/notes.md",
    }


def test_a_patch_that_does_not_apply_changes_nothing(agent: Harness, worktree: Path) -> None:
    patch = "\n".join(
        [
            "*** Begin Patch",
            "*** Add File: created.txt",
            "+should not appear",
            "*** Update File: a.txt",
            "@@",
            "-no such line",
            "+x",
            "*** End Patch",
        ]
    )
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("apply_patch", {"patch": patch}, id="p1"),)),
        Reply(text="ok"),
    )
    agent.run("patch it", provider="openai")

    assert not (worktree / "created.txt").exists()
    assert (worktree / "a.txt").read_text() == "alpha\nbeta\ngamma\n"
    [completed] = agent.of("agent.tool.completed")
    assert completed["is_error"] is True
    assert "does not apply (nothing was changed)" in completed["output"]
    output = agent.requests("responses")[1].body["input"][-1]["output"]
    assert "these lines are not in the file:\nno such line" in output


def test_chat_completions_agent_reads_edits_and_creates_files(
    agent: Harness, worktree: Path
) -> None:
    agent.server.script(
        Reply(
            text="", tool_calls=(ToolUse("read_file", {"path": "a.txt", "offset": 2, "limit": 1}),)
        ),
        Reply(
            text="",
            tool_calls=(
                ToolUse("edit_file", {"path": "a.txt", "old_string": "gamma", "new_string": "G"}),
                ToolUse("write_file", {"path": "b.txt", "content": "bee"}),
            ),
        ),
        Reply(text="finished"),
    )
    result = agent.run("work", provider="gemini")

    assert (worktree / "a.txt").read_text() == "alpha\nbeta\nG\n"
    assert (worktree / "b.txt").read_text() == "bee"
    assert result.status == "completed" and result.turns == 3
    requests = agent.requests("chat")
    tool_messages = [m for m in requests[1].body["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"] == "     2 | beta\n[lines 2-2 of 3; use offset to read on]"
    last = [m for m in requests[2].body["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in last[-2:]] == [
        "edited a.txt: 1 replacement(s)",
        "created b.txt (3 bytes)",
    ]


ESCAPES = {
    "parent": "../outside/target.txt",
    "absolute": "{outside}/target.txt",
    "symlink": "link/target.txt",
    "git": ".git/config",
}


@pytest.mark.parametrize("kind", list(ESCAPES))
def test_paths_that_leave_the_worktree_are_tool_errors(
    agent: Harness, worktree: Path, kind: str
) -> None:
    outside = worktree.parent / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("untouched\n")
    (worktree / "link").symlink_to(outside)
    git_config = (worktree / ".git" / "config").read_text()
    path = ESCAPES[kind].format(outside=outside)
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("write_file", {"path": path, "content": "pwned\n"}, id="w1"),
                ToolUse(
                    "edit_file",
                    {"path": path, "old_string": "untouched", "new_string": "pwned"},
                    id="e1",
                ),
                ToolUse("read_file", {"path": path}, id="r1"),
            ),
        ),
        Reply(text="I could not."),
    )
    result = agent.run("escape")

    assert (outside / "target.txt").read_text() == "untouched\n"
    assert (worktree / ".git" / "config").read_text() == git_config
    assert result.status == "completed" and result.files_touched == []
    completed = agent.of("agent.tool.completed")
    assert [c["is_error"] for c in completed] == [True, True, True]
    results = tool_results_anthropic(agent.requests("anthropic")[1].body)
    assert [r["is_error"] for r in results] == [True, True, True]
    expected = "git's internal files" if kind == "git" else "outside the worktree"
    for block in results:
        assert expected in block["content"]


def test_unknown_tools_and_bad_arguments_reach_the_model_as_errors(agent: Harness) -> None:
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("launch_rockets", {}, id="u1"),
                ToolUse("read_file", {}, id="u2"),
                ToolUse("read_file", {"path": 7}, id="u3"),
                ToolUse("read_file", {"path": "a.txt", "colour": "red"}, id="u4"),
                ToolUse("read_file", {"path": "missing.txt"}, id="u5"),
                ToolUse(
                    "edit_file", {"path": "a.txt", "old_string": "a\n", "new_string": "b"}, "u6"
                ),
            ),
        ),
        Reply(text="ok"),
    )
    agent.run("try things")

    contents = [r["content"] for r in tool_results_anthropic(agent.requests("anthropic")[1].body)]
    assert "there is no tool named 'launch_rockets'" in contents[0]
    assert "the argument 'path' is required" in contents[1]
    assert "'path' must be a JSON string" in contents[2]
    assert "unknown argument 'colour'" in contents[3]
    assert "missing.txt: no such file" in contents[4]
    assert "old_string occurs 3 times" in contents[5]


def test_a_model_error_ends_the_run_as_failed(agent: Harness) -> None:
    agent.server.script(unauthorized())
    result = agent.run("hello")

    assert result.status == "failed"
    assert result.failure_class == "deterministic"
    assert result.error is not None and result.error["kind"] == "authentication"
    [error] = agent.of("agent.error")
    assert error["error"]["kind"] == "authentication"
    assert agent.names[-3:] == [
        "agent.processing.end",
        "agent.session.deactivated",
        "agent.session.ended",
    ]


def test_retries_are_reported_as_events(agent: Harness) -> None:
    from fabro_git.llm.client import RetryPolicy

    agent.server.script(server_error(), Reply(text="second time"))
    policy = RetryPolicy(max_retries=1, initial_delay=0.0, jitter=(0.0, 0.0))
    result = agent.run("hello", retry_policy=policy)

    assert result.text == "second time"
    [retry] = agent.of("agent.llm.retry")
    assert retry["attempt"] == 2 and retry["error"]["kind"] == "server_error"


def test_turn_limit_stops_the_loop(agent: Harness) -> None:
    agent.server.script(
        *[
            Reply(text="", tool_calls=(ToolUse("read_file", {"path": "a.txt", "offset": n}),))
            for n in (1, 2, 3)
        ]
    )
    result = agent.run("loop", limits=AgentLimits(max_turns=2))

    assert result.status == "turn_limit"
    assert result.turns == 2
    assert len(agent.requests("anthropic")) == 2
    assert agent.of("agent.turn.limit") == [{"max_turns": 2}]
    assert "agent.processing.end" in agent.names


def test_repeated_tool_calls_are_detected_and_the_model_is_warned(agent: Harness) -> None:
    same = ToolUse("read_file", {"path": "a.txt"})
    agent.server.script(*[Reply(text="", tool_calls=(same,)) for _ in range(5)], Reply(text="ok"))
    result = agent.run("loop", limits=AgentLimits(loop_window=4))

    assert result.status == "completed"
    assert agent.names.count("agent.loop.detected") == 1
    requests = agent.requests("anthropic")
    before, after = requests[3].body["messages"], requests[4].body["messages"]
    assert not any("Loop detected" in str(m["content"]) for m in before)
    assert after[-1]["role"] == "user" and "Loop detected" in after[-1]["content"]
    # Detection starts afresh: the fifth identical call does not warn again.
    assert sum("Loop detected" in str(m["content"]) for m in requests[5].body["messages"]) == 1


def test_alternating_calls_are_a_loop_too(agent: Harness) -> None:
    first = ToolUse("read_file", {"path": "a.txt"})
    second = ToolUse("grep", {"pattern": "beta"})
    agent.server.script(
        *[Reply(text="", tool_calls=(call,)) for call in (first, second, first, second)],
        Reply(text="ok"),
    )
    agent.run("loop", limits=AgentLimits(loop_window=4))
    assert agent.names.count("agent.loop.detected") == 1


def test_long_tool_output_is_cut_for_the_model_but_whole_in_the_event(
    agent: Harness, worktree: Path
) -> None:
    (worktree / "big.txt").write_text("".join(f"line {n} {'x' * 40}\n" for n in range(20_000)))
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("read_file", {"path": "big.txt"}),)), Reply(text="ok")
    )
    agent.run("read", limits=AgentLimits())

    [completed] = agent.of("agent.tool.completed")
    assert completed["output"].count("\n") == 2000  # 2000 lines plus the "read on" note
    [sent] = tool_results_anthropic(agent.requests("anthropic")[1].body)
    assert len(sent["content"]) < len(completed["output"])
    assert "characters were removed from the middle" in sent["content"]
    assert sent["content"].startswith("     1 | line 0 x")
    assert sent["content"].endswith("use offset to read on]")


@pytest.mark.parametrize(
    ("provider", "api"), [("anthropic", "anthropic"), ("openai", "responses"), ("gemini", "chat")]
)
def test_the_conversation_round_trips_and_a_later_visit_carries_on(
    agent: Harness, worktree: Path, provider: str, api: str
) -> None:
    """A stored conversation (a thread's) goes back whole in each provider's own format:
    the first visit's prompt, its tool round (a Gemini call with its signature) and its
    answer come before the next visit's prompt."""
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("read_file", {"path": "a.txt"}, id="c1", thought_signature="sig-c1"),
            ),
        ),
        Reply(text="first visit done"),
        Reply(text="second visit done"),
    )
    session = agent.session(provider)
    trio.run(session.run, "first task")
    stored = session.conversation.to_bytes()

    restored = Conversation.from_bytes(stored)
    assert restored == session.conversation
    assert restored.turns == 2 and restored.files_touched == []
    again = agent.session(provider, conversation=restored, visit=2)
    result = trio.run(again.run, "second task")

    assert result.text == "second visit done" and result.turns == 1
    assert json.loads(stored)["messages"][1]["tool_calls"][0]["id"] == "c1"
    body = agent.requests(api)[2].body
    if api == "anthropic":
        messages = body["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
        assert messages[0]["content"] == "first task" and messages[-1]["content"] == "second task"
        assert messages[1]["content"][-1]["id"] == "c1"
        assert messages[2]["content"][0]["tool_use_id"] == "c1"
        assert messages[3]["content"][-1]["text"] == "first visit done"
    elif api == "responses":
        items = body["input"]
        assert items[0] == {"role": "user", "content": "first task"}
        assert [item.get("type") for item in items[1:3]] == [
            "function_call",
            "function_call_output",
        ]
        assert items[1]["call_id"] == items[2]["call_id"] == "c1"
        assert "first visit done" in json.dumps(items[3])
        assert items[-1] == {"role": "user", "content": "second task"}
    else:
        messages = [m for m in body["messages"] if m["role"] != "system"]
        assert [m["role"] for m in messages] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
        ]
        assert messages[0]["content"] == "first task" and messages[-1]["content"] == "second task"
        [sent] = messages[1]["tool_calls"]
        assert sent["id"] == "c1"
        assert sent["extra_content"] == {"google": {"thought_signature": "sig-c1"}}
        assert messages[2]["tool_call_id"] == "c1"
        assert messages[3]["content"] == "first visit done"


def test_the_preamble_comes_before_the_prompt(agent: Harness) -> None:
    session = agent.session()
    trio.run(lambda: session.run("Do the work.", preamble="Goal: ship\n"))
    [request] = agent.requests("anthropic")
    assert request.body["messages"][0]["content"] == "Goal: ship\n\nDo the work."


def test_a_session_can_be_built_without_touching_the_sdks() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path;"
        "from fabro_git.agent.session import AgentSession;"
        "from fabro_git.llm.types import Target;"
        "AgentSession(Path('.'), target=Target('anthropic', 'claude-sonnet-4-6'), emit=print);"
        "assert 'anthropic' not in sys.modules and 'openai' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_session_ids_are_unique_per_session(worktree: Path) -> None:
    from fabro_git.llm.types import Target

    target = Target("anthropic", "claude-sonnet-4-6")
    ids = {AgentSession(worktree, target=target, emit=print).session_id for _ in range(3)}
    assert len(ids) == 3


@pytest.mark.parametrize(
    ("provider", "api", "effort_field"),
    [
        ("anthropic", "anthropic", "thinking"),
        ("openai", "responses", "reasoning"),
        ("gemini", "chat", "reasoning_effort"),
    ],
)
def test_reasoning_streams_as_its_own_deltas(
    agent: Harness, provider: str, api: str, effort_field: str
) -> None:
    agent.server.script(Reply(text="answer", reasoning="thinking it over", reasoning_tokens=3))
    result = agent.run("think", provider=provider, reasoning_effort="low")

    assert result.text == "answer"
    assert result.usage.reasoning_tokens == 3
    assert "".join(e["delta"] for e in agent.of("agent.reasoning.delta")) == "thinking it over"
    assert effort_field in agent.requests(api)[0].body


def test_a_spent_quota_fails_over_to_the_next_target(agent: Harness) -> None:
    from llm_server import quota_exhausted

    from .conftest import TARGETS

    agent.server.script_for("anthropic", quota_exhausted())
    agent.server.script_for("responses", Reply(text="from the fallback"))
    result = agent.run("hello", fallbacks=[TARGETS["openai"]])

    assert result.status == "completed" and result.text == "from the fallback"
    [failover] = agent.of("agent.failover")
    assert (failover["from_provider"], failover["to_provider"]) == ("anthropic", "openai")
    assert agent.of("agent.message")[0]["model"] == TARGETS["openai"].model


def test_steering_joins_the_conversation_before_the_next_call(agent: Harness) -> None:
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("read_file", {"path": "a.txt"}),)),
        Reply(text="adjusted"),
    )
    session = agent.session()
    session.steer("queued before the start")

    def steer_during_tools(props: Any) -> None:
        if props.NAME == "agent.tool.started":
            session.steer("use the other file")

    agent.on_event = steer_during_tools
    result = trio.run(session.run, "begin")

    assert result.text == "adjusted"
    assert agent.of("agent.steering.injected") == [
        {"text": "queued before the start"},
        {"text": "use the other file"},
    ]
    [activated] = agent.of("agent.session.activated")
    assert activated["capabilities"] == ["steer"]
    first, second = (r.body["messages"] for r in agent.requests("anthropic"))
    assert [m["content"] for m in first] == ["begin", "queued before the start"]
    assert second[-2]["content"][0]["type"] == "tool_result"
    assert second[-1] == {"role": "user", "content": "use the other file"}
