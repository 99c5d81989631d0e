"""A secret inside a word that a key shape starts in (`risk-...` holds `sk-...`
mid-word, which is no key) is masked all the same, end to end: a command stage prints
it, and no git object of the run holds it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import meta_file, run_json, write_workflow

TOKEN = "tok-PLANTED" + "Zt2Wm4Rk3Yq9Xp7L"


def test_a_secret_inside_a_mid_word_key_shape_never_reaches_git(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    write_workflow(
        repo,
        """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    show [shape=parallelogram, script="echo risk-xxxxxxxxxxxxxxxxxxxx${GITHUB_TOKEN}-end"]
    start -> show -> exit
}
""",
    )
    (repo / "run.toml").write_text(
        '[workflow]\ngraph = "wf.fabro"\n\n'
        '[run.sandbox.env]\nGITHUB_TOKEN = "{{ env.GITHUB_TOKEN }}"\n'
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    out = meta_file(repo, result["run_id"], "nodes/show/stdout.log")
    assert out == f"risk-{'x' * 20}***{TOKEN[-4:]}-end\n"
    every_object = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=repo, capture_output=True
    ).stdout
    assert TOKEN.encode() not in every_object
