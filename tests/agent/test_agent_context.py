"""What the agent knows besides the prompt: memory files, skills, and a compacted history."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from llm_server import Fault, Reply, ToolUse

from fabro_git.agent.memory import BUDGET_BYTES
from fabro_git.agent.session import SUMMARY_REQUEST, AgentLimits
from fabro_git.agent.skills import SKILL_LIMIT, discover_skills

from .conftest import Harness


def test_memory_files_of_the_profile_are_loaded_within_the_budget(
    agent: Harness, worktree: Path
) -> None:
    (worktree / "AGENTS.md").write_text("A" * 30 * 1024)
    (worktree / "CLAUDE.md").write_text("Always say please.\n" + "C" * 10 * 1024)
    (worktree / "GEMINI.md").write_text("gemini only")
    agent.run("hi")

    [loaded] = agent.of("agent.memory.loaded")
    root = str(worktree)
    assert loaded == {
        "provider_profile": "anthropic",
        "files": [
            {
                "path": f"{root}/AGENTS.md",
                "byte_count": 30 * 1024,
                "loaded_bytes": 30 * 1024,
                "truncated": False,
            },
            {
                "path": f"{root}/CLAUDE.md",
                "byte_count": 10 * 1024 + 19,
                "loaded_bytes": BUDGET_BYTES - 30 * 1024,
                "truncated": True,
            },
        ],
        "total_loaded_bytes": BUDGET_BYTES,
        "budget_bytes": BUDGET_BYTES,
        "visit": 1,
    }
    system = agent.requests("anthropic")[0].body["system"]
    assert "Always say please." in system
    assert "[Project instructions truncated at 32 KiB]" in system
    assert "gemini only" not in system


def test_each_profile_reads_its_own_file_and_symlinks_out_are_ignored(
    agent: Harness, worktree: Path
) -> None:
    secret = worktree.parent / "secret.md"
    secret.write_text("outside text")
    (worktree / "AGENTS.md").symlink_to(secret)
    (worktree / ".codex").mkdir()
    (worktree / ".codex" / "instructions.md").write_text("codex rules")
    (worktree / "CLAUDE.md").write_text("claude rules")
    agent.run("hi", provider="openai")

    [loaded] = agent.of("agent.memory.loaded")
    assert [f["path"] for f in loaded["files"]] == [f"{worktree}/.codex/instructions.md"]
    instructions = agent.requests("responses")[0].body["instructions"]
    assert "codex rules" in instructions
    assert "outside text" not in instructions and "claude rules" not in instructions


def test_memory_loaded_is_emitted_when_there_is_none(agent: Harness) -> None:
    agent.run("hi", provider="gemini")
    assert agent.of("agent.memory.loaded") == [
        {
            "provider_profile": "gemini",
            "files": [],
            "total_loaded_bytes": 0,
            "budget_bytes": BUDGET_BYTES,
            "visit": 1,
        }
    ]


def write_skill(directory: Path, name: str, description: str, body: str) -> None:
    (directory / name).mkdir(parents=True, exist_ok=True)
    (directory / name / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"
    )


def test_skills_are_discovered_expanded_and_used(agent: Harness, worktree: Path) -> None:
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "git-fabro" / "skills"
    write_skill(user, "commit", "Commit (personal)", "personal commit steps")
    write_skill(worktree / ".fabro" / "skills", "commit", "Commit the work", "project commit steps")
    write_skill(worktree / "skills", "review", "Review a change", "Review this: {{user_input}}")
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("use_skill", {"skill_name": "commit"}, id="s1"),
                ToolUse("use_skill", {"skill_name": "deploy"}, id="s2"),
            ),
        ),
        Reply(text="reviewed"),
    )
    session = agent.session(skill_dirs=None)
    import trio

    trio.run(session.run, "/review the parser changes")

    [discovered] = agent.of("agent.skills.discovered")
    assert discovered["source_dirs"] == [
        str(user),
        str(worktree / ".fabro" / "skills"),
        str(worktree / "skills"),
    ]
    assert discovered["skills"] == [
        {"name": "commit", "description": "Commit the work"},
        {"name": "review", "description": "Review a change"},
    ]
    assert agent.of("agent.skill.activated") == [
        {"skill_name": "review", "source": "slash", "visit": 1},
        {"skill_name": "commit", "source": "tool", "visit": 1},
    ]
    requests = agent.requests("anthropic")
    first = requests[0].body
    assert first["messages"][0]["content"] == "Review this: the parser changes"
    assert "use_skill" in {tool["name"] for tool in first["tools"]}
    assert "- `review`: Review a change" in first["system"]
    results = [
        block
        for block in requests[1].body["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]
    assert results[0]["content"] == "project commit steps" and results[0]["is_error"] is False
    assert results[1]["is_error"] is True and "no skill named 'deploy'" in results[1]["content"]


def test_a_worktree_skill_is_read_only_inside_the_worktree(
    agent: Harness, worktree: Path, tmp_path: Path
) -> None:
    """A repository's skill is a file it holds: a `SKILL.md` (or a skill dir) linked out
    of the worktree is not read, a link inside it is, and the user's own skills dir is
    read wherever it leads."""
    outside = tmp_path / "outside"
    write_skill(outside, "away", "Away", "OUTSIDE-DIR-TEXT")
    (outside / "key").write_text("---\nname: leak\ndescription: Leak\n---\nOUTSIDE-KEY\n")
    skills = worktree / "skills"
    (skills / "leak").mkdir(parents=True)
    (skills / "leak" / "SKILL.md").symlink_to(outside / "key")
    (skills / "away").symlink_to(outside / "away")
    (worktree / "docs").mkdir()
    (worktree / "docs" / "ok.md").write_text("---\nname: ok\ndescription: Ok\n---\nOK-TEXT\n")
    (skills / "ok").mkdir()
    (skills / "ok" / "SKILL.md").symlink_to(Path("..", "..", "docs", "ok.md"))
    (skills / "big").mkdir()
    (skills / "big" / "SKILL.md").write_text("x" * (SKILL_LIMIT + 1))
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "git-fabro" / "skills"
    user.mkdir(parents=True)
    (user / "mine").symlink_to(outside / "away")  # the user's own link: followed
    agent.server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("use_skill", {"skill_name": "leak"}, id="s1"),
                ToolUse("use_skill", {"skill_name": "ok"}, id="s2"),
            ),
        ),
        Reply(text="done"),
    )
    session = agent.session(skill_dirs=None)
    import trio

    trio.run(session.run, "/leak /away go")

    [discovered] = agent.of("agent.skills.discovered")
    assert [s["name"] for s in discovered["skills"]] == ["away", "ok"]  # `away` is the user's
    bodies = json.dumps([r.body for r in agent.requests("anthropic")])
    assert "OUTSIDE-KEY" not in bodies and "OK-TEXT" in bodies


def test_a_skill_file_that_is_a_fifo_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "skills" / "pipe").mkdir(parents=True)
    os.mkfifo(tmp_path / "skills" / "pipe" / "SKILL.md")
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.append(discover_skills([tmp_path / "skills"], worktree=tmp_path)),
        daemon=True,
    )
    reader.start()
    reader.join(timeout=10)  # a read of a FIFO with no writer never returns
    assert found == [{}]


def test_without_skills_there_is_no_use_skill_tool_and_slashes_stay(agent: Harness) -> None:
    agent.run("/review /usr/bin/env")
    [discovered] = agent.of("agent.skills.discovered")
    assert discovered["skills"] == [] and discovered["source_dirs"] == []
    body = agent.requests("anthropic")[0].body
    assert "use_skill" not in {tool["name"] for tool in body["tools"]}
    assert body["messages"][0]["content"] == "/review /usr/bin/env"
    assert agent.of("agent.skill.activated") == []


def test_a_history_near_the_context_window_is_compacted(agent: Harness, worktree: Path) -> None:
    read = ToolUse("read_file", {"path": "a.txt"})
    write = ToolUse("write_file", {"path": "out.txt", "content": "x"})
    agent.server.script(
        Reply(text="", tool_calls=(write,), input_tokens=300),
        Reply(text="", tool_calls=(read,), input_tokens=900),
        Reply(text="SUMMARY: wrote out.txt, read a.txt", input_tokens=700),
        Reply(text="done after compaction", input_tokens=200),
    )
    result = agent.run(
        "the original task",
        context_window=1000,
        limits=AgentLimits(compaction_keep_turns=1),
    )

    assert result.status == "completed" and result.text == "done after compaction"
    assert result.usage.input_tokens == 300 + 900 + 700 + 200
    assert result.turns == 3
    [started] = agent.of("agent.compaction.started")
    assert started["context_window_size"] == 1000 and started["estimated_tokens"] >= 850
    assert agent.of("agent.compaction.completed") == [
        {
            "original_turn_count": 5,
            "preserved_turn_count": 2,
            "summary_token_estimate": len("SUMMARY: wrote out.txt, read a.txt") // 4,
            "tracked_file_count": 1,
        }
    ]
    [warning] = agent.of("agent.warning")
    assert warning["kind"] == "context_window"
    requests = agent.requests("anthropic")
    assert len(requests) == 4
    summary_request = requests[2].body["messages"]
    assert summary_request[-1] == {"role": "user", "content": SUMMARY_REQUEST}
    assert len(summary_request) == 4  # task, first call, its result, the request
    after = requests[3].body["messages"]
    assert [m["role"] for m in after] == ["user", "assistant", "user"]
    assert after[0]["content"].startswith("the original task\n\n")
    assert "SUMMARY: wrote out.txt, read a.txt" in after[0]["content"]
    assert "Files changed so far: out.txt" in after[0]["content"]
    assert after[1]["content"][0]["name"] == "read_file"
    # The summary call streams nothing to the log and is no agent.message.
    assert len(agent.of("agent.message")) == 3


def too_long() -> Fault:
    return Fault(413, "server", "prompt is too long: 250000 tokens > 200000 maximum")


def test_a_provider_that_finds_the_request_too_long_gets_a_compacted_one(agent: Harness) -> None:
    agent.server.script(
        Reply(text="", tool_calls=(ToolUse("read_file", {"path": "a.txt", "offset": 1}),)),
        Reply(text="", tool_calls=(ToolUse("read_file", {"path": "a.txt", "offset": 2}),)),
        too_long(),
        Reply(text="SUMMARY"),
        Reply(text="done"),
    )
    result = agent.run("task", limits=AgentLimits(compaction_keep_turns=1))

    assert result.status == "completed" and result.text == "done"
    assert len(agent.of("agent.compaction.completed")) == 1
    assert agent.of("agent.error") == []
    last = agent.requests("anthropic")[-1].body["messages"]
    assert "SUMMARY" in last[0]["content"] and len(last) == 3


def test_too_long_with_nothing_to_compact_fails_the_run(agent: Harness) -> None:
    agent.server.script(too_long())
    result = agent.run("task")

    assert result.status == "failed" and result.failure_class == "budget_exhausted"
    [error] = agent.of("agent.error")
    assert error["error"]["kind"] == "context_length"
    assert agent.of("agent.compaction.started") == []
