"""A reader that goes away (`| head`, quitting a pager) never stops a run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import run_fabro, start_fabro, write_workflow

GATED = """\
digraph Gated {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    wait  [shape=parallelogram, script="while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done; echo done > out.txt"]
    after [shape=parallelogram, script="echo after"]
    start -> wait -> after -> exit
}
"""


def _statuses(repo: Path) -> dict[str, str]:
    proc = run_fabro("ps", "--json", cwd=repo)
    return {r["run_id"]: r["status"] for r in map(json.loads, proc.stdout.splitlines())}


@pytest.mark.parametrize("stream", ["stderr", "stdout"])
def test_run_outlives_a_closed_pipe(repo: Path, hermetic_env: Path, stream: str) -> None:
    write_workflow(repo, GATED)
    # The progress display goes to stderr; `--json` puts the result on stdout. Either one
    # closed by its reader while a stage is running must not stop the run.
    pipe = {stream: subprocess.PIPE}
    other = "stdout" if stream == "stderr" else "stderr"
    proc = start_fabro(
        ["run", "wf.fabro", *(["--json"] if stream == "stdout" else [])],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        **pipe,
        **{other: subprocess.DEVNULL},
    )
    reader = getattr(proc, stream)
    if stream == "stderr":
        assert reader.readline().startswith(b"run ")
    reader.close()  # the reader goes away while the stage waits
    (hermetic_env / "go").write_text("")
    assert proc.wait(timeout=120) == 0
    assert list(_statuses(repo).values()) == ["succeeded"]
    crash_logs = list((hermetic_env / "fabro").rglob("crash-*.log"))
    assert crash_logs == []
