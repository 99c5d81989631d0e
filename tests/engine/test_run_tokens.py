"""A run's token totals: summed over its LLM stages into `run.completed.usage`, and shown
by `ps` and `inspect` (text and `--json`) from git alone, in a clone of the repository.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from event_contract.check import check_event
from event_contract.seed import load_contract
from helpers import git, run_events, run_fabro, write_workflow
from llm_server import LlmServer, Reply, ToolUse

FLOW = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    ask [shape=tab, model="claude-sonnet-4-6", prompt="Ask"]
    work [shape=box, model="claude-sonnet-4-6", prompt="Work"]
    note [shape=parallelogram, script="echo noted"]
    start -> ask -> work -> note -> exit
}
"""


def test_token_totals_are_summed_and_shown_from_git_in_a_clone(
    repo: Path, llm_server: LlmServer, tmp_path: Path
) -> None:
    write_workflow(repo, FLOW)
    llm_server.script(
        Reply(text="asked", input_tokens=1200, output_tokens=350, cache_read_tokens=100),
        Reply(
            text="",
            tool_calls=(ToolUse("write_file", {"path": "a.txt", "content": "a"}, id="w"),),
            input_tokens=2000,
            output_tokens=100,
            reasoning_tokens=40,
        ),
        Reply(text="worked", input_tokens=2500, output_tokens=50),
    )
    proc = run_fabro("run", "wf.fabro", "--goal", "count", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    # The end-of-run summary says what the models used.
    assert "  model:    6,300 tokens (5,800 in / 500 out), about $" in proc.stderr
    [run_id] = set(re.findall(r"fabro/run/([0-9A-Z]{26})", proc.stderr))
    events = run_events(run_id, repo)
    catalogue = load_contract()
    assert [p for event in events for p in check_event(event, catalogue)] == []
    [done] = [e for e in events if e["event"] == "run.completed"]
    assert done["properties"]["usage"] == {
        # Anthropic reports cached input apart; it counts as input all the same.
        "input_tokens": 5800,
        "output_tokens": 500,
        "total_tokens": 6300,
        "reasoning_tokens": 40,
        "cache_read_tokens": 100,
    }

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    fetched = run_fabro("fetch", "origin", cwd=clone)
    assert fetched.returncode == 0, fetched.stderr

    row = json.loads(run_fabro("ps", "--json", cwd=clone).stdout.splitlines()[0])
    assert row["run_id"] == run_id
    assert row["usage"] == {"input_tokens": 5800, "output_tokens": 500, "total_tokens": 6300}
    table = run_fabro("ps", cwd=clone).stdout.splitlines()
    header = table[0].split()
    assert "TOKENS" in header
    assert "6.3k" in table[1].split()

    doc = json.loads(run_fabro("inspect", run_id, "--json", cwd=clone).stdout)
    assert doc["usage"]["input_tokens"] == 5800
    assert doc["usage"]["output_tokens"] == 500
    assert doc["usage"]["total_tokens"] == 6300
    assert doc["usage"]["reasoning_tokens"] == 40
    text = run_fabro("inspect", run_id, cwd=clone).stdout
    assert "tokens     5,800 in / 500 out (6,300 total); 40 reasoning, 100 cache read" in text

    # The result line again, from what git holds: attaching to the ended run in the clone.
    line = "  model:    6,300 tokens (5,800 in / 500 out), about $"
    attached = run_fabro("attach", run_id, cwd=clone)
    assert attached.returncode == 0, attached.stderr
    assert line in attached.stderr


def test_a_run_without_model_calls_shows_no_tokens(repo: Path) -> None:
    write_workflow(repo, FLOW)
    proc = run_fabro("run", "wf.fabro", "--dry-run", "--goal", "count", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "Result: branch" in proc.stderr and "model:" not in proc.stderr
    [run_id] = set(re.findall(r"fabro/run/([0-9A-Z]{26})", proc.stderr))
    [done] = [e for e in run_events(run_id, repo) if e["event"] == "run.completed"]
    assert done["properties"].get("usage") is None
    assert "TOKENS" not in run_fabro("ps", cwd=repo).stdout
    assert "tokens" not in run_fabro("inspect", run_id, cwd=repo).stdout


def test_a_resumed_runs_summary_counts_the_whole_run_in_one_cost_format(
    repo: Path, llm_server: LlmServer, tmp_path: Path
) -> None:
    """After a resume, the end line's stages, time and cost are all the whole run's, and
    it says so; its cost reads as the model line's does, small costs included, and as
    `ps` and `inspect` show it."""
    go = tmp_path / "go"
    write_workflow(
        repo,
        FLOW.replace('script="echo noted"', f'script="test -e {go} && echo noted"'),
    )
    llm_server.script(
        Reply(text="asked", input_tokens=1000, output_tokens=100),
        Reply(text="worked", input_tokens=1000, output_tokens=100),
    )
    proc = run_fabro("run", "wf.fabro", "--goal", "count", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    [run_id] = set(re.findall(r"git fabro resume ([0-9A-Z]{26})", proc.stderr))
    go.touch()
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    # claude-sonnet-4-6 at $3 in and $15 out per million tokens: 2,000 in and 200 out.
    assert "(whole run: 6 stages, $0.0090)" in resumed.stderr, resumed.stderr
    assert "about $0.0090" in resumed.stderr
    assert "$0.01" not in resumed.stderr
    assert "$0.0090" in run_fabro("ps", cwd=repo).stdout
    assert "cost       $0.0090" in run_fabro("inspect", run_id, cwd=repo).stdout
