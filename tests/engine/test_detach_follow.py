"""`run -d` then `logs -f` / `ps` straight away: the run counts as live while its
detached process starts, so following it shows the whole run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import run_fabro, start_fabro, write_workflow

SLOW_START = """\
digraph D {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    one [shape=parallelogram, script="echo one"]
    two [shape=parallelogram, script="echo two"]
    start -> one -> two -> exit
}
"""


class HeldChild:
    """An environment in which the detached child's Python holds at its start until the
    test lets it go: it is late to take the run's lock for as long as the test needs,
    whatever the machine's speed."""

    def __init__(self, tmp_path: Path) -> None:
        site = tmp_path / "held-site"
        site.mkdir()
        self.gate = tmp_path / "let-the-child-go"
        (site / "sitecustomize.py").write_text(
            "import os, sys, time\n"
            "if '--detached-child' in sys.argv:\n"
            f"    while not os.path.exists({str(self.gate)!r}):\n"
            "        time.sleep(0.01)\n"
        )
        self.env = {"PYTHONPATH": str(site)}

    def let_go(self) -> None:
        self.gate.touch()


def test_logs_follow_right_after_detach_sees_the_end(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, SLOW_START)
    child = HeldChild(tmp_path)
    started = run_fabro("run", "wf.fabro", "-d", cwd=repo, env=child.env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    # Following at once must wait for the late child rather than give up on a run that
    # nobody seems to execute: the child goes only once `logs -f` shows the run.
    follow = start_fabro(
        ["logs", run_id, "-f"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    try:
        first = follow.stdout.readline()
    finally:
        child.let_go()
    rest, err = follow.communicate(timeout=120)
    assert follow.returncode == 0, err
    names = [json.loads(line)["event"] for line in (first + rest).splitlines()]
    assert names[0] == "run.created"
    assert names.count("run.completed") == 1
    assert names.index("run.completed") > names.index("stage.completed")
    ps = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])
    assert ps["status"] == "succeeded"


def test_ps_right_after_detach_does_not_call_it_interrupted(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, SLOW_START)
    child = HeldChild(tmp_path)
    run_id = run_fabro("run", "wf.fabro", "-d", cwd=repo, env=child.env).stdout.strip()
    try:
        row = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])
    finally:
        child.let_go()
    assert row["run_id"] == run_id
    assert row["status"] == "running"
    run_fabro("logs", run_id, "-f", cwd=repo, timeout=120)


def test_detach_warns_about_gates_it_cannot_ask(repo: Path) -> None:
    proc = run_fabro("run", "human-gate", "-d", cwd=repo)
    assert proc.returncode == 0
    assert "human gates (review)" in proc.stderr and "--auto-approve" in proc.stderr
    assert "git fabro attach" in proc.stderr
    # The gate waits for an attached answer (here piped in).
    attached = run_fabro("attach", proc.stdout.strip(), cwd=repo, input="A\n", timeout=120)
    assert attached.returncode == 0, attached.stderr
    quiet = run_fabro("run", "human-gate", "-d", "--auto-approve", cwd=repo)
    assert quiet.returncode == 0, quiet.stderr
    assert "human gates" not in quiet.stderr
    followed = run_fabro("logs", quiet.stdout.strip(), "-f", cwd=repo, timeout=120)
    assert '"event":"run.completed"' in followed.stdout.replace(" ", ""), followed.stdout[-500:]


def test_a_detached_run_is_not_called_resumed(repo: Path, tmp_path: Path) -> None:
    """`run -d` starts its run in a child process that loads it from git: that is the
    run's start, not a resume; a real resume still says it is one."""
    go = tmp_path / "go"
    write_workflow(repo, SLOW_START.replace('script="echo two"', f'script="test -e {go}"'))
    started = run_fabro("run", "wf.fabro", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert run_fabro("wait", run_id, cwd=repo, timeout=120).returncode == 1
    pretty = run_fabro("logs", run_id, "--pretty", cwd=repo).stdout
    assert "run.started" in pretty and "resum" not in pretty, pretty
    go.touch()
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert "note: resuming from checkpoint after two; next: two" in resumed.stderr
