"""Every `agent.*` event of the contract is emitted by a real run, and passes the contract.

Real runs: `git fabro run` with the real SDKs against the local wire-format server, no
`--dry-run`. Each scenario drives one stretch of the agent's path and checks what it
emits; together they must emit exactly the contract's `agent.*` events, less those shown
by their own tests (sub-agents in test_subagents, MCP servers in test_mcp, steering with
`git fabro steer` in test_llm_stages) and the legacy `agent.skill.expanded`
(`tests/events/test_event_coverage.py` checks the whole catalogue).
"""

from __future__ import annotations

from pathlib import Path

from event_contract.check import check_event
from event_contract.seed import load_contract
from helpers import git, run_events, run_json, write_workflow
from llm_server import Drop, LlmServer, Reply, ToolUse, quota_exhausted, unauthorized

NOT_EMITTED = ("agent.sub.", "agent.mcp.")  # shown by test_subagents and test_mcp
NOT_HERE = {"agent.steering.injected", "agent.skill.expanded"}

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, permissions="full"%s]
    start -> work -> exit
}
"""


def _expected() -> set[str]:
    return {
        name
        for name in load_contract()
        if name.startswith("agent.") and not name.startswith(NOT_EMITTED) and name not in NOT_HERE
    }


class Runs:
    def __init__(self, repo: Path, server: LlmServer) -> None:
        self.repo = repo
        self.server = server
        self.emitted: dict[str, str] = {}  # event name -> the scenario that first emitted it

    def run(self, scenario: str, attrs: str, *, status: int = 0) -> list[dict]:
        write_workflow(self.repo, AGENT % attrs)
        proc, result = run_json("run", "wf.fabro", "--goal", scenario, cwd=self.repo)
        assert proc.returncode == status, proc.stderr
        events = run_events(result["run_id"], self.repo)
        catalogue = load_contract()
        assert [p for event in events for p in check_event(event, catalogue)] == []
        assert not any("dry-run" in str(e.get("properties", {}).get("notes")) for e in events)
        for event in events:
            if event["event"].startswith("agent."):
                self.emitted.setdefault(event["event"], scenario)
        return events


def _of(events: list[dict], name: str) -> list[dict]:
    return [event["properties"] for event in events if event["event"] == name]


def _working_agent(runs: Runs) -> None:
    """Memory, a skill by slash, a dropped stream retried, reasoning, a shell command."""
    repo = runs.repo
    (repo / "AGENTS.md").write_text("Keep the notes short.\n")
    (repo / "skills" / "tidy").mkdir(parents=True)
    (repo / "skills" / "tidy" / "SKILL.md").write_text(
        "---\nname: tidy\ndescription: Tidy the notes\n---\nTidy these notes: {{user_input}}\n"
    )
    git(repo, "add", "AGENTS.md", "skills")
    git(repo, "commit", "-q", "-m", "memory and a skill")
    runs.server.script(
        Drop(Reply(text="this partial answer is cut off before it ends"), after=5),
        Reply(
            reasoning="I should look at the shell first",
            text="Running a command.",
            tool_calls=(ToolUse("shell", {"command": "echo hello from the shell"}, id="s1"),),
            reasoning_tokens=7,
        ),
        Reply(text="Done."),
    )
    events = runs.run("working", ', model="sonnet", prompt="/tidy the shopping list"')
    [memory] = _of(events, "agent.memory.loaded")
    assert [Path(f["path"]).name for f in memory["files"]] == ["AGENTS.md"]
    [skills] = _of(events, "agent.skills.discovered")
    assert [s["name"] for s in skills["skills"]] == ["tidy"]
    assert _of(events, "agent.skill.activated") == [
        {"skill_name": "tidy", "source": "slash", "visit": 1}
    ]
    [given] = _of(events, "agent.input")
    assert "Tidy these notes: the shopping list" in given["text"]
    [retry] = _of(events, "agent.llm.retry")
    assert retry["attempt"] == 2
    # The cut-off stream's words were streamed; the replacement voids them before the
    # retried attempt starts again.
    names = [e["event"] for e in events]
    replace = names.index("agent.output.replace")
    assert "agent.text.delta" in names[:replace]
    assert names.index("agent.llm.retry") > replace
    assert _of(events, "agent.output.replace") == [{"text": ""}]
    assert "".join(d["delta"] for d in _of(events, "agent.reasoning.delta")) == (
        "I should look at the shell first"
    )
    assert "hello from the shell" in "".join(
        d["delta"] for d in _of(events, "agent.tool.output.delta")
    )
    [done] = _of(events, "agent.tool.completed")
    assert done["tool_name"] == "shell" and done["is_error"] is False


def _looping_agent(runs: Runs) -> None:
    same = ToolUse("read_file", {"path": "README.md"})
    runs.server.script(
        Reply(
            text="",
            tool_calls=tuple(ToolUse(same.name, same.arguments, id=f"r{i}") for i in range(10)),
        ),
        Reply(text="Changing course."),
    )
    events = runs.run("looping", ', model="sonnet", prompt="Read the readme"')
    assert len(_of(events, "agent.loop.detected")) == 1
    assert "Loop detected" in str(runs.server.requests[-1].body["messages"][-1])


def _turn_limited_agent(runs: Runs) -> None:
    runs.server.script(
        Reply(text="", tool_calls=(ToolUse("glob", {"pattern": "*"}, id="g1"),)),
        Reply(text="", tool_calls=(ToolUse("glob", {"pattern": "*.md"}, id="g2"),)),
    )
    events = runs.run("limited", ', model="sonnet", max_turns=2, prompt="Look around"', status=1)
    assert _of(events, "agent.turn.limit") == [{"max_turns": 2}]
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert "turn limit" in failed["properties"]["error"]


def _compacting_agent(runs: Runs) -> None:
    """Five tool rounds, the last filling most of the 200k-token window: a warning, then
    the older turns are summarised before the next call."""
    rounds = [
        Reply(text="", tool_calls=(ToolUse("glob", {"pattern": f"*{i}"}, id=f"c{i}"),))
        for i in range(4)
    ]
    runs.server.script(
        *rounds,
        Reply(
            text="",
            tool_calls=(ToolUse("glob", {"pattern": "*.txt"}, id="big"),),
            input_tokens=190_000,
        ),
        Reply(text="SUMMARY of the search so far"),
        Reply(text="Done after compaction."),
    )
    events = runs.run("compacting", ', model="sonnet", prompt="Search widely"')
    [warning] = _of(events, "agent.warning")
    assert warning["kind"] == "context_window"
    [started] = _of(events, "agent.compaction.started")
    assert started["context_window_size"] == 200_000
    [completed] = _of(events, "agent.compaction.completed")
    assert completed["preserved_turn_count"] < completed["original_turn_count"]
    assert "SUMMARY of the search so far" in str(runs.server.requests[-1].body["messages"][0])


def _failing_over_agent(runs: Runs) -> None:
    (runs.repo / ".fabro").mkdir(exist_ok=True)
    (runs.repo / ".fabro" / "project.toml").write_text(
        '[run.model]\nname = "sonnet"\nfallbacks = ["gpt-5.4"]\n'
    )
    runs.server.script_for("anthropic", quota_exhausted())
    runs.server.script_for("responses", Reply(text="Answered by the fallback."))
    events = runs.run("failover", ', prompt="Answer"')
    [failover] = _of(events, "agent.failover")
    assert (failover["from_provider"], failover["to_provider"]) == ("anthropic", "openai")
    (runs.repo / ".fabro" / "project.toml").unlink()


def _refused_agent(runs: Runs) -> None:
    runs.server.script(unauthorized())
    events = runs.run("refused", ', model="sonnet", prompt="Answer"', status=1)
    [error] = _of(events, "agent.error")
    assert error["error"]["kind"] == "authentication"


def test_every_agent_event_is_emitted_by_a_real_run(repo: Path, llm_server: LlmServer) -> None:
    runs = Runs(repo, llm_server)
    _working_agent(runs)
    _looping_agent(runs)
    _turn_limited_agent(runs)
    _compacting_agent(runs)
    _failing_over_agent(runs)
    _refused_agent(runs)
    expected = _expected()
    assert len(expected) == 25
    assert set(runs.emitted) == expected, sorted(set(runs.emitted) ^ expected)
