"""A newcomer's first afternoon, end to end at a terminal: their own workflow (a plan
agent, a test command, an approval gate that loops back), against the local model
server, every command on a pty as a person types it.

The afternoon: a typo'd workflow is refused before it costs anything; the fixed one runs
and fails its tests; the fix is committed on main and brought in with `resume --rebase`;
at the gate a stray `maybe` and a bare Enter are asked again; a workflow whose later
stage was wrong is continued with `resume --workflow`; `--max-cost` stops a run at a
checkpoint, and a resume with a higher cap finishes it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import (
    TERMINAL_ESCAPES,
    git,
    run_fabro,
    typed_at_a_terminal,
    write_workflow,
)
from llm_server import LlmServer, Reply

WORKFLOW = """\
digraph Afternoon {
    graph [goal="make the tests pass"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    plan  [shape=box, model="claude-sonnet-4-6", PROMPT="Plan the fix"]
    test  [shape=parallelogram, script="test -f fixed.txt"]
    gate  [shape=hexagon, label="Merge this fix?"]
    start -> plan -> test -> gate
    gate -> exit [label="[A] Approve"]
    gate -> plan [label="[R] Revise"]
}
"""

CHECKED = """\
digraph Checked {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    build [shape=parallelogram, script="echo built > built.txt"]
    check [shape=parallelogram, script="SCRIPT"]
    start -> build -> check -> exit
}
"""

SPENDY = """\
digraph Spendy {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    one   [shape=box, model="claude-sonnet-4-6", prompt="One"]
    two   [shape=box, model="claude-sonnet-4-6", prompt="Two"]
    start -> one -> two -> exit
}
"""


def _at_a_terminal(repo: Path, *args: str, typed: tuple[bytes, ...] = ()) -> tuple[int, str]:
    """`git fabro ARGS` on a pty, typing each of `typed` at a `> ` prompt; its exit
    status and what the terminal showed, escape sequences left out."""
    code, seen = typed_at_a_terminal(list(args), repo, typed)
    return code, TERMINAL_ESCAPES.sub(b"", seen).decode(errors="replace")


def _run_id(text: str) -> str:
    found = re.search(r"run (\S+) started", text)
    assert found is not None, text
    return found.group(1)


def test_a_newcomers_afternoon(repo: Path, llm_server: LlmServer) -> None:
    plan = Reply(text="Add fixed.txt.", input_tokens=1000, output_tokens=100)
    llm_server.script(plan, plan, plan)

    # A typo costs nothing: the run is refused before a stage, a ref or a token.
    write_workflow(repo, WORKFLOW.replace("PROMPT", "promt"))
    code, text = _at_a_terminal(repo, "run", "wf.fabro")
    assert code == 1, text
    assert "'promt' -> 'prompt'" in text and "--allow-typos" in text
    assert git(repo, "for-each-ref", "refs/fabro") == ""
    assert llm_server.requests == []

    # The fixed workflow plans, then its tests fail: the hint says how to go on.
    write_workflow(repo, WORKFLOW.replace("PROMPT", "prompt"))
    code, text = _at_a_terminal(repo, "run", "wf.fabro")
    assert code == 1, text
    run_id = _run_id(text)
    assert f"git fabro resume {run_id} --rebase main" in text
    assert len(llm_server.requests) == 1

    # The fix goes on main, the run takes it, and the gate asks again until it gets a
    # choice it knows.
    (repo / "fixed.txt").write_text("fixed\n")
    git(repo, "add", "fixed.txt")
    git(repo, "commit", "-q", "-m", "the fix")
    code, text = _at_a_terminal(
        repo, "resume", run_id, "--rebase", "main", typed=(b"maybe", b"", b"A")
    )
    assert code == 0, text
    assert "'maybe' is none of the choices" in text
    assert "this question has no default" in text
    assert git(repo, "show", f"fabro/run/{run_id}:fixed.txt") == "fixed\n"
    trailers = git(
        repo, "log", "--format=%(trailers:key=Fabro-Rebased-Onto)", f"fabro/run/{run_id}"
    )
    assert git(repo, "rev-parse", "main").strip() in trailers

    # A later stage was wrong in the workflow itself: the corrected file takes over
    # from the failed stage, and what ran before is not run again.
    write_workflow(repo, CHECKED.replace("SCRIPT", "test -f missing.txt"), "checked.fabro")
    code, text = _at_a_terminal(repo, "run", "checked.fabro")
    assert code == 1, text
    checked_id = _run_id(text)
    (repo.parent / "checked-fixed.fabro").write_text(CHECKED.replace("SCRIPT", "test -f built.txt"))
    code, text = _at_a_terminal(
        repo, "resume", checked_id, "--workflow", str(repo.parent / "checked-fixed.fabro")
    )
    assert code == 0, text
    events = [
        json.loads(line) for line in run_fabro("logs", checked_id, cwd=repo).stdout.splitlines()
    ]
    built = [e for e in events if e["event"] == "stage.completed" and e["node_id"] == "build"]
    assert len(built) == 1
    assert any(e["properties"].get("code") == "workflow_replaced" for e in events)

    # A cap on spending stops the run at its next checkpoint; more lets it finish.
    llm_server.script(plan, plan)
    before = len(llm_server.requests)
    write_workflow(repo, SPENDY, "spendy.fabro")
    code, text = _at_a_terminal(repo, "run", "spendy.fabro", "--max-cost", "0.001")
    assert code == 130, text
    spendy_id = _run_id(text)
    assert len(llm_server.requests) == before + 1
    assert "--max-cost" in text
    code, text = _at_a_terminal(repo, "resume", spendy_id, "--max-cost", "1")
    assert code == 0, text
    assert len(llm_server.requests) == before + 2
