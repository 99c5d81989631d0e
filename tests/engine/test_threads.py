"""Shared conversations: nodes with one `thread_id` and `fidelity="full"` carry one
conversation on, across nodes, across visits of a loop, and across an interrupt and a
resume in another clone. End to end through `git fabro run` against the local server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import (
    bare_remote,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    wait_until,
    write_workflow,
)
from llm_server import LlmServer, Reply, Stall, ToolUse

THREAD = """\
digraph T {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    subgraph cluster_impl {
        node [fidelity="full", thread_id="impl"]
        plan [shape=box, model="%(model)s", prompt="Plan the change"]
        implement [shape=box, model="%(model)s", prompt="Implement the plan"]
    }
    start -> plan -> implement -> exit
}
"""

LOOP = """\
digraph L {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    draft [shape=box, fidelity="full", thread_id="t", prompt="Draft round"]
    judge [shape=tab, fidelity="full", thread_id="t", prompt="Is it done?"]
    other [shape=box, prompt="Unthreaded"]
    start -> draft -> judge
    judge -> draft [label="Again"]
    judge -> other [label="Done"]
    other -> exit
}
"""


# The stored thread goes back in each provider's own format in process
# (tests/agent/test_agent_loop.py::test_the_conversation_round_trips_and_a_later_visit_carries_on);
# the other tests here run their threads on Anthropic.
@pytest.mark.parametrize(("model", "api"), [("gpt-5.4", "responses")])
def test_the_second_node_of_a_thread_carries_the_first_nodes_turns(
    repo: Path, llm_server: LlmServer, model: str, api: str
) -> None:
    (repo / "notes.txt").write_text("the notes\n")
    git(repo, "add", "notes.txt")
    write_workflow(repo, THREAD % {"model": model})
    llm_server.script(
        Reply(text="Looking.", tool_calls=(ToolUse("read_file", {"path": "notes.txt"}, id="r1"),)),
        Reply(text="PLAN-7: rename the notes."),
        Reply(text="Implemented PLAN-7."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "tidy", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert [r.api for r in llm_server.requests] == [api] * 3
    implement = llm_server.requests[2]
    sent = json.dumps(implement.body)
    # The plan's prompt, its tool round (the file it read) and its answer come first.
    assert "Plan the change" in sent and "the notes" in sent and "PLAN-7: rename" in sent
    assert "Implement the plan" in sent
    # Continuing the thread, the implement stage gets no preamble of its own.
    assert meta_file(repo, run_id, "nodes/implement/prompt.md") == "Implement the plan"
    stored = json.loads(meta_file(repo, run_id, "threads/impl.json"))
    texts = [m.get("text", "") for m in stored["messages"]]
    assert "PLAN-7: rename the notes." in texts and "Implemented PLAN-7." in texts
    events = run_events(run_id, repo)
    activated = [e for e in events if e["event"] == "agent.session.activated"]
    assert [e["properties"]["thread_id"] for e in activated] == ["impl", "impl"]


def test_a_thread_goes_on_across_visits_of_a_loop_and_into_a_prompt_node(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, LOOP)
    llm_server.script(
        Reply(
            text="",
            tool_calls=(ToolUse("write_file", {"path": "d.txt", "content": "DRAFT-ONE"}, id="w1"),),
        ),
        Reply(text="First draft written."),
        Reply(text='Not yet. {"preferred_next_label": "Again"}'),
        Reply(text="Second draft written."),
        Reply(text='Good. {"preferred_next_label": "Done"}'),
        Reply(text="Unthreaded work done."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "draft", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    bodies = [json.dumps(r.body) for r in llm_server.requests]
    assert len(bodies) == 6
    # The judge (a prompt node, no tools) reads the draft's tool round as text.
    assert "DRAFT-ONE" in bodies[2] and "First draft written." in bodies[2]
    assert '"tools"' not in bodies[2] or not llm_server.requests[2].body.get("tools")
    # The second visit of the draft node carries the judge's verdict and the first draft.
    assert "Not yet." in bodies[3] and "First draft written." in bodies[3]
    assert "Second draft written." in bodies[4] and "Not yet." in bodies[4]
    # A node on no thread starts afresh.
    assert "First draft written." not in bodies[5]
    run_events(result["run_id"], repo)


def test_a_thread_survives_an_interrupt_and_a_resume_in_another_clone(
    repo: Path, llm_server: LlmServer, tmp_path: Path
) -> None:
    write_workflow(repo, THREAD % {"model": "sonnet"})
    llm_server.script(Reply(text="PLAN-42: the plan."), Stall(seconds=120))
    proc = start_fabro(
        ["run", "wf.fabro", "--goal", "g"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # The second request is the implement stage's, which the server holds.
    wait_until(lambda: len(llm_server.requests) >= 2, process=proc, limit=60, what="the 2nd call")
    assert "PLAN-42" in json.dumps(llm_server.requests[1].body)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    run_id = re.findall(r"git fabro resume ([0-9A-Z]{26})", err.decode())[-1]

    origin = bare_remote(tmp_path, origin_of=repo)
    pushed = run_fabro("push", "origin", cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    shutil.rmtree(repo)
    shutil.rmtree(os.environ["FABRO_HOME"], ignore_errors=True)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))

    llm_server.script(Reply(text="Implemented PLAN-42."))
    resumed = run_fabro("resume", run_id, cwd=clone, timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    assert len(llm_server.requests) == 3
    again = json.dumps(llm_server.requests[2].body)
    assert "Plan the change" in again and "PLAN-42: the plan." in again
    assert "Implement the plan" in again
    stored = json.loads(meta_file(clone, run_id, "threads/impl.json"))
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"] * 2
    run_events(run_id, clone)


def test_a_fork_carries_the_thread_as_it_stood_at_its_checkpoint(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, THREAD % {"model": "sonnet"})
    llm_server.script(Reply(text="PLAN-A"), Reply(text="IMPLEMENTED-A"))
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    forked = run_fabro("fork", result["run_id"], "plan", cwd=repo)
    assert forked.returncode == 0, forked.stderr
    fork_id = forked.stdout.strip()
    stored = json.loads(meta_file(repo, fork_id, "threads/impl.json"))
    assert [m["text"] for m in stored["messages"]][-1] == "PLAN-A"

    llm_server.script(Reply(text="IMPLEMENTED-B"))
    resumed = run_fabro("resume", fork_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    again = json.dumps(llm_server.requests[-1].body)
    assert "PLAN-A" in again and "IMPLEMENTED-A" not in again


EDGE_THREAD = """\
digraph E {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=box, fidelity="full", thread_id="e", prompt="Plan by edge"]
    implement [shape=box, prompt="Implement by edge"]
    check [shape=box, prompt="Check afresh"]
    start -> plan
    plan -> implement [fidelity="full", thread_id="e"]
    implement -> check [fidelity="truncate"]
    check -> exit
}
"""


def test_an_edge_sets_the_thread_and_fidelity_into_its_target(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, EDGE_THREAD)
    llm_server.script(Reply(text="EDGE-PLAN"), Reply(text="EDGE-IMPL"), Reply(text="checked"))
    proc, result = run_json("run", "wf.fabro", "--goal", "by edge", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    _plan, implement, check = (json.dumps(r.body) for r in llm_server.requests)
    assert "EDGE-PLAN" in implement and "Plan by edge" in implement
    assert meta_file(repo, result["run_id"], "nodes/implement/prompt.md") == "Implement by edge"
    # Into check the edge says truncate: the goal alone, no completed stages.
    assert "EDGE-IMPL" not in check and "Completed stages" not in check
    assert "Goal: by edge" in check


def test_a_node_thread_needs_no_fidelity_of_its_own_when_every_edge_in_sets_full(
    repo: Path,
) -> None:
    text = EDGE_THREAD.replace(
        'implement [shape=box, prompt="Implement by edge"]',
        'implement [shape=box, thread_id="e", prompt="Implement by edge"]',
    )
    write_workflow(repo, text)
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "thread_id_requires_fidelity_full" not in proc.stdout + proc.stderr
    write_workflow(
        repo,
        text.replace('plan -> implement [fidelity="full", thread_id="e"]', "plan -> implement"),
    )
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert "thread_id_requires_fidelity_full" in proc.stdout + proc.stderr


def test_a_thread_survives_kill_9(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, THREAD % {"model": "sonnet"})
    llm_server.script(Reply(text="PLAN-K: the plan."), Stall(seconds=120))
    proc = start_fabro(
        ["run", "wf.fabro", "--goal", "g", "--json"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_until(lambda: len(llm_server.requests) >= 2, process=proc, limit=60, what="the 2nd call")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    run_id = git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta/").strip()
    assert len(run_id) == 26

    llm_server.script(Reply(text="Implemented PLAN-K."))
    resumed = run_fabro("resume", run_id, cwd=repo, timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    again = json.dumps(llm_server.requests[2].body)
    assert "PLAN-K: the plan." in again and "Implement the plan" in again
    assert again.count("Implement the plan") == 1  # the cut-off attempt left nothing behind
    run_events(run_id, repo)


FAN = """\
digraph F {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    node [fidelity="full", thread_id="t"]
    plan [shape=box, prompt="Plan the fan"]
    fan [shape=component, join_policy="wait_all"]
    left [shape=box, prompt="Left side"]
    right [shape=box, prompt="Right side"]
    merge [shape=tripleoctagon]
    wrap [shape=box, prompt="Wrap up"]
    start -> plan -> fan
    fan -> left -> merge
    fan -> right -> merge
    merge -> wrap -> exit
}
"""


def test_parallel_branches_each_carry_the_thread_on_from_the_fan_out(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, FAN)
    llm_server.script(
        Reply(text="FAN-PLAN"),
        Reply(text="BRANCH-REPLY-ONE"),
        Reply(text="BRANCH-REPLY-TWO"),
        Reply(text="wrapped"),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "fan", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    bodies = [json.dumps(r.body) for r in llm_server.requests]
    assert len(bodies) == 4
    branches = bodies[1:3]
    assert sorted("Left side" in b for b in branches) == [False, True]
    for body in branches:
        assert "FAN-PLAN" in body and "BRANCH-REPLY" not in body
    # After the fan-in the thread goes on from where the fan-out left it.
    assert "FAN-PLAN" in bodies[3] and "BRANCH-REPLY" not in bodies[3]
    stored = json.loads(meta_file(repo, result["run_id"], "threads/t.json"))
    assert [m["text"] for m in stored["messages"]][-1] == "wrapped"
    run_events(result["run_id"], repo)
