"""What `files_touched` of an agent CLI stage costs, next to `git status --porcelain`.

An agent CLI edits files with its own tools, so the stage tells what it touched from
the worktree before and after it runs. When the stage comes right after a checkpoint
that scanned the worktree (and nothing ran in between: `fabro_git.engine.clean_start`),
the "before" is the run tip's tree, known without a scan, and the "after" is the
stage's own checkpoint scan (`git add -A`, `git write-tree`), which every stage pays
anyway, diffed against that tree. Otherwise the stage snapshots the worktree's dirty
set before and after (`fabro_git.store.touched`), as it always did.

On a repository of N files, round after round, this makes `--changed` changes (half
edited, half created) in three identical copies and times, interleaved:

  git status    `git status --porcelain` on the tree after the change (the baseline)
  checkpoint    what a stage on the checkpoint path pays for files_touched on top of its
                checkpoint: checking that the index is the one the last checkpoint left
                (one `stat`), reading the tip's tree and diffing it against the stage
                tree (the cost follows the change). NOT counted: the checkpoint's scan,
                which every stage pays whether it wants files_touched or not; it is
                timed on its own ("scan") so that nothing is hidden in it.
  snapshots     the fall-back path: the snapshot before the change, plus the snapshot
                after and the diff (what the stage paid on every run before)

Each copy keeps the index it would have on its own: the two fabro copies get the index
a run's worktree is made with (version 4, with git's untracked cache), which a plain
checkout does not have, and which `git status` would otherwise also read. Between rounds the checkpoint
copies are recorded as a checkpoint would record them: the stage tree (`git add -A`,
`git write-tree`, timed as "scan" on both) committed without touching the index;
`git status`'s copy is committed with `git add -A` and `git commit`. The paths found
are checked against the paths changed. Figures are medians after one warm-up round;
ratios are the median of each round's own ratio.

    python benchmarks/files_touched.py [--files 100000] [--changed 10] [--reps 7] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint_cost import build_repo, file_path, git

from fabro_git.store import statcheck
from fabro_git.store import worktree as wt
from fabro_git.store.repo import GitRepo
from fabro_git.store.touched import take_snapshot, touched_paths


def change(tree: Path, n_files: int, changed: int, rep: int) -> set[str]:
    edited = changed - changed // 2
    step = max(1, n_files // max(1, edited))
    paths = {file_path((k * step + rep * 7) % n_files) for k in range(edited)}
    for path in paths:
        with open(tree / path, "a") as fh:
            fh.write(f"rep {rep}\n")
    for k in range(changed // 2):
        new = f"src/new/r{rep}/n{k}.txt"
        (tree / new).parent.mkdir(parents=True, exist_ok=True)
        (tree / new).write_text(f"new {rep} {k}\n")
        paths.add(new)
    return paths


def record(tree: Path, rep: int) -> tuple[str, float]:
    """A checkpoint's recording of the worktree: the stage tree (timed), then a commit
    of it on HEAD's branch that leaves the index alone. Returns the tree and the time."""
    start = time.perf_counter()
    stage_tree = wt.snapshot_tree(tree)
    scan = time.perf_counter() - start
    parent = git(tree, "rev-parse", "HEAD").strip()
    commit = git(tree, "commit-tree", stage_tree, "-p", parent, "-m", f"rep {rep}").strip()
    git(tree, "update-ref", "HEAD", commit, parent)
    return stage_tree, scan


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", default=None, help="where to build the repositories")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="fabro-touched-", dir=args.dir))
    try:
        print(f"building 3 x {args.files} files in {root} ...", flush=True)
        copies = {}
        for name in ("git", "checkpoint", "snapshots"):
            (root / name).mkdir()
            copies[name] = build_repo(root / name, args.files)
        plain, fast, snap = copies["git"], copies["checkpoint"], copies["snapshots"]
        for tree in (fast, snap):
            # The index a run's worktree is made with (`store.worktree`).
            git(tree, "update-index", "--index-version", "4", "--untracked-cache")
        repo = GitRepo.discover(fast)
        # The checkpoint before the first stage: it scanned, and left its index.
        tip_tree, _ = record(fast, -1)
        stamp = statcheck.index_stamp(fast)
        rows: dict[str, list[float]] = {k: [] for k in ("git", "fast", "scan", "snap", "snapscan")}
        for rep in range(args.reps + 1):
            start = time.perf_counter()
            before = take_snapshot(snap)
            snap_before = time.perf_counter() - start
            expected = change(fast, args.files, args.changed, rep)
            change(snap, args.files, args.changed, rep)
            change(plain, args.files, args.changed, rep)

            start = time.perf_counter()
            subprocess.run(["git", "status", "--porcelain"], cwd=plain, capture_output=True)
            git_time = time.perf_counter() - start

            # The checkpoint path: the stage's "before" check, its checkpoint's scan (not
            # counted), then the tree diff.
            start = time.perf_counter()
            clean = statcheck.index_stamp(fast) == stamp
            fast_before = time.perf_counter() - start
            if not clean:
                raise SystemExit("the index moved since the last checkpoint")
            tip = git(fast, "rev-parse", "HEAD").strip()
            new_tree, scan = record(fast, rep)
            start = time.perf_counter()
            old_tree = repo.commit_info(tip).tree
            found = repo.changed_paths(old_tree, new_tree, limit=10_000)
            fast_after = time.perf_counter() - start
            if set(found) != expected:
                raise SystemExit(f"wrong files_touched: {sorted(found)} != {sorted(expected)}")
            assert old_tree == tip_tree
            tip_tree, stamp = new_tree, statcheck.index_stamp(fast)

            # The snapshot path, as before.
            start = time.perf_counter()
            after = take_snapshot(snap, keep_cache=False)
            found = touched_paths(snap, before, after, limit=10_000)
            snap_after = time.perf_counter() - start
            if set(found) != expected:
                raise SystemExit(f"wrong files_touched: {sorted(found)} != {sorted(expected)}")
            _, snap_scan = record(snap, rep)

            git(plain, "add", "-A")
            git(plain, "commit", "-q", "-m", f"rep {rep}")
            if rep == 0:
                continue  # warm-up
            rows["git"].append(git_time)
            rows["fast"].append(fast_before + fast_after)
            rows["scan"].append(scan)
            rows["snap"].append(snap_before + snap_after)
            rows["snapscan"].append(snap_scan)

        def ratio(key: str) -> float:
            # The median of each round's own ratio: load that comes and goes between
            # rounds (a shared machine) moves both sides of a round alike.
            return statistics.median(a / g for a, g in zip(rows[key], rows["git"], strict=True))

        def ms(key: str) -> float:
            return statistics.median(rows[key]) * 1000

        print(f"files {args.files}, {args.changed} changed, median of {args.reps}")
        print(f"git status --porcelain         {ms('git'):8.1f} ms")
        print(
            f"checkpoint path (on top)       {ms('fast'):8.1f} ms   {ratio('fast'):.3f}x"
            " (target < 1.5x)"
        )
        print(
            f"  its checkpoint's scan        {ms('scan'):8.1f} ms   {ratio('scan'):.2f}x (not counted)"
        )
        print(f"snapshots (before + after)     {ms('snap'):8.1f} ms   {ratio('snap'):.2f}x")
        print(
            f"  its checkpoint's scan        {ms('snapscan'):8.1f} ms   {ratio('snapscan'):.2f}x (not counted)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
