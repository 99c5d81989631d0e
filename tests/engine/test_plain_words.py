"""What a run says to people and to the next model is said in words, not in the
engine's records: an agent's error as its message, a failure as what failed (no
signature), a directive as where the stage asks to go."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import fabro_exe, run_events, run_json, write_workflow
from llm_server import LlmServer, unauthorized

AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, prompt="Tidy the notes"]
    start -> work -> exit
}
"""


def test_an_agent_error_is_shown_as_its_message(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, AGENT)
    llm_server.script(unauthorized())
    proc, _ = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode != 0
    (line,) = [ln for ln in proc.stderr.splitlines() if "agent error:" in ln]
    assert line.endswith(": Incorrect API key provided"), line
    assert "'kind'" not in line and '"kind"' not in line and "{" not in line


FAILS_THEN_FIX = """\
digraph F {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    build [shape=parallelogram, script="echo 'error at line 12' >&2; exit 1"]
    fix   [shape=box, prompt="Fix the build"]
    start -> build
    build -> exit [condition="outcome=succeeded"]
    build -> fix  [condition="outcome=failed"]
    fix -> exit
}
"""


def test_the_next_agent_is_told_what_failed_in_words(repo: Path) -> None:
    write_workflow(repo, FAILS_THEN_FIX)
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    (prompt,) = [
        e["properties"]["text"]
        for e in run_events(result["run_id"], repo)
        if e["event"] == "stage.prompt" and e["node_id"] == "fix"
    ]
    assert "failure_signature" not in prompt and "failure_class" not in prompt
    assert "- **build**: failed\n" in prompt
    assert "  - What failed: command exited with status 1: error at line 12" in prompt


APPROVE = """\
digraph A {
    start  [shape=Mdiamond]
    exit   [shape=Msquare]
    review [shape=tab, prompt="Review", dry_run.response="Looks fine to me.\\n{\\"preferred_next_label\\": \\"deploy\\", \\"outcome\\": \\"success\\"}"]
    gate   [shape=hexagon, label="Ship it?"]
    start -> review -> gate
    gate -> exit [label="[Y] Yes"]
    gate -> exit [label="[N] No"]
}
"""


def test_the_approver_reads_the_directive_in_words(repo: Path) -> None:
    write_workflow(repo, APPROVE)
    proc = subprocess.run(
        [*fabro_exe(), "run", "wf.fabro", "--dry-run"],
        cwd=repo,
        input="y\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    asked = proc.stderr[: proc.stderr.index("? Ship it?")]
    assert "│ Looks fine to me." in asked
    assert "│ (the stage asks to go to: deploy)" in asked
    assert "│ (the stage reports: success)" in asked
    assert "preferred_next_label" not in asked and "{" not in asked
