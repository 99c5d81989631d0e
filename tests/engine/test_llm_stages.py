"""Prompt and agent stages on real providers, end to end: `git fabro run` with the real
SDKs, talking to the local wire-format server through the `*_BASE_URL` variables.

Every event of every run here is checked against the events contract.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

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
    Reply,
    Stall,
    ToolUse,
    quota_exhausted,
    server_error,
)

ROUTED = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    review [shape=tab, prompt="Review {{ goal }}"%s]
    fix [shape=parallelogram, script="echo fixed > fixed"]
    start -> review
    review -> fix [label="Fix"]
    review -> exit [label="Approve"]
    fix -> exit
}
"""

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, permissions="full", prompt="Tidy the notes"]
    start -> work -> exit
}
"""


# Anthropic's and Gemini's routed prompts: tests/engine/test_llm_provider_matrix.py.
@pytest.mark.parametrize(("model", "api"), [("gpt-5.4", "responses")])
def test_a_prompt_reply_routes_the_run(
    repo: Path, llm_server: LlmServer, model: str, api: str
) -> None:
    write_workflow(repo, ROUTED % f', model="{model}", reasoning_effort="low", max_tokens=900')
    llm_server.script(
        Reply(
            text='Needs work. {"preferred_next_label": "fix", "context_updates": {"score": 40}}',
            input_tokens=30,
            output_tokens=9,
        )
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "the patch", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:fixed") == "fixed\n"

    [request] = llm_server.requests
    assert request.api == api and request.body["model"] == model
    sent = json.dumps(request.body)
    assert "Review the patch" in sent and "Goal: the patch" in sent
    assert "tools" not in request.body or not request.body["tools"]

    assert "Review the patch" in meta_file(repo, run_id, "nodes/review/prompt.md")
    assert "preferred_next_label" in meta_file(repo, run_id, "nodes/review/response.md")
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["context_values"]["score"] == 40
    assert checkpoint["context_values"]["last_stage"] == "review"

    events = run_events(run_id, repo)
    names = [event["event"] for event in events]
    for name in ("stage.prompt", "agent.output.start", "agent.text.delta", "agent.message"):
        assert name in names
    [completed] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "review"]
    usage = completed["properties"]["usage"]
    assert usage["model"] == model
    assert (usage["input_tokens"], usage["output_tokens"]) == (30, 9)
    assert usage["cost"] > 0
    assert completed["properties"]["preferred_label"] == "fix"
    deltas = "".join(
        e["properties"]["delta"]
        for e in events_named(events, "agent.text.delta")
        if e["node_id"] == "review"
    )
    assert "preferred_next_label" in deltas


def test_an_agent_reads_edits_and_creates_files(repo: Path, llm_server: LlmServer) -> None:
    (repo / "notes.txt").write_text("alpha\nbeta\n")
    git(repo, "add", "notes.txt")
    write_workflow(repo, AGENT.replace('prompt="Tidy', 'model="sonnet", prompt="Tidy'))
    llm_server.script(
        Reply(text="Reading.", tool_calls=(ToolUse("read_file", {"path": "notes.txt"}, id="t1"),)),
        Reply(
            text="Editing.",
            tool_calls=(
                ToolUse(
                    "edit_file",
                    {"path": "notes.txt", "old_string": "beta", "new_string": "BETA"},
                    id="t2",
                ),
                ToolUse("write_file", {"path": "src/new.txt", "content": "fresh\n"}, id="t3"),
            ),
        ),
        Reply(text="Done: notes tidied.", input_tokens=40, output_tokens=6),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "tidy", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:notes.txt") == "alpha\nBETA\n"
    assert git(repo, "show", f"fabro/run/{run_id}:src/new.txt") == "fresh\n"
    assert len(llm_server.requests) == 3
    # The model read the file through the tool: its content went back in the next request.
    assert "alpha" in json.dumps(llm_server.requests[1].body["messages"])

    assert meta_file(repo, run_id, "nodes/work/response.md") == "Done: notes tidied."
    status = json.loads(meta_file(repo, run_id, "nodes/work/status.json"))
    assert sorted(status["files_touched"]) == ["notes.txt", "src/new.txt"]

    events = run_events(run_id, repo)
    started = events_named(events, "agent.session.started")
    assert len(started) == 1 and "node_id" not in started[0]
    session = started[0]["session_id"]
    tools = events_named(events, "agent.tool.completed")
    assert len(tools) == 3 and {e["session_id"] for e in tools} == {session}
    assert {e["node_id"] for e in tools} == {"work"}
    [completed] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "work"]
    assert sorted(completed["properties"]["files_touched"]) == ["notes.txt", "src/new.txt"]
    usage = completed["properties"]["usage"]
    assert usage["model"] == "claude-sonnet-4-6"
    assert usage["input_tokens"] == 12 + 12 + 40 and usage["output_tokens"] == 5 + 5 + 6


def test_every_agent_event_of_a_prompt_stage_names_its_session(
    repo: Path, llm_server: LlmServer
) -> None:
    """A prompt stage's one model call is an agent session: started and ended around the
    call, and every agent event between (a retry, reasoning, text, the message) carries
    its session_id."""
    write_workflow(repo, ROUTED % ', model="claude-sonnet-4-6"')
    llm_server.script(
        server_error(retry_after=0),
        Reply(reasoning="weigh it", text='{"preferred_next_label": "approve"}'),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = [e for e in run_events(result["run_id"], repo) if e["event"].startswith("agent.")]
    names = {e["event"] for e in events}
    assert {"agent.llm.retry", "agent.reasoning.delta", "agent.text.delta"} <= names
    assert {"agent.output.start", "agent.message"} <= names
    assert [e for e in events if not e.get("session_id")] == []
    assert len({e["session_id"] for e in events}) == 1
    assert events[0]["event"] == "agent.session.started"
    assert events[-1]["event"] == "agent.session.ended"
    staged = [
        e for e in events if e["event"] not in ("agent.session.started", "agent.session.ended")
    ]
    assert all(e["node_id"] == "review" and e["stage_id"] == "review@1" for e in staged)


def test_an_unknown_model_is_refused_with_the_closest_names(repo: Path) -> None:
    write_workflow(repo, ROUTED % ', model="claude-sonet-4-6"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "wf.fabro:4" in proc.stderr and "claude-sonet-4-6" in proc.stderr
    assert "did you mean claude-sonnet-4-6" in proc.stderr
    assert "refs/fabro" not in git(repo, "for-each-ref")


def test_dry_run_resolves_nothing(repo: Path) -> None:
    write_workflow(repo, ROUTED % ', model="no-such-model"')
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "[dry-run]" in meta_file(repo, result["run_id"], "nodes/review/response.md")


def test_backend_cli_without_its_cli_is_refused_before_the_run(
    repo: Path, llm_server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PATH",
        os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "claude").exists()
        ),
    )
    write_workflow(repo, AGENT.replace('prompt="Tidy', 'backend="cli", prompt="Tidy'))
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "'work'" in proc.stderr and "backend=cli" in proc.stderr
    assert "'claude'" in proc.stderr and "not installed" in proc.stderr
    assert llm_server.requests == []
    assert git(repo, "for-each-ref", "refs/fabro") == ""  # refused before the run existed


def test_a_timeout_cancels_the_model_call(repo: Path, llm_server: LlmServer) -> None:
    # The model never answers: whatever the stage has reached when its second is up,
    # the timeout is what ends it. What the agent touched before it, and the session's
    # closing events, are shown in process (inprocess/test_timeouts_inprocess.py).
    write_workflow(repo, AGENT.replace('prompt="Tidy', 'timeout="1s", prompt="Tidy'))
    llm_server.script(Stall(seconds=120))
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo, timeout=50)
    assert proc.returncode != 0
    events = run_events(result["run_id"], repo)
    [completed] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "work"]
    props = completed["properties"]
    assert props["status"] == "failed" and props["failure_class"] == "transient_infra"
    assert "timed out after 1s" in props["error"]


TWO_PROMPTS = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    first [shape=tab, prompt="One"]
    second [shape=tab, model="gpt-5.4", prompt="Two"]
    start -> first -> second -> exit
}
"""


def _project_model(repo: Path, toml: str) -> None:
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text(toml)
    git(repo, "add", ".fabro")


def test_the_node_then_the_flags_then_the_run_config_choose_the_model(
    repo: Path, llm_server: LlmServer
) -> None:
    _project_model(repo, '[run.model]\nname = "gemini-3.1-pro-preview"\n')
    write_workflow(repo, TWO_PROMPTS)
    proc, _ = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert [r.body["model"] for r in llm_server.requests] == ["gemini-3.1-pro-preview", "gpt-5.4"]

    llm_server.requests.clear()
    proc, _ = run_json("run", "wf.fabro", "--goal", "g", "--model", "sonnet", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert [r.body["model"] for r in llm_server.requests] == ["claude-sonnet-4-6", "gpt-5.4"]


def test_a_bad_reasoning_effort_or_fallback_is_refused_before_the_run(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, ROUTED % ', reasoning_effort="extreme"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "wf.fabro:4" in proc.stderr and "reasoning_effort='extreme'" in proc.stderr

    _project_model(repo, '[run.model]\nfallbacks = ["antropic"]\n')
    write_workflow(repo, ROUTED % "", name="ok.fabro")
    proc = run_fabro("run", "ok.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "fallbacks" in proc.stderr and "did you mean anthropic" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert llm_server.requests == []
    assert "refs/fabro" not in git(repo, "for-each-ref")


def test_an_agent_that_failed_over_reports_the_fallbacks_usage(
    repo: Path, llm_server: LlmServer
) -> None:
    _project_model(repo, '[run.model]\nname = "gpt-5.4"\nfallbacks = ["anthropic"]\n')
    write_workflow(repo, AGENT)
    llm_server.script_for("responses", quota_exhausted())
    llm_server.script_for("anthropic", Reply(text="Done.", input_tokens=7, output_tokens=3))
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    [completed] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "work"]
    usage = completed["properties"]["usage"]
    assert usage["model"] == "claude-sonnet-4-6"
    assert (usage["input_tokens"], usage["output_tokens"]) == (7, 3)


def test_steering_reaches_the_agent_in_flight(
    repo: Path, llm_server: LlmServer, hermetic_env: Path
) -> None:
    """`git fabro steer` while the agent's shell tool holds: the text is in the next
    request the model gets, and `agent.steering.injected` records it."""
    write_workflow(repo, AGENT.replace('prompt="Tidy', 'model="sonnet", prompt="Tidy'))
    wait = 'touch "$HOME/holding"; while [ ! -e "$HOME/go" ]; do sleep 0.02; done'
    llm_server.script(
        Reply(text="Waiting.", tool_calls=(ToolUse("shell", {"command": wait}, id="t1"),)),
        Reply(text="Done, the other way."),
    )
    proc = start_fabro(
        ["run", "wf.fabro", "--json"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until((hermetic_env / "holding").exists, process=proc, limit=120, what="the hold")
        run_id = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])["run_id"]
        steered = run_fabro("steer", run_id, "use the other approach", cwd=repo)
        assert steered.returncode == 0, steered.stderr
        assert "takes it before its next turn" in steered.stderr
    finally:
        (hermetic_env / "go").write_text("")
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert len(llm_server.requests) == 2
    assert "use the other approach" in json.dumps(llm_server.requests[1].body)
    events = run_events(run_id, repo)
    assert [e["properties"]["text"] for e in events_named(events, "run.steer")] == [
        "use the other approach"
    ]
    [injected] = events_named(events, "agent.steering.injected")
    assert injected["properties"]["text"] == "use the other approach"
    assert injected["node_id"] == "work"


def test_the_runs_cost_is_summed_and_shown(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, ROUTED % ', model="claude-sonnet-4-6"')
    llm_server.script(
        Reply(text='{"preferred_next_label": "approve"}', input_tokens=1000, output_tokens=500)
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "the patch", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    [stage] = [e for e in events_named(events, "stage.completed") if e["node_id"] == "review"]
    cost = stage["properties"]["usage"]["cost"]
    assert cost > 0
    [done] = events_named(events, "run.completed")
    assert done["properties"]["total_cost"] == pytest.approx(cost)
    row = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])
    assert row["total_cost"] == pytest.approx(cost)
    table = run_fabro("ps", cwd=repo).stdout.splitlines()
    shown = f"${cost:,.2f}" if cost >= 1 else f"${cost:.4f}"  # one format everywhere
    assert table[0].split()[-1] == "COST" and table[1].endswith(shown)
    assert f"cost       {shown}" in run_fabro("inspect", run_id, cwd=repo).stdout
