"""files_touched in every scope: parallel branch stages, the fan-in, a child workflow's
stages and the stage that runs it each report the files they changed, from their own
tree diff, in stage.completed, status.json, the next stages' preambles and the retro;
and a fresh clone reads the same from the meta ref."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import fresh_clone, git, meta_file, run_events, run_json, write_workflow

# Branch `a` writes two files over two stages, branch `b` one; the fan-in takes branch
# `a` (first in order when both succeed). A child workflow then writes two files over
# two stages with a prompt between them; `note` after each fan-in and child reads the
# preamble.
RUN = """\
digraph Scopes {
    graph [goal="touch files everywhere"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    a1    [shape=parallelogram, script="echo a > a.txt"]
    a2    [shape=parallelogram, script="mkdir -p docs && echo a2 > docs/a2.txt"]
    anote [prompt="what did a1 do?"]
    b1    [shape=parallelogram, script="echo b > b.txt && rm README.md"]
    join  [shape=tripleoctagon]
    sub   [shape=house, stack.child_workflow="flows/child.fabro"]
    note  [prompt="what changed?"]
    start -> fan
    fan -> a1 -> anote -> a2 -> join
    fan -> b1 -> join
    join -> sub -> note -> exit
}
"""

CHILD = """\
digraph Child {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    c1    [shape=parallelogram, script="echo c > c.txt"]
    ask   [prompt="go on"]
    c2    [shape=parallelogram, script="echo d > d.txt && echo again >> a.txt"]
    start -> c1 -> ask -> c2 -> exit
}
"""

EXPECTED = {
    "a1": ["a.txt"],
    "a2": ["docs/a2.txt"],
    "b1": ["README.md", "b.txt"],
    "join": ["a.txt", "docs/a2.txt"],
    "sub/c1": ["c.txt"],
    "sub/c2": ["a.txt", "d.txt"],
    "sub": ["a.txt", "c.txt", "d.txt"],
}

# Where each stage's status.json is on the meta ref.
STATUS_FILES = {
    "a1": "nodes/a1/status.json",
    "a2": "nodes/a2/status.json",
    "b1": "nodes/b1/status.json",
    "join": "nodes/join/status.json",
    "sub/c1": "nodes/sub/nodes/c1/status.json",
    "sub/c2": "nodes/sub/nodes/c2/status.json",
    "sub": "nodes/sub/status.json",
}


def test_every_scope_reports_the_files_its_stages_touched(repo: Path, tmp_path: Path) -> None:
    (repo / "flows").mkdir()
    (repo / "flows" / "child.fabro").write_text(CHILD)
    git(repo, "add", "flows")
    write_workflow(repo, RUN)
    proc, result = run_json("run", "wf.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]

    events = run_events(run_id, repo)
    completed = {
        e["node_id"]: e["properties"]["files_touched"]
        for e in events
        if e["event"] == "stage.completed"
    }
    assert {node: completed[node] for node in EXPECTED} == EXPECTED
    # Stages that change nothing say so.
    assert completed["fan"] == [] and completed["anote"] == [] and completed["sub/ask"] == []

    # What git holds agrees: the branch and run-branch commits changed those files.
    run_ref = f"refs/heads/fabro/run/{run_id}"
    assert git(repo, "show", f"{run_ref}:docs/a2.txt") == "a2\n"
    assert git(repo, "show", f"{run_ref}:a.txt") == "a\nagain\n"

    # Another machine reads status.json, the preambles and the retro from git alone.
    clone, _ = fresh_clone(repo, tmp_path)
    for node, path in STATUS_FILES.items():
        status = json.loads(meta_file(clone, run_id, path))
        assert status["files_touched"] == EXPECTED[node], node

    # The preamble of a branch's later stage lists the branch's earlier one; after the
    # fan-in and the child, the run's next stage lists theirs.
    branch_prompt = meta_file(clone, run_id, "nodes/anote/prompt.md")
    assert "- **a1**: succeeded\n  - Files: a.txt\n" in branch_prompt
    child_prompt = meta_file(clone, run_id, "nodes/sub/nodes/ask/prompt.md")
    assert "- **c1**: succeeded\n  - Files: c.txt\n" in child_prompt
    prompt = meta_file(clone, run_id, "nodes/note/prompt.md")
    assert "- **join**: succeeded\n  - Files: a.txt, docs/a2.txt\n" in prompt
    assert "- **sub**: succeeded\n  - Files: a.txt, c.txt, d.txt\n" in prompt

    retro = json.loads(meta_file(clone, run_id, "retro.json"))
    by_node = {stage["node_id"]: stage["files_touched"] for stage in retro["stages"]}
    assert {node: by_node[node] for node in EXPECTED} == EXPECTED
    assert retro["aggregate"]["files_touched"] == [
        "README.md",
        "a.txt",
        "b.txt",
        "c.txt",
        "d.txt",
        "docs/a2.txt",
    ]
