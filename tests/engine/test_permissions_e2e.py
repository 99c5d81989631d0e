"""Permission levels end to end: `git fabro run` with agent stages whose models ask for
tools beyond their level, against the local wire-format server. Without a terminal the
calls are denied as tool errors; on a terminal (a pty) the person is asked, and "no"
denies while "always" raises the level for the rest of the session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import git, run_events, run_fabro, run_json, typed_at_a_terminal, write_workflow
from llm_server import LlmServer, Reply, ToolUse

REVIEW = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    review [shape=box, model="sonnet", prompt="Review the notes"%s]
    start -> review -> exit
}
"""


def _of(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [event for event in events if event["event"] == name]


def _completed_tools(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        e["properties"]["tool_call_id"]: e["properties"]
        for e in _of(events, "agent.tool.completed")
    }


def test_a_read_only_review_agent_cannot_write_or_run_the_shell(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, REVIEW % ', permissions="read-only"')
    llm_server.script(
        Reply(
            text="Let me fix it myself.",
            tool_calls=(
                ToolUse("write_file", {"path": "README.md", "content": "rewritten\n"}, id="w"),
                ToolUse("shell", {"command": "echo pwned > shelled.txt"}, id="s"),
                ToolUse("read_file", {"path": "README.md"}, id="r"),
            ),
        ),
        Reply(text="Reviewed: the README is fine."),
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]

    assert git(repo, "show", f"fabro/run/{run_id}:README.md") == "hello\n"
    tree = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
    assert "shelled.txt" not in tree
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / "shelled.txt").exists()

    events = run_events(run_id, repo)
    tools = _completed_tools(events)
    assert tools["w"]["is_error"] and tools["s"]["is_error"]
    assert "permission level is read-only" in tools["w"]["output"]
    assert "nobody could be asked" in tools["s"]["output"]
    assert not tools["r"]["is_error"]
    # The model read the refusals as the tools' results.
    sent = json.dumps(llm_server.requests[1].body["messages"])
    assert "needs read-write" in sent and "needs full" in sent


def test_a_sub_agent_works_at_its_parents_read_only_level(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, REVIEW % ', permissions="read-only"')
    llm_server.script(
        Reply(
            text="Delegating.",
            tool_calls=(
                ToolUse("spawn_agent", {"task": "CHILD: write the file"}, id="sp"),
                ToolUse("wait", {"agent_id": "sub_1"}, id="wt"),
            ),
        ),
        Reply(text="The child could not write."),
    )
    llm_server.script_when(
        "CHILD: write the file",
        Reply(
            text="Writing.",
            tool_calls=(ToolUse("write_file", {"path": "child.txt", "content": "c\n"}, id="cw"),),
        ),
        Reply(text="I was not allowed to write."),
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    tree = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
    assert "child.txt" not in tree
    events = run_events(run_id, repo)
    tools = _completed_tools(events)
    assert not tools["sp"]["is_error"]
    assert tools["cw"]["is_error"] and "permission level is read-only" in tools["cw"]["output"]
    [child] = [
        e for e in _of(events, "agent.tool.completed") if e["properties"]["tool_call_id"] == "cw"
    ]
    assert child.get("parent_session_id")


def test_a_read_write_agent_is_asked_about_the_shell_on_a_terminal(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, REVIEW % "")
    llm_server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "echo one > one.txt"}, id="s1"),)),
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "echo two > two.txt"}, id="s2"),)),
        Reply(
            text="",
            tool_calls=(ToolUse("shell", {"command": "echo three > three.txt"}, id="s3"),),
        ),
        Reply(text="Done."),
    )
    code, seen = typed_at_a_terminal(
        ["run", "wf.fabro", "--no-retro"], repo, (b"no", b"always"), prompt=b"> "
    )
    text = seen.decode(errors="replace")
    assert code == 0, text
    assert text.count("? Agent review wants to run: shell") == 2, text  # s3 ran unasked
    run_id = git(
        repo, "for-each-ref", "--format=%(refname:lstrip=4)", "refs/heads/fabro/run"
    ).strip()
    tree = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
    assert "one.txt" not in tree
    assert "two.txt" in tree and "three.txt" in tree
    events = run_events(run_id, repo)
    tools = _completed_tools(events)
    assert tools["s1"]["is_error"] and "the user said no" in tools["s1"]["output"]
    assert not tools["s2"]["is_error"] and not tools["s3"]["is_error"]
    kinds = [e["properties"]["kind"] for e in _of(events, "agent.warning")]
    assert kinds == ["permission_denied", "permission_raised"]


def test_permissions_on_the_command_line_set_the_level_of_nodes_that_set_none(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, REVIEW % "")
    bad = run_fabro("run", "wf.fabro", "--permissions", "everything", cwd=repo)
    assert bad.returncode == 1 and "read-only, read-write, full" in bad.stderr
    llm_server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "echo ran > ran.txt"}, id="s"),)),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "wf.fabro", "--permissions", "full", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:ran.txt") == "ran\n"


GATED = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="sonnet", prompt="Build it"]
    gate [shape=hexagon, label="Ship it?"]
    start -> work -> gate
    gate -> exit [label="[A] Approve"]
    gate -> work [label="[R] Rework"]
}
"""


def test_answers_queued_for_human_gates_are_not_spent_on_permission_questions(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, GATED)
    llm_server.script(
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "echo x > x.txt"}, id="s"),)),
        Reply(text="Built."),
    )
    code, seen = typed_at_a_terminal(
        ["run", "wf.fabro", "--no-retro", "--answer", "A"], repo, (), prompt=b"> "
    )
    text = seen.decode(errors="replace")
    assert code == 0, text
    assert "wants to run" not in text
    run_id = git(
        repo, "for-each-ref", "--format=%(refname:lstrip=4)", "refs/heads/fabro/run"
    ).strip()
    tools = _completed_tools(run_events(run_id, repo))
    assert tools["s"]["is_error"] and "nobody could be asked" in tools["s"]["output"]
