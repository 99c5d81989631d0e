"""No run reports success without its objects, and a run with a missing object is met
with a clear error by `dump`, `show` and `fork`, and listed by `doctor`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import drop_object, git, run_fabro, write_workflow

# s2 deletes the loose tree of the checkpoint before it (the run wrote it), as a
# `git gc --prune=now` racing the checkpoint can.
LOSES_A_TREE = r"""digraph Lost {
  start [shape=Mdiamond]
  exit [shape=Msquare]
  s1 [shape=parallelogram, script="echo one > one.txt"]
  s2 [shape=parallelogram, script="t=$(git rev-parse HEAD^{tree}); d=$(git rev-parse --git-common-dir)/objects/$(echo $t | cut -c1-2)/$(echo $t | cut -c3-); rm -f $d; echo $t > lost.txt"]
  start -> s1 -> s2 -> exit
}
"""


# s2 deletes the loose status.json blob of s1, which the run wrote itself: it still
# holds its bytes, so it writes it again before it says it succeeded.
LOSES_A_BLOB = LOSES_A_TREE.replace(
    "t=$(git rev-parse HEAD^{tree})",
    "t=$(git rev-parse refs/fabro/meta/$FABRO_RUN_ID:nodes/s1/status.json)",
)


def _present(repo: Path, sha: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", sha], cwd=repo).returncode == 0


@pytest.mark.parametrize("workflow", [LOSES_A_TREE, LOSES_A_BLOB], ids=["tree", "blob"])
def test_a_run_whose_objects_went_missing_does_not_report_success(
    repo: Path, workflow: str
) -> None:
    write_workflow(repo, workflow)
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    run_id = result["run_id"]
    tip = git(repo, "rev-parse", f"fabro/run/{run_id}").strip()
    lost = git(repo, "show", f"{tip}:lost.txt").strip()
    if workflow is LOSES_A_BLOB:
        assert result["status"] == "succeeded", proc.stderr
    if result["status"] == "succeeded":
        # Written again from what the run still held: the history is whole.
        assert _present(repo, lost), "the run succeeded without an object it wrote"
        fsck = subprocess.run(["git", "fsck", "--connectivity-only"], cwd=repo, capture_output=True)
        assert fsck.returncode == 0, fsck.stderr
    else:
        assert proc.returncode == 1
        assert lost in proc.stderr and "missing" in proc.stderr, proc.stderr


def _run_with_a_missing_blob(repo: Path) -> tuple[str, str]:
    write_workflow(
        repo,
        "digraph M {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  s1 [shape=parallelogram, script="echo one > one.txt"]\n'
        '  s2 [shape=parallelogram, script="echo two > two.txt"]\n'
        "  start -> s1 -> s2 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    blob = git(repo, "rev-parse", f"refs/fabro/meta/{run_id}:nodes/s1/script.sh").strip()
    drop_object(repo, blob)
    return run_id, blob


def test_dump_show_fork_and_doctor_meet_a_missing_object_clearly(
    repo: Path, tmp_path: Path
) -> None:
    run_id, blob = _run_with_a_missing_blob(repo)
    for args in (
        ["dump", run_id, "-o", str(tmp_path / "dumped")],
        ["show", run_id, "s1"],
        ["fork", run_id, "s2"],
    ):
        proc = run_fabro(*args, cwd=repo)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and "bug" not in proc.stderr, proc.stderr
        assert f"run {run_id}" in proc.stderr and blob in proc.stderr, proc.stderr
        assert "git fabro fetch" in proc.stderr and "rewind" in proc.stderr, proc.stderr
    doctor = run_fabro("doctor", cwd=repo)
    assert doctor.returncode == 1, doctor.stdout
    assert run_id in doctor.stdout and blob in doctor.stdout, doctor.stdout
