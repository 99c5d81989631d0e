"""`logs`: quiet --pretty by default, -n/--tail, --since, aligned columns, and a
workflow name standing for its latest run."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_fabro, run_json, write_workflow
from llm_server import LlmServer, Reply, ToolUse


def _run_hello(repo: Path) -> str:
    proc = run_fabro("run", "hello", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def test_pretty_hides_bookkeeping_unless_verbose(repo: Path) -> None:
    run_id = _run_hello(repo)
    quiet = run_fabro("logs", run_id, "--pretty", cwd=repo).stdout.splitlines()
    loud = run_fabro("logs", run_id, "--pretty", "-v", cwd=repo).stdout.splitlines()
    everything = run_fabro("logs", run_id, cwd=repo).stdout.splitlines()
    assert len(loud) == len(everything) > len(quiet)
    for line in quiet:
        assert (
            "metadata.snapshot" not in line and "sandbox." not in line and "git.commit" not in line
        )
    assert any("metadata.snapshot.completed" in line for line in loud)
    # The columns line up: every event name starts at one column, every node at another.
    starts = {line.index("stage.") for line in quiet if " stage." in line}
    assert len(starts) == 1
    nodes = {line.index("Write greeting") for line in quiet if "Write greeting" in line}
    assert len(nodes) == 1 and nodes == {
        line.index("Show it") for line in quiet if "Show it" in line
    }


def test_tail_and_since(repo: Path) -> None:
    run_id = _run_hello(repo)
    everything = run_fabro("logs", run_id, cwd=repo).stdout.splitlines()
    assert run_fabro("logs", run_id, "-n", "3", cwd=repo).stdout.splitlines() == everything[-3:]
    assert run_fabro("logs", run_id, "--tail", "0", cwd=repo).stdout == ""
    assert run_fabro("logs", run_id, "--since", "1h", cwd=repo).stdout.splitlines() == everything
    assert run_fabro("logs", run_id, "--since", "0s", cwd=repo).stdout == ""
    bad = run_fabro("logs", run_id, "--since", "soon", cwd=repo)
    assert bad.returncode == 1 and "--since expects a duration" in bad.stderr
    negative = run_fabro("logs", run_id, "-n", "-2", cwd=repo)
    assert negative.returncode == 1 and "Traceback" not in negative.stderr


def test_a_workflow_name_means_its_latest_run(repo: Path) -> None:
    _run_hello(repo)
    latest = _run_hello(repo)
    for command in (("logs", "hello", "-n", "1"), ("inspect", "hello", "--json")):
        proc = run_fabro(*command, cwd=repo)
        assert proc.returncode == 0, proc.stderr
        assert f"hello is a workflow: using its latest run, {latest}" in proc.stderr
        assert latest in proc.stdout
    missing = run_fabro("logs", "no-such-thing", cwd=repo)
    assert missing.returncode == 1 and "no run matches 'no-such-thing'" in missing.stderr


AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    implement [shape=box, model="sonnet", permissions="full", prompt="Say hello"]
    start -> implement -> exit
}
"""


def _agent_run(repo: Path, llm_server: LlmServer) -> str:
    llm_server.script(
        Reply(
            text="Running a command to look around the repository first.",
            tool_calls=(ToolUse("shell", {"command": "seq 1 40"}, id="s1"),),
        ),
        Reply(text="All done here, the greeting is written and the tests pass."),
    )
    write_workflow(repo, AGENT)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return result["run_id"]


def test_pretty_folds_streamed_fragments_unless_verbose(repo: Path, llm_server: LlmServer) -> None:
    run_id = _agent_run(repo, llm_server)
    quiet = run_fabro("logs", run_id, "--pretty", cwd=repo).stdout.splitlines()
    loud = run_fabro("logs", run_id, "--pretty", "-v", cwd=repo).stdout.splitlines()
    text = [line for line in quiet if "agent.text.delta" in line]
    # One line per reply, each with the whole reply, not one per streamed word.
    assert len(text) == 2, quiet
    assert "Running a command to look around the repository first." in text[0]
    assert "All done here" in text[1] and "fragments:" in text[1]
    assert len([line for line in loud if "agent.text.delta" in line]) > 10
    output = [line for line in quiet if "agent.tool.output.delta" in line]
    assert len(output) == 1 and "1 2 3" in output[0]
    # Folded lines come before the event their stretch led up to.
    names = [line.split()[1] for line in quiet if line.split()[1].startswith("agent.")]
    assert names.index("agent.tool.output.delta") < names.index("agent.tool.completed")
