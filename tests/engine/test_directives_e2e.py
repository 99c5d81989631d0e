"""Through `git fabro run`: a reply's directive routes the run even after a stray brace,
and a `status.json` in the worktree stands in when the reply has none."""

from __future__ import annotations

from pathlib import Path

from helpers import run_events, run_json, write_workflow

ROUTED = """\
digraph R {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    prep  [shape=parallelogram, script="%(prep)s"]
    judge [shape=tab, prompt="Judge it", dry_run.response="%(reply)s"]
    fix   [shape=parallelogram, script="echo fix"]
    ship  [shape=parallelogram, script="echo ship"]
    start -> prep -> judge
    judge -> fix  [label="fix"]
    judge -> ship [label="ship"]
    fix -> exit
    ship -> exit
}
"""


def _path(repo: Path, prep: str, reply: str) -> list[str]:
    write_workflow(repo, ROUTED % {"prep": prep, "reply": reply})
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return [
        e["node_id"] for e in run_events(result["run_id"], repo) if e["event"] == "stage.started"
    ]


def test_a_directive_after_a_stray_brace_routes(repo: Path) -> None:
    reply = 'A set {1, 2 is open. {\\"preferred_next_label\\": \\"ship\\"}'
    assert _path(repo, "true", reply)[-2] == "ship"


def test_status_json_is_the_fallback_and_the_reply_wins(repo: Path) -> None:
    writes = r"""echo '{\"preferred_next_label\": \"fix\"}' > status.json"""
    assert _path(repo, writes, "no directive here")[-2] == "fix"
    assert _path(repo, writes, '{\\"preferred_next_label\\": \\"ship\\"}')[-2] == "ship"
