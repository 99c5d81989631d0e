"""`git fabro batch --max-parallel N` caps the LLM stages running at once across all
of its runs, not only the runs: the real CLI, the real SDKs, the wire-format server.

The server holds every reply until the test opens its gate, so what it counts in
flight is every request the runs could send at once; the test waits until two are in
flight and the four other stages have said they wait for a slot, then lets them go.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from helpers import events_named, run_events, run_fabro, start_fabro, wait_until, write_workflow
from llm_server import Held, LlmServer

# Three prompt stages side by side: two rows of it ask for six replies at once.
FAN = """\
digraph Fan {
    graph [goal="three views"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    a     [shape=tab, model="claude-sonnet-4-6", prompt="View A"]
    b     [shape=tab, model="claude-sonnet-4-6", prompt="View B"]
    c     [shape=tab, model="claude-sonnet-4-6", prompt="View C"]
    join  [shape=tripleoctagon]
    start -> fan
    fan -> a -> join
    fan -> b -> join
    fan -> c -> join
    join -> exit
}
"""

ONE = """\
digraph One {
    graph [goal="one view"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    ask   [shape=tab, model="claude-sonnet-4-6", prompt="View"]
    start -> ask -> exit
}
"""


def _live_notices(code: str) -> int:
    """How many `run.notice` events with `code` the runs' live tails hold so far."""
    count = 0
    for tail in (Path(os.environ["FABRO_HOME"]) / "runs").glob("*/events.jsonl"):
        for line in tail.read_bytes().split(b"\n")[:-1]:
            event = json.loads(line)
            if event["event"] == "run.notice" and event["properties"]["code"] == code:
                count += 1
    return count


def test_max_parallel_caps_llm_stages_across_the_runs_of_a_batch(
    repo: Path, tmp_path: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, FAN)
    gate = threading.Event()
    llm_server.script(*[Held(gate)] * 6)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"n": 1}\n{"n": 2}\n')
    proc = start_fabro(
        ["batch", "wf.fabro", "--inputs", str(rows), "--max-parallel", "2"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def settled() -> str | None:
        if llm_server.in_flight > 2:
            return "more than two in flight"
        if llm_server.in_flight == 2 and _live_notices("llm_slot_wait") == 4:
            return "two in flight, four waiting"
        return None

    try:
        seen = wait_until(settled, process=proc, what="the runs' six stages to settle")
    finally:
        gate.set()  # whatever was seen, let every held reply go
        out, err = proc.communicate(timeout=120)
    assert seen == "two in flight, four waiting", f"{llm_server.most_in_flight} at once"
    assert proc.returncode == 0, err
    assert [line.split()[2] for line in out.splitlines()[1:]] == ["succeeded", "succeeded"]
    assert len(llm_server.requests) == 6 and llm_server.most_in_flight == 2


def test_a_run_whose_limiter_is_gone_warns_and_goes_on(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, ONE)
    gone = str(repo / "no-such.sock")
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo, env={"FABRO_LLM_SLOTS": gone})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    [notice] = [
        event
        for event in events_named(run_events(run_id, repo), "run.notice")
        if event["properties"]["code"] == "llm_slots_unreachable"
    ]
    assert notice["node_id"] == "ask" and notice["properties"]["level"] == "warn"
    assert f"the LLM slot limiter at {gone} does not answer" in notice["properties"]["message"]
    assert len(llm_server.requests) == 1
