"""The shipped `plan-implement-review` example, end to end against the local server.

`git fabro run plan-implement-review` with the real SDKs: the plan prompt, the
implement and verify agents (one `coding` thread) that read, edit and create files,
and the review prompt that approves. As shipped, the coding stages run on Anthropic and
the review on OpenAI; a copy whose stylesheet names OpenAI models only runs every stage
on OpenAI (its agents edit with `apply_patch`). Every event passes the contract.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from event_contract.check import check_event
from event_contract.seed import load_contract
from helpers import git, run_events, run_json
from llm_server import LlmServer, Reply, ToolUse

import fabro_git

# Read at import, before the hermetic environment clears them: the opt-in real-provider
# run below uses the caller's own keys.
REAL_KEYS = {
    var: os.environ[var] for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY") if os.environ.get(var)
}
REAL_WANTED = os.environ.get("FABRO_TEST_REAL_MODELS") == "1"
README = Path(__file__).parents[2] / "README.md"
EXAMPLE = Path(fabro_git.__file__).parent / "examples" / "plan-implement-review.fabro"
GOAL = "Make greet say hello to the world and note the change"
APPROVE = 'The diff does what the goal asks. {"preferred_next_label": "Approve"}'
PATCH = "\n".join(
    [
        "*** Begin Patch",
        "*** Update File: greet.py",
        "@@ def greet():",
        '-    return "hello"',
        '+    return "hello, world"',
        "*** End Patch",
    ]
)


def _project(repo: Path) -> None:
    (repo / "greet.py").write_text('def greet():\n    return "hello"\n')
    git(repo, "add", "greet.py")
    git(repo, "commit", "-q", "-m", "a small project")


def _coding_replies(edit: ToolUse) -> list[Reply]:
    return [
        # implement: read, edit, create, answer.
        Reply(text="Reading greet.py.", tool_calls=(ToolUse("read_file", {"path": "greet.py"}),)),
        Reply(text="", tool_calls=(edit,)),
        Reply(
            text="",
            tool_calls=(
                ToolUse("write_file", {"path": "CHANGES.md", "content": "- greet: world\n"}),
            ),
        ),
        Reply(text="Implemented: greet says hello, world; CHANGES.md notes it."),
        # verify, on the same thread: check, then pass.
        Reply(text="", tool_calls=(ToolUse("shell", {"command": "grep -c world greet.py"}),)),
        Reply(text='The check passes. {"outcome": "success"}'),
    ]


def _check_run(repo: Path, run_id: str, server: LlmServer) -> list[dict]:
    run_ref = f"fabro/run/{run_id}"
    assert git(repo, "show", f"{run_ref}:greet.py") == 'def greet():\n    return "hello, world"\n'
    assert git(repo, "show", f"{run_ref}:CHANGES.md") == "- greet: world\n"
    assert git(repo, "show", "main:greet.py") == 'def greet():\n    return "hello"\n'
    events = run_events(run_id, repo)
    catalogue = load_contract()
    assert [p for event in events for p in check_event(event, catalogue)] == []
    stages = [
        e["node_id"]
        for e in events
        if e["event"] == "stage.completed" and e["node_id"] not in ("start", "exit")
    ]
    assert stages == ["plan", "implement", "verify", "review"]
    [done] = [e for e in events if e["event"] == "run.completed"]
    assert done["properties"]["status"] == "succeeded"
    assert done["properties"]["usage"]["total_tokens"] > 0
    # The verify agent carries on the implement agent's conversation (thread "coding").
    verify_first = json.dumps(server.requests[5].body)
    assert "Implemented: greet says hello, world" in verify_first
    assert "Run the project's tests and linters" in verify_first
    return events


def test_the_shipped_example_runs_on_anthropic_with_an_openai_review(
    repo: Path, llm_server: LlmServer
) -> None:
    _project(repo)
    llm_server.script_for("anthropic", Reply(text="1. Edit greet.py. 2. Add CHANGES.md."))
    edit = ToolUse(
        "edit_file", {"path": "greet.py", "old_string": '"hello"', "new_string": '"hello, world"'}
    )
    llm_server.script_for("anthropic", *_coding_replies(edit))
    llm_server.script_for("responses", Reply(text=APPROVE))
    proc, result = run_json("run", "plan-implement-review", "--goal", GOAL, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert [(r.api, r.body["model"]) for r in llm_server.requests] == [
        ("anthropic", "claude-haiku-4-5"),
        *[("anthropic", "claude-sonnet-4-5")] * 6,
        ("responses", "gpt-5.2"),
    ]
    _check_run(repo, result["run_id"], llm_server)
    assert GOAL in json.dumps(llm_server.requests[0].body)


def test_the_example_runs_every_stage_on_openai(repo: Path, llm_server: LlmServer) -> None:
    _project(repo)
    text = EXAMPLE.read_text()
    for model in ("claude-haiku-4-5", "claude-sonnet-4-5", "gpt-5.2"):
        assert model in text
        text = text.replace(model, "gpt-5.4")
    (repo / "pir.fabro").write_text(text)
    shutil.copytree(EXAMPLE.parent / "prompts", repo / "prompts")
    git(repo, "add", "pir.fabro", "prompts")
    git(repo, "commit", "-q", "-m", "the example, on OpenAI")
    llm_server.script(
        Reply(text="1. Edit greet.py. 2. Add CHANGES.md."),
        *_coding_replies(ToolUse("apply_patch", {"patch": PATCH})),
        Reply(text=APPROVE),
    )
    proc, result = run_json("run", "pir.fabro", "--goal", GOAL, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert [(r.api, r.body["model"]) for r in llm_server.requests] == [("responses", "gpt-5.4")] * 8
    events = _check_run(repo, result["run_id"], llm_server)
    patched = [
        e
        for e in events
        if e["event"] == "agent.tool.completed" and e["properties"]["tool_name"] == "apply_patch"
    ]
    assert [e["properties"]["is_error"] for e in patched] == [False]


def test_the_readme_says_how_to_run_the_example_on_a_real_model() -> None:
    text = README.read_text()
    section = text[text.index("## Using a real model") :]
    section = section[: section.index("\n## ", 1)]
    assert "export ANTHROPIC_API_KEY=... OPENAI_API_KEY=..." in section
    assert 'git fabro run plan-implement-review --goal "' in section
    assert "FABRO_TEST_REAL_MODELS=1" in section


@pytest.mark.skipif(
    not REAL_WANTED or len(REAL_KEYS) < 2,
    reason="set FABRO_TEST_REAL_MODELS=1 with ANTHROPIC_API_KEY and OPENAI_API_KEY",
)
def test_the_shipped_example_on_the_real_providers(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in REAL_KEYS.items():
        monkeypatch.setenv(var, value)
    _project(repo)
    proc, result = run_json("run", "plan-implement-review", "--goal", GOAL, cwd=repo, timeout=1800)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    events = run_events(result["run_id"], repo)
    catalogue = load_contract()
    assert [p for event in events for p in check_event(event, catalogue)] == []
    assert any(e["event"] == "agent.message" for e in events)
