"""What a person sees of a run on stderr: output tails, one line per failure, and at
the end where the result is."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import git, run_fabro, write_workflow

FAILING = """\
digraph F {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    t [shape=parallelogram, script="echo building; echo 'boom: it broke' >&2; exit 3"]
    start -> t -> exit
}
"""


def test_a_run_ends_by_saying_where_its_result_is(repo: Path) -> None:
    proc = run_fabro("run", "hello", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("run "))
    branch = f"fabro/run/{run_id}"
    commits = int(git(repo, "rev-list", "--count", f"main..{branch}").strip())
    assert f"Result: branch {branch}, {commits} commits, 1 file changed" in proc.stderr
    assert f"git merge --squash {branch}" in proc.stderr
    assert f"git fabro diff {run_id[:12]}" in proc.stderr
    assert f"git fabro logs {run_id[:12]} --pretty" in proc.stderr
    # The shipped example's second stage prints the file it wrote: its tail is shown.
    assert "    │ Hello from git fabro!" in proc.stderr
    for noise in ("via unconditional", "stage(s)", "Start (start)", "Exit (exit)"):
        assert noise not in proc.stderr


def test_quiet_hides_output_and_json_skips_the_summary(repo: Path) -> None:
    quiet = run_fabro("run", "hello", "--quiet", cwd=repo)
    assert quiet.returncode == 0 and "│" not in quiet.stderr
    as_json = run_fabro("run", "hello", "--json", cwd=repo)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout.splitlines()[-1])["status"] == "succeeded"
    assert "Result: branch" not in as_json.stderr
    both = run_fabro("run", "hello", "-q", "-v", cwd=repo)
    assert both.returncode == 1 and "contradict" in both.stderr


def test_a_failure_is_printed_once_with_its_stderr(repo: Path) -> None:
    write_workflow(repo, FAILING)
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 1
    assert proc.stderr.count("exited with status 3") == 1, proc.stderr
    assert "    │ boom: it broke" in proc.stderr
    assert "deterministic" not in proc.stderr
    assert "git fabro resume" in proc.stderr and "Traceback" not in proc.stderr
