"""`git fabro interrupt` and `steer` reach a live run through its private control socket."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from helpers import run_events, run_fabro, start_fabro, wait_until, write_workflow

from fabro_git.config.locations import run_scratch_dir

HELD = """\
digraph H {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="touch \\"$HOME/holding\\"; while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done"]
    after [shape=parallelogram, script="echo after > after.txt"]
    start -> hold -> after -> exit
}
"""


def _start_held(repo: Path, home: Path) -> tuple[subprocess.Popen[str], str]:
    write_workflow(repo, HELD)
    proc = start_fabro(
        ["run", "wf.fabro", "--json"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until((home / "holding").exists, process=proc, what="the stage's start")
    (run_id,) = [
        json.loads(line)["run_id"]
        for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()
    ]
    return proc, run_id


def test_interrupt_stops_a_live_run_at_a_checkpoint(repo: Path, hermetic_env: Path) -> None:
    proc, run_id = _start_held(repo, hermetic_env)
    sock = run_scratch_dir(repo / ".git", run_id) / "control.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    answer = run_fabro("interrupt", run_id, cwd=repo)
    assert answer.returncode == 0, answer.stderr
    assert "git fabro resume" in answer.stderr
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert not sock.exists()
    events = run_events(run_id, repo)
    (interrupt,) = [e for e in events if e["event"] == "run.interrupt"]
    assert interrupt["actor"]["kind"] == "user"
    again = run_fabro("interrupt", run_id, cwd=repo)
    assert again.returncode == 1 and "is not running here" in again.stderr
    (hermetic_env / "go").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr


def test_steer_with_no_agent_stage_says_so(repo: Path, hermetic_env: Path) -> None:
    proc, run_id = _start_held(repo, hermetic_env)
    try:
        answer = run_fabro("steer", run_id, "use the other API", cwd=repo)
        assert answer.returncode == 1
        assert "no agent stage is running now" in answer.stderr
        empty = run_fabro("steer", run_id, "  ", cwd=repo)
        assert empty.returncode == 1 and "empty" in empty.stderr
    finally:
        (hermetic_env / "go").write_text("")
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    (steer,) = [e for e in run_events(run_id, repo) if e["event"] == "run.steer"]
    assert steer["properties"]["text"] == "use the other API"
