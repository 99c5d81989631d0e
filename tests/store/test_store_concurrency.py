"""Several processes writing to one repository at once: every run's refs come out
right and the object database stays clean."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers import git

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fabro_git.store.repo import GitRepo
    from fabro_git.store.snapshot import MetaSnapshotter
    from fabro_git.store import runs
    from fabro_git.store.worktree import add_worktree, remove_worktree, snapshot_tree

    repo_path, run_id, scratch, start_at, rounds = sys.argv[1:6]
    rounds = int(rounds)
    repo = GitRepo.discover(Path(repo_path))
    base = repo.require_base().sha
    repo.update_ref(runs.run_branch_ref(run_id), base, old=None, message="fabro: start")
    path = Path(scratch) / run_id / "worktree"
    add_worktree(repo, path, branch=runs.run_branch_name(run_id), commit=base)
    meta = MetaSnapshotter(repo, runs.meta_ref(run_id))
    while time.time() < float(start_at):
        time.sleep(0.005)
    meta_tip = meta.write({"manifest.json": b'{"same": "for everyone"}'}, "init", expected_tip=None).commit_sha
    run_tip = base
    for i in range(rounds):
        # Shared content on purpose: every process writes the same blobs and trees
        # at about the same moment.
        (path / "shared.txt").write_text(f"round {i}\\n")
        (path / f"own-{run_id}.txt").write_text(f"{run_id} {i}\\n")
        tree = snapshot_tree(path)
        meta_tip = meta.write(
            {
                f"events/{i + 1:06d}.jsonl": f'{{"round": {i}}}\\n'.encode(),
                "nodes/work/status.json": f'{{"round": {i}}}'.encode(),
                "checkpoint.json": f'{{"run": "{run_id}", "round": {i}}}'.encode(),
            },
            f"checkpoint work@{i + 1}",
            expected_tip=meta_tip,
        ).commit_sha
        commit = repo.write_commit(
            tree=tree,
            parents=[run_tip],
            message=f"fabro({run_id}): work (succeeded)\\n\\nFabro-Run: {run_id}\\nFabro-Checkpoint: {meta_tip}\\n",
        )
        repo.update_ref(runs.run_branch_ref(run_id), commit, old=run_tip, message="fabro: checkpoint")
        run_tip = commit
    remove_worktree(repo, path)
    repo.close()
    print(run_id, meta_tip, run_tip)
    """
)


def test_concurrent_runs_in_one_repository(repo: Path, tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    run_ids = [f"01CONCURRENT{n:014d}" for n in range(4)]
    rounds = 12
    start_at = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(repo),
                rid,
                str(tmp_path / "scratch"),
                str(start_at),
                str(rounds),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rid in run_ids
    ]
    results = {}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
        rid, meta_tip, run_tip = stdout.split()
        results[rid] = (meta_tip, run_tip)

    for rid, (meta_tip, run_tip) in results.items():
        assert git(repo, "rev-parse", f"refs/fabro/meta/{rid}").strip() == meta_tip
        assert git(repo, "rev-parse", f"refs/heads/fabro/run/{rid}").strip() == run_tip
        # Each run's history is its own, complete and in order.
        subjects = git(repo, "log", "--format=%s", f"refs/fabro/meta/{rid}").splitlines()
        assert subjects == [f"checkpoint work@{i}" for i in range(rounds, 0, -1)] + ["init"]
        assert len(git(repo, "rev-list", f"main..fabro/run/{rid}").split()) == rounds
        assert git(repo, "show", f"fabro/run/{rid}:own-{rid}.txt") == f"{rid} {rounds - 1}\n"
        assert (
            git(repo, "show", f"refs/fabro/meta/{rid}:events/{rounds:06d}.jsonl")
            == f'{{"round": {rounds - 1}}}\n'
        )
        assert len(git(repo, "reflog", "show", f"refs/fabro/meta/{rid}").splitlines()) == rounds + 1
    proc = subprocess.run(
        ["git", "fsck", "--strict", "--no-dangling"], cwd=repo, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert not list((repo / ".git" / "objects").glob("??/tmp_obj_*"))
    assert not list((repo / ".git").rglob("*.lock"))
    assert git(repo, "worktree", "list").count("\n") == 1
