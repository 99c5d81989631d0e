"""A run killed while its worktree was being removed (the directory still there, its
`.git` link gone) resumes: the removal is finished and the worktree made afresh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from helpers import git, run_fabro, start_fabro, wait_until, write_workflow

HELD = """\
digraph H {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="touch \\"$HOME/holding\\"; while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done; echo done > done.txt"]
    start -> hold -> exit
}
"""


def test_a_worktree_left_without_its_git_link_is_made_again(repo: Path, hermetic_env: Path) -> None:
    write_workflow(repo, HELD)
    proc = start_fabro(
        ["run", "wf.fabro"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # The stage says when it is running.
    wait_until((hermetic_env / "holding").exists, process=proc, what="the stage's start")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])["run_id"]
    worktree = next((Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*")) / "worktree"
    assert str(worktree) in git(repo, "worktree", "list")
    (worktree / ".git").unlink()  # what a removal cut off after its first step leaves
    (hermetic_env / "go").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert git(repo, "show", f"fabro/run/{run_id}:done.txt") == "done\n"
