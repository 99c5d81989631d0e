"""A large model reply is kept whole where the seed puts it (`response.md`, and the
offloaded `response.<node>`), and only once more in the events: its deltas and
`agent.message` stop at 100,000 characters, and `stage.completed` names the offloaded
value by its pointer."""

from __future__ import annotations

from pathlib import Path

from helpers import meta_file, run_events, run_json, write_workflow
from llm_server import LlmServer, Reply


def test_a_large_reply_is_not_copied_into_every_event(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(
        repo,
        """\
digraph L {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    plan [shape=tab, prompt="Plan it all", model="claude-sonnet-4-6"]
    start -> plan -> exit
}
""",
    )
    reply = " ".join(f"step-{i:06d}" for i in range(30_000))  # 359,999 characters
    # In deltas of 997 characters, one of them across the 100,000th.
    llm_server.script(Reply(text=reply, cuts=tuple(range(997, len(reply), 997))))
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "nodes/plan/response.md") == reply
    # The offloaded value is kept as the reply's raw text: the blob of response.md.
    assert meta_file(repo, run_id, "artifacts/response.plan.md") == reply
    assert meta_file(repo, run_id, "artifacts/plan/response.plan.md") == reply
    events = run_events(run_id, repo)
    deltas = "".join(e["properties"]["delta"] for e in events if e["event"] == "agent.text.delta")
    assert deltas == reply[:100_000]
    [message] = [e for e in events if e["event"] == "agent.message"]
    text = message["properties"]["text"]
    assert text.startswith(reply[:100_000])
    assert text.endswith(
        f"[... {len(reply) - 100_000} more characters, in the stage's response.md"
        " or its offloaded value]"
    )
    [completed] = [e for e in events if e["event"] == "stage.completed" and e["node_id"] == "plan"]
    pointer = completed["properties"]["response"]
    # The stage's own copy (per visit), which no later stage overwrites.
    assert pointer.startswith("file://") and pointer.endswith(
        "/artifacts/values/plan/response.plan.json"
    )
    assert completed["properties"]["context_updates"]["response.plan"] == pointer
