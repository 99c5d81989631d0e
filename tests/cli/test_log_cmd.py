"""`git fabro log [RUN] [git log options]`: git log over runs' metadata refs, with the
rest of the command line handed to git as argv."""

from __future__ import annotations

from pathlib import Path

from helpers import git, run_fabro, run_json, write_workflow

WORKFLOW = """\
digraph Two {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    step  [shape=parallelogram, script="echo one > one.txt"]
    start -> step -> exit
}
"""


def test_log_shows_a_runs_metadata_history_and_passes_args_as_argv(repo: Path) -> None:
    write_workflow(repo, WORKFLOW)
    first = run_json("run", "wf.fabro", cwd=repo)[1]["run_id"]
    second = run_json("run", "wf.fabro", cwd=repo)[1]["run_id"]
    proc = run_fabro("log", first, "--format=%H", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    expected = git(repo, "rev-list", f"refs/fabro/meta/{first}").split()
    assert proc.stdout.split() == expected
    everyone = run_fabro("log", "--format=%H", cwd=repo)
    assert everyone.returncode == 0, everyone.stderr
    both = git(repo, "rev-list", f"refs/fabro/meta/{first}", f"refs/fabro/meta/{second}")
    assert sorted(everyone.stdout.split()) == sorted(both.split())
    # Arguments are git's argv, never a shell's.
    odd = run_fabro("log", first, "-1", "--format=$(touch pwned) %s;", cwd=repo)
    assert odd.returncode == 0, odd.stderr
    assert odd.stdout.startswith("$(touch pwned) ")
    assert not (repo / "pwned").exists()
    missing = run_fabro("log", "nosuchrun", cwd=repo)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
