"""A detached run and a resumed run run exactly the commands a straight run runs.

The scripts write what their templates render (`{{ goal }}`, `{{ inputs.thing }}`)
into files, so the three runs' committed trees must be identical, byte for byte: the
straight run, the same with `-d`, and one killed (kill -9 of its process group) while a
stage waits for a file, then resumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from helpers import git, run_fabro, run_json, start_fabro, wait_until, write_workflow

# `hold` waits until $HOME/go exists, and says it has started by touching $HOME/held.
WORKFLOW = """\
digraph Render {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    first [shape=parallelogram, script="echo \\"{{ goal }}\\" > goal.txt"]
    hold  [shape=parallelogram, script="touch \\"$HOME/held\\"; while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done; echo \\"{{ inputs.thing }}\\" > thing.txt"]
    last  [shape=parallelogram, script="echo \\"{{ goal }} with {{ inputs.thing }}\\" > both.txt"]
    start -> first -> hold -> last -> exit
}
"""

ARGS = ("wf.fabro", "--goal", "ship the widget", "-V", "thing=a gizmo")
EXPECTED = {
    "goal.txt": "ship the widget\n",
    "thing.txt": "a gizmo\n",
    "both.txt": "ship the widget with a gizmo\n",
}


def _tree(repo: Path, run_id: str) -> str:
    for path, content in EXPECTED.items():
        assert git(repo, "show", f"fabro/run/{run_id}:{path}") == content, (run_id, path)
    return git(repo, "rev-parse", f"fabro/run/{run_id}^{{tree}}").strip()


def _status(repo: Path, run_id: str) -> str:
    proc = run_fabro("inspect", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    status: str = json.loads(proc.stdout)["status"]
    return status


def _wait_for(path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    wait_until(path.exists, process=proc, limit=60, what=what)


def test_straight_detached_and_resumed_runs_commit_the_same_tree(
    repo: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, WORKFLOW)
    go, held = hermetic_env / "go", hermetic_env / "held"
    go.touch()

    proc, result = run_json("run", *ARGS, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    straight = _tree(repo, result["run_id"])

    detach = run_fabro("run", *ARGS, "-d", cwd=repo)
    assert detach.returncode == 0, detach.stderr
    detached_id = detach.stdout.strip()
    follow = run_fabro("logs", detached_id, "-f", cwd=repo, timeout=90)
    assert '"run.completed"' in follow.stdout, follow.stderr
    wait_until(lambda: _status(repo, detached_id) == "succeeded", limit=30, what="its end in ps")
    assert _tree(repo, detached_id) == straight

    go.unlink()
    held.unlink()
    before = set(git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split())
    killed = start_fabro(
        ["run", *ARGS],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ),
    )
    try:
        _wait_for(held, killed, "the hold stage")
        os.killpg(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=10) == -signal.SIGKILL
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait()
    after = set(git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split())
    (meta_ref,) = after - before
    killed_id = meta_ref.split("/")[-1]
    assert _status(repo, killed_id) == "interrupted"
    go.touch()
    resumed = run_fabro("resume", killed_id, cwd=repo, timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    assert _tree(repo, killed_id) == straight
