"""`git fabro show`: the stages of a run, and one stage in full, from git alone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from helpers import bare_remote, git, run_fabro, run_json, write_workflow
from llm_server import LlmServer, Reply, ToolUse

LOOP = """\
digraph L {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    count [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; echo lap $((n+1)); test $((n+1)) -ge 2"]
    ask   [shape=tab, prompt="Is it done?", dry_run.response="yes, done"]
    start -> count
    count -> count [condition="outcome=failed"]
    count -> ask   [condition="outcome=succeeded"]
    ask -> exit
}
"""


def test_show_lists_stages_and_prints_one_in_full(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, LOOP)
    proc = run_fabro("run", "wf.fabro", "--dry-run", "--json", cwd=repo)
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    listing = run_fabro("show", run_id, cwd=repo)
    assert listing.returncode == 0, listing.stderr
    words = [line.split() for line in listing.stdout.splitlines()]
    labels = [w[0] for w in words if w and "@" in w[0] and w[0] != "one"]
    assert labels == ["start@1", "count@1", "count@2", "ask@1", "exit@1"]
    first = run_fabro("show", run_id, "count@1", cwd=repo).stdout
    assert "status    failed" in first and "--- stdout (stdout.log)\nlap 1\n" in first
    latest = run_fabro("show", run_id, "count", cwd=repo).stdout
    assert (
        "stage     count@2" in latest and "lap 2" in latest and "--- script (script.sh)" in latest
    )
    llm = run_fabro("show", run_id, "ask", cwd=repo).stdout
    assert "--- prompt (prompt.md)" in llm and "Is it done?" in llm
    assert "--- response (response.md)\nyes, done\n" in llm
    missing = run_fabro("show", run_id, "count@3", cwd=repo)
    assert missing.returncode == 1 and "count@1, count@2" in missing.stderr
    # From git alone: a clone that fetched the run, with no scratch dir anywhere.
    bare = bare_remote(tmp_path, origin_of=repo)
    assert run_fabro("push", "origin", run_id, cwd=repo).returncode == 0
    shutil.rmtree(Path(os.environ["FABRO_HOME"]))
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(bare), str(clone))
    assert run_fabro("fetch", cwd=clone).returncode == 0
    assert "lap 2" in run_fabro("show", run_id, "count@2", cwd=clone).stdout


AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    implement [shape=box, model="sonnet", permissions="full", prompt="Count to forty"]
    start -> implement -> exit
}
"""


def test_show_prints_the_agents_tool_calls_and_their_results(
    repo: Path, llm_server: LlmServer
) -> None:
    llm_server.script(
        Reply(
            text="Counting with the shell.",
            tool_calls=(ToolUse("shell", {"command": "seq 1 40; printf '\\033[2J'"}, id="s1"),),
        ),
        Reply(text="Counted to forty."),
    )
    write_workflow(repo, AGENT)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    shown = run_fabro("show", result["run_id"], "implement", cwd=repo).stdout
    transcript = shown.split("--- transcript (1 tool call; from the run's events)\n")[1]
    assert transcript.index("said: Counting with the shell.") < transcript.index("> shell ")
    assert '"command": "seq 1 40;' in transcript
    rows = transcript.splitlines()
    first = rows.index(next(r for r in rows if r.startswith("> shell")))
    assert "more lines; all of it: show --raw]" in shown
    # The result's first lines, then the note where the rest is cut; never the 40th.
    kept = [row.strip() for row in rows[first + 1 : first + 10]]
    assert kept[:8] == [str(n) for n in range(1, 9)], kept
    assert "40" not in kept
    # In the order a person reads it: the prompt, what the agent did, its reply.
    assert shown.index("--- prompt") < shown.index("--- transcript") < shown.index("--- response")
    assert "\x1b" not in shown
    raw = run_fabro("show", result["run_id"], "implement", "--raw", cwd=repo).stdout
    assert "\n  40\n" in raw and "\x1b[2J" in raw
