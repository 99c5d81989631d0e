"""`git fabro wait RUN` blocks until the run ends and exits as it did."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import run_fabro, start_fabro, write_workflow

GATED = """\
digraph G {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done; %s"]
    start -> hold -> exit
}
"""


def _detached(repo: Path, tail: str) -> str:
    write_workflow(repo, GATED % tail)
    proc = run_fabro("run", "wf.fabro", "-d", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_wait_blocks_until_the_run_ends(repo: Path, hermetic_env: Path) -> None:
    run_id = _detached(repo, "true")
    waiter = start_fabro(["wait", run_id], cwd=repo, stderr=subprocess.PIPE, text=True)
    timed_out = run_fabro("wait", run_id, "--timeout", "1", cwd=repo)  # bare seconds
    assert timed_out.returncode == 124 and "still running" in timed_out.stderr
    assert waiter.poll() is None  # the run is held at its stage, so wait is too
    (hermetic_env / "go").write_text("")
    _, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    assert f"run {run_id} succeeded" in err
    again = run_fabro("wait", run_id, cwd=repo)  # an ended run: at once
    assert again.returncode == 0


def test_wait_exits_as_a_failed_run_did(repo: Path, hermetic_env: Path) -> None:
    (hermetic_env / "go").write_text("")
    run_id = _detached(repo, "exit 3")
    proc = run_fabro("wait", run_id, cwd=repo, timeout=120)
    assert proc.returncode == 1 and "failed" in proc.stderr
    bare = run_fabro("wait", run_id, "--timeout", "90", cwd=repo)
    assert bare.returncode == 1 and f"run {run_id} failed" in bare.stderr
    bad = run_fabro("wait", run_id, "--timeout", "soon", cwd=repo)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "--timeout expects a duration such as 90 (seconds), 30s" in bad.stderr
    since = run_fabro("logs", run_id, "--since", "3600", cwd=repo)
    assert since.returncode == 0 and "run.failed" in since.stdout
