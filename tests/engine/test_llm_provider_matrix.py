"""Each LLM-stage scenario on each wire format, end to end through `git fabro run`.

The three formats the local server speaks stand for the providers: Anthropic Messages
(`anthropic`), OpenAI Responses (`openai`) and Chat Completions (`gemini`, through its
OpenAI-compatible endpoint). The scenarios: an agent that reads, edits and creates
files; a prompt whose reply routes the graph; a transient failure retried, then success;
failover to another provider; a missing and a rejected key; a CLI-agent stage; Ctrl-C
mid-stream, then resume. An OpenAI-compatible server named by its base URL (Ollama) runs
an agent too. Every event of every run is checked against the events contract.

Each scenario runs through the real command for one or two providers, different ones
from scenario to scenario, so each provider still runs end to end several times; what
differs between providers (each wire format, reasoning and signature round trips, retry
classification, key variables) is checked for every provider in process, through the
real SDKs (tests/llm/, tests/agent/), where it costs a fraction of a `git fabro run`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
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
    Drop,
    Fault,
    Held,
    LlmServer,
    Reply,
    StallMidStream,
    StreamError,
    ToolUse,
    quota_exhausted,
    rate_limited,
    server_error,
    unauthorized,
)

from engine.test_cli_agents import FAKE_AGENT, _calls, _plan


@dataclass(frozen=True)
class Provider:
    name: str
    model: str  # a catalogue model of this provider
    api: str  # the protocol the local server sees
    key_vars: tuple[str, ...]
    cli: str  # the agent CLI of its built-in profile
    edit_tool: str
    # SSE events the server sends before two words of a reply's text are out, and
    # `other`, a provider to fail over to.
    two_words_in: int
    other: str
    # SSE events before the first half of a lone tool call's arguments is out.
    half_a_call_in: int = 4
    # Gemini 3 signs each tool call and refuses one sent back without its signature.
    signs_calls: bool = False


PROVIDERS = [
    Provider(
        "anthropic",
        "claude-sonnet-4-6",
        "anthropic",
        ("ANTHROPIC_API_KEY",),
        "claude",
        "edit_file",
        two_words_in=5,  # message_start, ping, content_block_start, 2 deltas
        other="openai",
    ),
    Provider(
        "openai",
        "gpt-5.4",
        "responses",
        ("OPENAI_API_KEY",),
        "codex",
        "apply_patch",
        two_words_in=6,  # created, in_progress, item added, part added, 2 deltas
        other="anthropic",
    ),
    Provider(
        "gemini",
        "gemini-3-flash-preview",
        "chat",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        "gemini",
        "edit_file",
        two_words_in=3,  # the role chunk, 2 deltas
        other="openai",
        half_a_call_in=3,  # the role chunk, the call's opening, half its arguments
        signs_calls=True,
    ),
]
BY_NAME = {p.name: p for p in PROVIDERS}


def providers(*names: str) -> pytest.MarkDecorator:
    """Runs a test for the providers named: a scenario whose per-provider facts (a
    request's wire format, a reasoning or signature round trip, a key's variable) are
    checked in process (tests/llm/, tests/agent/) runs end to end for one or two, a
    different one from scenario to scenario so each provider still runs through the
    real command several times."""
    return pytest.mark.parametrize("p", [BY_NAME[name] for name in names], ids=names)


# The catalogue's default model of each provider, which a bare provider fallback gets.
DEFAULT_MODEL = {
    "anthropic": "claude-sonnet-4-6",
    "openai": "gpt-5.4",
    "gemini": "gemini-3-flash-preview",
}
API_OF = {p.name: p.api for p in PROVIDERS}

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
    work [shape=box, permissions="full", prompt="Tidy the notes"%s]
    start -> work -> exit
}
"""

FIX = '{"preferred_next_label": "fix"}'
APPROVE = '{"preferred_next_label": "approve"}'


def _project_model(repo: Path, toml: str) -> None:
    (repo / ".fabro").mkdir(exist_ok=True)
    (repo / ".fabro" / "project.toml").write_text(toml)
    git(repo, "add", ".fabro")
    git(repo, "commit", "-q", "-m", "project config")


@pytest.fixture
def agent_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake agent CLI of `test_cli_agents` on PATH as `claude`, `codex` and `gemini`."""
    bindir = tmp_path / "agent-bin"
    bindir.mkdir()
    script = bindir / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    for name in ("claude", "codex", "gemini"):
        launcher = bindir / name
        launcher.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"sys.argv[0] = {name!r}\n"
            f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))\n"
        )
        launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    return bindir


# ------------------------------------------------------------------------ agent tools


def _call(p: Provider, name: str, arguments: dict, id: str) -> ToolUse:
    """A tool call as `p`'s models make it (signed, for Gemini 3)."""
    return ToolUse(name, arguments, id=id, thought_signature=f"sig-{id}" if p.signs_calls else None)


def _edit_call(p: Provider) -> ToolUse:
    if p.edit_tool == "apply_patch":
        patch = "\n".join(
            [
                "*** Begin Patch",
                "*** Update File: notes.txt",
                "@@",
                " alpha",
                "-beta",
                "+BETA",
                "*** End Patch",
            ]
        )
        return _call(p, "apply_patch", {"patch": patch}, id="t2")
    return _call(
        p, "edit_file", {"path": "notes.txt", "old_string": "beta", "new_string": "BETA"}, id="t2"
    )


def _tool_names(p: Provider, body: dict) -> set[str]:
    if p.api == "anthropic":
        return {tool["name"] for tool in body["tools"]}
    if p.api == "responses":
        return {tool["name"] for tool in body["tools"]}
    return {tool["function"]["name"] for tool in body["tools"]}


# Anthropic's agent runs end to end in tests/engine/test_llm_stages.py; Gemini's signed
# calls go back through the real command in the mid-tool-call retry below, and its agent
# edits in process (tests/agent/test_agent_loop.py).
@providers("openai")
def test_an_agent_reads_edits_and_creates_files(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    (repo / "notes.txt").write_text("alpha\nbeta\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "notes")
    write_workflow(repo, AGENT % f', model="{p.model}"')
    llm_server.script(
        Reply(text="Reading.", tool_calls=(_call(p, "read_file", {"path": "notes.txt"}, "t1"),)),
        Reply(
            text="Editing.",
            tool_calls=(
                _edit_call(p),
                _call(p, "write_file", {"path": "src/new.txt", "content": "fresh\n"}, "t3"),
            ),
        ),
        Reply(text="Done: notes tidied.", input_tokens=40, output_tokens=6),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "tidy", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:notes.txt") == "alpha\nBETA\n"
    assert git(repo, "show", f"fabro/run/{run_id}:src/new.txt") == "fresh\n"
    assert git(repo, "show", "main:notes.txt") == "alpha\nbeta\n"

    assert [(r.api, r.body["model"]) for r in llm_server.requests] == [(p.api, p.model)] * 3
    # Each provider's own key went with its requests.
    keys = {r.headers.get("x-api-key") or r.headers["authorization"] for r in llm_server.requests}
    assert {key.removeprefix("Bearer ") for key in keys} == {f"test-{p.name}-key"}
    offered = _tool_names(p, llm_server.requests[0].body)
    assert {"read_file", "write_file", p.edit_tool} <= offered
    # The file's content went back to the model as the read_file result.
    assert "alpha" in json.dumps(llm_server.requests[1].body)
    assert "alpha" not in json.dumps(llm_server.requests[0].body)
    # Each call went back with the result it got, paired by its id.
    assert [call for call, _ in _tool_rounds(p.api, llm_server.requests[2].body)] == [
        "t1",
        "t2",
        "t3",
    ]

    assert meta_file(repo, run_id, "nodes/work/response.md") == "Done: notes tidied."
    events = run_events(run_id, repo)
    tools = events_named(events, "agent.tool.completed", "work")
    assert [(e["properties"]["tool_name"], e["properties"]["is_error"]) for e in tools] == [
        ("read_file", False),
        (p.edit_tool, False),
        ("write_file", False),
    ]
    [completed] = events_named(events, "stage.completed", "work")
    props = completed["properties"]
    assert props["status"] == "succeeded"
    assert sorted(props["files_touched"]) == ["notes.txt", "src/new.txt"]
    assert props["usage"]["model"] == p.model
    assert (props["usage"]["input_tokens"], props["usage"]["output_tokens"]) == (64, 16)
    assert props["usage"]["cost"] > 0


# ------------------------------------------------------------------------ prompt routing


# Each provider's request and usage are checked in process (tests/llm/test_llm_providers.py).
ROUTES = [("anthropic", "fix", True), ("gemini", "approve", False)]


@pytest.mark.parametrize(
    ("p", "label", "ran"),
    [(BY_NAME[name], label, ran) for name, label, ran in ROUTES],
    ids=[f"{name}-{label}" for name, label, _ in ROUTES],
)
def test_a_prompt_reply_routes_the_run(
    repo: Path, llm_server: LlmServer, p: Provider, label: str, ran: bool
) -> None:
    write_workflow(repo, ROUTED % f', model="{p.model}"')
    reply = f'Verdict. {{"preferred_next_label": "{label}", "context_updates": {{"score": 7}}}}'
    llm_server.script(Reply(text=reply, input_tokens=30, output_tokens=9))
    proc, result = run_json("run", "wf.fabro", "--goal", "the patch", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    tree = git(repo, "ls-tree", "--name-only", f"fabro/run/{run_id}").split()
    assert ("fixed" in tree) is ran

    [request] = llm_server.requests
    assert (request.api, request.body["model"]) == (p.api, p.model)
    assert "Review the patch" in json.dumps(request.body)
    assert not request.body.get("tools")  # a prompt node offers no tools

    assert meta_file(repo, run_id, "nodes/review/response.md") == reply
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["context_values"]["score"] == 7
    events = run_events(run_id, repo)
    [completed] = events_named(events, "stage.completed", "review")
    assert completed["properties"]["preferred_label"] == label
    usage = completed["properties"]["usage"]
    assert usage["model"] == p.model
    assert (usage["input_tokens"], usage["output_tokens"]) == (30, 9)
    assert [e["node_id"] for e in events_named(events, "stage.completed")] == (
        ["start", "review", "fix", "exit"] if ran else ["start", "review", "exit"]
    )
    deltas = "".join(
        e["properties"]["delta"] for e in events_named(events, "agent.text.delta", "review")
    )
    assert deltas == reply


def _effort_sent(p: Provider, body: dict) -> object:
    if p.api == "anthropic":
        return body["thinking"]["type"], body["max_tokens"] > 900
    if p.api == "responses":
        return body["reasoning"]["effort"], body["max_output_tokens"]
    return body["reasoning_effort"], body["max_tokens"]


EFFORT_SENT = {
    "anthropic": ("enabled", True),  # a thinking budget on top of max_tokens
    "openai": ("high", 900),
    "gemini": ("high", 900),
}


# Each provider's effort and allowance fields: test_a_reply_allowance_and_effort_reach_each_wire.
@providers("openai")
def test_a_prompts_reasoning_effort_reaches_the_wire_and_its_reasoning_is_recorded(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    write_workflow(repo, ROUTED % f', model="{p.model}", reasoning_effort="high", max_tokens=900')
    llm_server.script(
        Reply(
            text=APPROVE,
            reasoning="weighing the patch carefully",
            output_tokens=20,
            reasoning_tokens=8,
        )
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [request] = llm_server.requests
    assert _effort_sent(p, request.body) == EFFORT_SENT[p.name]
    events = run_events(result["run_id"], repo)
    thought = "".join(
        e["properties"]["delta"] for e in events_named(events, "agent.reasoning.delta", "review")
    )
    assert thought == "weighing the patch carefully"
    # The reasoning is not the answer: routing read the text alone.
    [completed] = events_named(events, "stage.completed", "review")
    assert completed["properties"]["preferred_label"] == "approve"
    assert meta_file(repo, result["run_id"], "nodes/review/response.md") == APPROVE


# Anthropic's is the API that needs its thinking back (signed, before the call); the
# others' tool rounds are checked in process (test_tool_call_round_trip).
@providers("anthropic")
def test_an_agent_thinking_before_a_tool_call_sends_its_reasoning_back_as_its_api_needs(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    write_workflow(repo, AGENT % f', model="{p.model}", reasoning_effort="low"')
    llm_server.script(
        Reply(
            text="",
            reasoning="first look at the file",
            tool_calls=(_call(p, "read_file", {"path": "README.md"}, "r1"),),
        ),
        Reply(text="Looked."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    follow_up = llm_server.requests[1].body
    if p.api == "anthropic":
        # With thinking on, the tool round's assistant turn must open with its thinking
        # block, signature and all.
        [turn] = [m for m in follow_up["messages"] if m["role"] == "assistant"]
        assert turn["content"][0] == {
            "type": "thinking",
            "thinking": "first look at the file",
            "signature": "sig_1",
        }
        assert turn["content"][-1]["type"] == "tool_use"
    [(call, output)] = _tool_rounds(p.api, follow_up)
    assert call == "r1" and "hello" in output
    events = run_events(result["run_id"], repo)
    thought = "".join(
        e["properties"]["delta"] for e in events_named(events, "agent.reasoning.delta", "work")
    )
    assert thought == "first look at the file"


# ------------------------------------------------------------------------ retry


def _fault(kind: str, p: Provider) -> Fault | Drop | StreamError:
    # An HTTP error says when to come back (0: no real backoff is waited; the backoff
    # is tested on a MockClock, tests/llm/test_llm_retries.py).
    if kind == "rate_limited":
        return rate_limited(retry_after=0)
    if kind == "server_error":
        return server_error(retry_after=0)
    cut = Reply(text="half an answer that will not end well")
    if kind == "stream_dropped":
        return Drop(reply=cut, after=p.two_words_in)
    return StreamError(reply=cut, after=p.two_words_in)


# A cut stream says nothing of when to come back: the run waits its first backoff,
# 10 ms here (jittered by half either way).
QUICK_RETRIES = '[run.agent]\nrequest_retry_delay = "10ms"\n'

# What each fault is classified as, in `agent.llm.retry`.
FAULTS = {
    "rate_limited": "rate_limited",
    "server_error": "server_error",
    "stream_dropped": "stream_dropped",
    "stream_error": "server_error",
}


# Each fault once and each provider's stream cut once, through the real command: every
# fault of every provider is classified in process (tests/llm/test_llm_retries.py).
RETRIED = [
    ("stream_dropped", "anthropic"),
    ("stream_dropped", "openai"),
    ("stream_dropped", "gemini"),
    ("stream_error", "anthropic"),
    ("rate_limited", "openai"),
    ("server_error", "gemini"),
]


@pytest.mark.parametrize(
    ("fault", "p"), [(fault, BY_NAME[name]) for fault, name in RETRIED], ids=map("-".join, RETRIED)
)
def test_a_transient_failure_is_retried_and_the_stage_succeeds(
    repo: Path, llm_server: LlmServer, p: Provider, fault: str
) -> None:
    write_workflow(repo, ROUTED % f', model="{p.model}"')
    _project_model(repo, QUICK_RETRIES)
    llm_server.script(_fault(fault, p), Reply(text=f"Second time lucky. {FIX}"))
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert [(r.api, r.body["model"]) for r in llm_server.requests] == [(p.api, p.model)] * 2
    assert git(repo, "show", f"fabro/run/{run_id}:fixed") == "fixed\n"
    assert meta_file(repo, run_id, "nodes/review/response.md") == f"Second time lucky. {FIX}"

    events = run_events(run_id, repo)
    [retry] = events_named(events, "agent.llm.retry", "review")
    props = retry["properties"]
    assert (props["provider"], props["model"], props["attempt"]) == (p.name, p.model, 2)
    assert props["error"]["kind"] == FAULTS[fault]
    assert props["error"]["retryable"] is True
    if fault in ("rate_limited", "server_error"):
        assert props["delay_secs"] == 0  # the server's Retry-After, honoured
    else:
        assert 0.005 <= props["delay_secs"] <= 0.015  # `request_retry_delay`
    [message] = events_named(events, "agent.message", "review")
    assert message["properties"]["text"] == f"Second time lucky. {FIX}"
    if fault.startswith("stream_"):
        # Two words were streamed before the cut: the retry voided them.
        names = [e["event"] for e in events if e.get("node_id") == "review"]
        replaced = names.index("agent.output.replace")
        assert "agent.text.delta" in names[:replaced]
        assert names.index("agent.llm.retry") > replaced
    else:
        assert not events_named(events, "agent.output.replace")


# Each provider's stream cut mid-call is retried whole in process
# (tests/llm/test_llm_retries.py::test_a_stream_dropped_mid_tool_call_is_retried_...).
@providers("openai", "gemini")
def test_an_agent_turn_cut_mid_tool_call_is_retried_and_the_tool_runs_once(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    write_workflow(repo, AGENT % f', model="{p.model}"')
    _project_model(repo, QUICK_RETRIES)
    append = _call(p, "shell", {"command": "echo once >> ran.txt"}, "s1")
    llm_server.script(
        Drop(reply=Reply(text="", tool_calls=(append,)), after=p.half_a_call_in),
        Reply(text="", tool_calls=(append,)),
        Reply(text="Ran it."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert len(llm_server.requests) == 3
    # The retried turn sent the same conversation: nothing of the cut call in it.
    assert llm_server.requests[1].body == llm_server.requests[0].body
    assert git(repo, "show", f"fabro/run/{run_id}:ran.txt") == "once\n"
    events = run_events(run_id, repo)
    [retry] = events_named(events, "agent.llm.retry", "work")
    assert retry["properties"]["error"]["kind"] == "stream_dropped"
    assert [
        e["properties"]["tool_name"] for e in events_named(events, "agent.tool.started", "work")
    ] == ["shell"]
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Ran it."


# ------------------------------------------------------------------------ failover


# Each provider's quota error fails over mid-conversation below; classified in process
# (tests/llm/test_llm_retries.py).
@providers("openai")
def test_a_spent_quota_fails_over_to_the_other_provider(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    other = BY_NAME[p.other]
    _project_model(repo, f'[run.model]\nname = "{p.model}"\nfallbacks = ["{other.name}"]\n')
    write_workflow(repo, ROUTED % "")
    llm_server.script_for(p.api, quota_exhausted())
    llm_server.script_for(other.api, Reply(text=f"From the fallback. {FIX}"))
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    # A spent quota is not retried: one request to each.
    assert [(r.api, r.body["model"]) for r in llm_server.requests] == [
        (p.api, p.model),
        (other.api, DEFAULT_MODEL[other.name]),
    ]
    assert git(repo, "show", f"fabro/run/{run_id}:fixed") == "fixed\n"
    events = run_events(run_id, repo)
    [failover] = events_named(events, "agent.failover", "review")
    props = failover["properties"]
    assert (props["from_provider"], props["from_model"]) == (p.name, p.model)
    assert (props["to_provider"], props["to_model"]) == (other.name, DEFAULT_MODEL[other.name])
    assert "quota" in props["error"]
    assert not events_named(events, "agent.llm.retry")
    [completed] = events_named(events, "stage.completed", "review")
    assert completed["properties"]["usage"]["model"] == DEFAULT_MODEL[other.name]


def _tool_rounds(api: str, body: dict) -> list[tuple[str, str]]:
    """(call id, result text) of each tool call a request sends back, in order; a call
    without a matching result after it, or a result without its call, fails."""
    calls: list[str] = []
    results: dict[str, str] = {}
    if api == "anthropic":
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block["type"] == "tool_use":
                    calls.append(block["id"])
                elif block["type"] == "tool_result":
                    assert block["tool_use_id"] in calls
                    results[block["tool_use_id"]] = block["content"]
    elif api == "responses":
        for item in body["input"]:
            if item.get("type") == "function_call":
                calls.append(item["call_id"])
            elif item.get("type") == "function_call_output":
                assert item["call_id"] in calls
                results[item["call_id"]] = item["output"]
    else:
        for message in body["messages"]:
            calls += [call["id"] for call in message.get("tool_calls") or []]
            if message["role"] == "tool":
                assert message["tool_call_id"] in calls
                results[message["tool_call_id"]] = message["content"]
    assert sorted(calls) == sorted(results)
    return [(call, results[call]) for call in calls]


@pytest.mark.parametrize(
    ("first", "then"),
    [("anthropic", "gemini"), ("gemini", "openai")],
    ids=["anthropic-to-gemini", "gemini-to-openai"],
)
def test_an_agent_fails_over_mid_conversation_with_its_tool_history(
    repo: Path, llm_server: LlmServer, first: str, then: str
) -> None:
    p, other = BY_NAME[first], BY_NAME[then]
    (repo / "notes.txt").write_text("alpha\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "notes")
    _project_model(repo, f'[run.model]\nname = "{p.model}"\nfallbacks = ["{other.model}"]\n')
    write_workflow(repo, AGENT % "")
    llm_server.script_for(
        p.api,
        Reply(text="Reading.", tool_calls=(_call(p, "read_file", {"path": "notes.txt"}, "r1"),)),
        quota_exhausted(),
    )
    llm_server.script_for(
        other.api,
        Reply(
            text="",
            tool_calls=(_call(other, "write_file", {"path": "b.txt", "content": "b\n"}, "w1"),),
        ),
        Reply(text="Finished on the fallback."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    # The session stays on the fallback: a spent quota is not tried again each turn.
    assert [(r.api, r.body["model"]) for r in llm_server.requests] == [
        (p.api, p.model),
        (p.api, p.model),
        (other.api, other.model),
        (other.api, other.model),
    ]
    # The fallback got the first provider's tool round in its own format.
    [(call, output)] = _tool_rounds(other.api, llm_server.requests[2].body)
    assert call == "r1" and "alpha" in output
    if other.signs_calls:
        # A call Gemini did not make goes back with the documented stand-in signature.
        [turn] = [m for m in llm_server.requests[2].body["messages"] if m.get("tool_calls")]
        signature = turn["tool_calls"][0]["extra_content"]["google"]["thought_signature"]
        assert signature == "skip_thought_signature_validator"
    assert git(repo, "show", f"fabro/run/{run_id}:b.txt") == "b\n"
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Finished on the fallback."
    events = run_events(run_id, repo)
    [failover] = events_named(events, "agent.failover", "work")
    props = failover["properties"]
    assert (props["from_provider"], props["to_provider"]) == (p.name, other.name)
    tools = events_named(events, "agent.tool.completed", "work")
    assert [(e["properties"]["tool_name"], e["properties"]["is_error"]) for e in tools] == [
        ("read_file", False),
        ("write_file", False),
    ]


# ------------------------------------------------------------------------ keys


# Each provider's variables are named in process (tests/llm/test_llm_retries.py).
@providers("gemini")
def test_a_missing_key_is_refused_before_the_run_naming_its_variable(
    repo: Path, llm_server: LlmServer, monkeypatch: pytest.MonkeyPatch, p: Provider
) -> None:
    for var in p.key_vars:
        monkeypatch.delenv(var, raising=False)
    write_workflow(repo, ROUTED % f', model="{p.model}"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"set {' or '.join(p.key_vars)}" in proc.stderr
    # Only this provider's variables: the others are set.
    for other in PROVIDERS:
        if other is not p:
            assert not any(var in proc.stderr for var in other.key_vars)
    assert "the LLM stages review call" in proc.stderr and "Using a real model" in proc.stderr
    assert llm_server.requests == []
    assert "refs/fabro" not in git(repo, "for-each-ref")


# Each provider's is classified and named in process (tests/llm/test_llm_retries.py).
@providers("anthropic")
def test_a_rejected_key_fails_the_stage_naming_its_variable(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    write_workflow(repo, AGENT % f', model="{p.model}"')
    llm_server.script(unauthorized())
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(llm_server.requests) == 1  # a refused key is neither retried nor failed over
    events = run_events(result["run_id"], repo)
    [completed] = events_named(events, "stage.completed", "work")
    props = completed["properties"]
    assert props["status"] == "failed" and props["failure_class"] == "deterministic"
    assert "Incorrect API key provided" in props["error"]
    assert p.key_vars[0] in props["error"]


def test_gemini_takes_google_api_key_when_gemini_api_key_is_unset(
    repo: Path, llm_server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.setenv("GOOGLE_API_KEY", "test-google-key")
    write_workflow(repo, ROUTED % ', model="gemini-flash"')
    llm_server.script(Reply(text=APPROVE))
    proc, _ = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [request] = llm_server.requests
    assert request.body["model"] == "gemini-3-flash-preview"
    assert request.path.startswith("/v1beta/openai/")
    assert request.headers["authorization"] == "Bearer test-google-key"


# ------------------------------------------------------------------------ CLI agents


# Each profile's CLI runs end to end in tests/engine/test_cli_agents.py.
@providers("openai")
def test_a_cli_agent_stage_runs_its_providers_cli(
    repo: Path,
    llm_server: LlmServer,
    agent_clis: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    p: Provider,
) -> None:
    (repo / "notes.txt").write_text("alpha\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "notes")
    workflow = ROUTED.replace(
        'shape=tab, prompt="Review', 'shape=box, backend="cli", prompt="Review'
    )
    write_workflow(repo, workflow % f', model="{p.model}"')
    reply = f"Rewrote the notes. {FIX}"
    log = _plan(
        tmp_path, monkeypatch, write={"notes.txt": "ALPHA\n", "new.txt": "n\n"}, reply=reply
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "the notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]

    [call] = _calls(log)
    assert call["name"] == p.cli
    assert call["argv"][call["argv"].index("--model") + 1] == p.model
    assert "Review the notes" in call["prompt"]
    assert llm_server.requests == []  # the CLI, not the API, did the work
    assert git(repo, "show", f"fabro/run/{run_id}:notes.txt") == "ALPHA\n"
    assert git(repo, "show", f"fabro/run/{run_id}:new.txt") == "n\n"
    assert git(repo, "show", f"fabro/run/{run_id}:fixed") == "fixed\n"  # the reply routed
    assert meta_file(repo, run_id, "nodes/review/response.md") == reply
    events = run_events(run_id, repo)
    [completed] = events_named(events, "stage.completed", "review")
    props = completed["properties"]
    assert props["status"] == "succeeded" and props["preferred_label"] == "fix"
    assert props["files_touched"] == ["new.txt", "notes.txt"]
    assert props["usage"]["input_tokens"] > 0


# ------------------------------------------------------------------------ Ctrl-C


def _tail_has_delta(node_id: str, text: str) -> bool:
    for tail in (Path(os.environ["FABRO_HOME"]) / "runs").glob("*/events.jsonl"):
        for line in tail.read_bytes().split(b"\n")[:-1]:
            event = json.loads(line)
            if (
                event["event"] == "agent.text.delta"
                and event.get("node_id") == node_id
                and text in event["properties"]["delta"]
            ):
                return True
    return False


# Each provider's stream cancelled mid-way closes its session in process
# (tests/agent/test_agent_shell.py).
@providers("anthropic")
def test_ctrl_c_mid_stream_then_resume_never_replays_the_half_stream(
    repo: Path, llm_server: LlmServer, monkeypatch: pytest.MonkeyPatch, p: Provider
) -> None:
    write_workflow(repo, AGENT % f', model="{p.model}"')
    half = Reply(text="Halfway words that the interrupt cuts off")
    llm_server.script(
        Reply(text="", tool_calls=(ToolUse("write_file", {"path": "a.txt", "content": "a\n"}),)),
        # Stalled after all seven words, before the reply's end: the bus shows a stream
        # only behind the tail its masker holds (a secret's length), so the first two
        # words are out by then.
        StallMidStream(reply=half, after=p.two_words_in + 5),
    )
    proc = start_fabro(
        ["run", "wf.fabro", "--goal", "g"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Words of the second reply are recorded: the agent is mid-stream.
        wait_until(
            lambda: _tail_has_delta("work", "words"), process=proc, limit=60, what="the words"
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    run_id = re.findall(r"git fabro resume ([0-9A-Z]{26})", err.decode())[-1]
    assert len(llm_server.requests) == 2

    # Resumed without the key, the run is refused before anything runs, naming it.
    for var in p.key_vars:
        monkeypatch.delenv(var, raising=False)
    refused = run_fabro("resume", run_id, cwd=repo)
    assert refused.returncode == 1, refused.stderr
    assert f"set {' or '.join(p.key_vars)}" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(llm_server.requests) == 2
    assert "run.failed" not in [e["event"] for e in run_events(run_id, repo)]
    monkeypatch.setenv(p.key_vars[0], f"test-{p.name}-key")

    llm_server.script(Reply(text="Done after all."))
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    # The stage's attempt started again: one fresh request, without the cut-off text.
    assert len(llm_server.requests) == 3
    assert [r.body["model"] for r in llm_server.requests] == [p.model] * 3
    assert "Halfway" not in json.dumps(llm_server.requests[2].body)
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Done after all."

    events = run_events(run_id, repo)
    work = [e for e in events if e.get("node_id") == "work"]
    cut = next(i for i, e in enumerate(work) if e["event"] == "stage.failed")
    assert work[cut]["properties"]["failure_class"] == "canceled"

    def deltas(part: list[dict]) -> list[str]:
        return [e["properties"]["delta"] for e in part if e["event"] == "agent.text.delta"]

    def messages(part: list[dict]) -> list[str]:
        return [e["properties"]["text"] for e in part if e["event"] == "agent.message"]

    # Before Ctrl-C: the words streamed, recorded once (the masker's held tail let go
    # when the stage was cancelled), no message made of them.
    assert "".join(deltas(work[:cut])) == half.text
    assert messages(work[:cut]) == [""]  # the tool call's turn only
    # The resumed attempt streamed its own reply whole, and nothing of the cut one.
    assert "".join(deltas(work[cut:])) == "Done after all."
    assert messages(work[cut:]) == ["Done after all."]
    # Its worktree started from the checkpoint: the cut attempt's file is gone.
    tree = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
    assert "a.txt" not in tree
    sessions = [e["event"] for e in events if e["event"].startswith("agent.session.")]
    assert (
        sessions
        == [
            "agent.session.started",
            "agent.session.activated",
            "agent.session.deactivated",
            "agent.session.ended",
        ]
        * 2
    )
    [completed] = events_named(events, "stage.completed", "work")
    assert completed["properties"]["status"] == "succeeded"
    [done] = events_named(events, "run.completed")
    assert done["properties"]["status"] == "succeeded"


@providers("openai")
def test_ctrl_c_while_a_request_waits_for_its_headers_stops_the_run_and_resume_sends_it_again(
    repo: Path, llm_server: LlmServer, p: Provider
) -> None:
    write_workflow(repo, AGENT % f', model="{p.model}"')
    gate = threading.Event()
    llm_server.script(Held(gate=gate, reply=Reply(text="Too late.")))
    proc = start_fabro(
        ["run", "wf.fabro", "--goal", "g"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # The request is at the server, which has sent nothing back: no status, no header.
        wait_until(lambda: llm_server.in_flight == 1, process=proc, what="the request held")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        gate.set()  # the server's thread answers a client that has gone
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    run_id = re.findall(r"git fabro resume ([0-9A-Z]{26})", err.decode())[-1]
    assert "run.failed" not in [e["event"] for e in run_events(run_id, repo)]

    llm_server.script(Reply(text="Done after all."))
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    # The held request was sent again, whole, and its late answer never reached the run.
    assert len(llm_server.requests) == 2
    assert llm_server.requests[1].body == llm_server.requests[0].body
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Done after all."
    # The resume records the cut attempt as cancelled before it starts the stage again.
    work = [e for e in run_events(run_id, repo) if e.get("node_id") == "work"]
    assert [e["event"] for e in work if e["event"].startswith("stage.")].count("stage.started") == 2
    [failed] = [e for e in work if e["event"] == "stage.failed"]
    assert failed["properties"]["failure_class"] == "canceled"


# ------------------------------------------------------------------------ by base URL


def test_an_openai_compatible_server_by_base_url_runs_an_agent(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, AGENT % ', provider="ollama", model="qwen3:8b"')
    llm_server.script(
        Reply(text="", tool_calls=(ToolUse("write_file", {"path": "out.txt", "content": "o\n"}),)),
        Reply(text="Wrote it."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert [(r.path, r.body["model"]) for r in llm_server.requests] == [
        ("/ollama/v1/chat/completions", "qwen3:8b")
    ] * 2
    assert git(repo, "show", f"fabro/run/{run_id}:out.txt") == "o\n"
    events = run_events(run_id, repo)
    [completed] = events_named(events, "stage.completed", "work")
    assert completed["properties"]["usage"]["model"] == "qwen3:8b"
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Wrote it."


def test_an_openai_compatible_server_without_its_base_url_is_refused(
    repo: Path, llm_server: LlmServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OLLAMA_BASE_URL")
    write_workflow(repo, AGENT % ', provider="ollama", model="qwen3:8b"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "OLLAMA_BASE_URL" in proc.stderr and "'ollama'" in proc.stderr
    assert llm_server.requests == []
    assert "refs/fabro" not in git(repo, "for-each-ref")
