"""Two clones on one machine that both hold a run keep separate scratch dirs.

The scratch dir is `runs/<run id>-<repository key>/`, so clone B resuming a run that
clone A also resumes gets its own worktree and its own event tail: neither log picks up
the other's events.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import assert_fsck_clean, bare_remote, git, run_fabro

WORKFLOW = """\
digraph Twice {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    make  [shape=parallelogram, script="echo made > made.txt"]
    check [shape=parallelogram, script="test -f \\"$HOME/ok\\""]
    start -> make -> check -> exit
}
"""


def _ids(data: str) -> list[str]:
    return [json.loads(line)["id"] for line in data.splitlines() if line.strip()]


def _log_ids(repo: Path, run_id: str) -> list[str]:
    proc = run_fabro("logs", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return _ids(proc.stdout)


def _inspect(repo: Path, run_id: str) -> dict:
    proc = run_fabro("inspect", run_id, "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_two_clones_resuming_one_run_keep_their_own_scratch(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    workflow = tmp_path / "twice.fabro"
    workflow.write_text(WORKFLOW)
    first = run_fabro("run", str(workflow), "--json", cwd=repo)
    assert first.returncode == 1, first.stderr
    run_id = json.loads(first.stdout.splitlines()[-1])["run_id"]
    origin = bare_remote(tmp_path, origin_of=repo)
    assert run_fabro("push", "origin", run_id, cwd=repo).returncode == 0
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    assert run_fabro("fetch", "origin", cwd=clone).returncode == 0
    shared = set(_log_ids(clone, run_id))  # what both clones start from

    (hermetic_env / "ok").write_text("")
    for where in (repo, clone):
        resumed = run_fabro("resume", run_id, "--json", cwd=where)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "succeeded"

    scratch_a = Path(_inspect(repo, run_id)["scratch_dir"])
    scratch_b = Path(_inspect(clone, run_id)["scratch_dir"])
    assert scratch_a != scratch_b
    assert scratch_a.parent == scratch_b.parent
    assert {scratch_a.name, scratch_b.name} == {
        p.name for p in scratch_a.parent.glob(f"{run_id}-*")
    }

    ids_a, ids_b = _log_ids(repo, run_id), _log_ids(clone, run_id)
    only_a, only_b = set(ids_a) - shared, set(ids_b) - shared
    assert only_a and only_b and not only_a & only_b
    tail_a = set(_ids((scratch_a / "events.jsonl").read_text()))
    tail_b = set(_ids((scratch_b / "events.jsonl").read_text()))
    # B never had a tail before its resume: it holds B's events and nothing of A's.
    assert tail_b <= only_b and tail_b
    assert tail_a <= set(ids_a) and not tail_a & only_b
    # Each resume worked in its own scratch dir.
    for ids, scratch, where in ((only_a, scratch_a, repo), (only_b, scratch_b, clone)):
        proc = run_fabro("logs", run_id, cwd=where)
        started = [
            e
            for e in map(json.loads, proc.stdout.splitlines())
            if e["event"] == "run.started" and e["id"] in ids
        ]
        assert [Path(e["properties"]["worktree_dir"]).parent for e in started] == [scratch]
    assert git(clone, "show", f"fabro/run/{run_id}:made.txt") == "made\n"
    assert_fsck_clean(repo)
    assert_fsck_clean(clone)


def test_a_moved_repository_resumes_its_run(repo: Path, tmp_path: Path, hermetic_env: Path) -> None:
    """The key follows the repository's path: after a move the run gets a new scratch
    dir, and the checkout under the old one (which git still lists) must not block it."""
    workflow = tmp_path / "twice.fabro"
    workflow.write_text(WORKFLOW)
    first = run_fabro("run", str(workflow), "--json", cwd=repo)
    assert first.returncode == 1, first.stderr
    run_id = json.loads(first.stdout.splitlines()[-1])["run_id"]
    old_scratch = Path(_inspect(repo, run_id)["scratch_dir"])
    # A failed run releases its worktree; a killed one leaves it checked out, as here.
    assert not (old_scratch / "worktree").exists()
    git(repo, "worktree", "add", "-q", str(old_scratch / "worktree"), f"fabro/run/{run_id}")
    assert (old_scratch / "worktree" / "made.txt").is_file()

    moved = tmp_path / "moved"
    repo.rename(moved)
    (hermetic_env / "ok").write_text("")
    resumed = run_fabro("resume", run_id, "--json", cwd=moved)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "succeeded"
    assert Path(_inspect(moved, run_id)["scratch_dir"]) != old_scratch
    assert not (old_scratch / "worktree").exists()
    assert git(moved, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert_fsck_clean(moved)
