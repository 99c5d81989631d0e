"""What `files_touched` of an agent CLI stage costs, next to `git status --porcelain`.

An agent CLI edits files with its own tools, so the stage tells what it touched from two
snapshots of the worktree's dirty set, one before the CLI runs and one after
(`fabro_git.store.touched`). On a repository of N files, round after round, this
changes `--changed` files (half edited, half created) and times, interleaved:

  git status   `git status --porcelain` on the tree after the change (the baseline)
  fabro        the snapshot before the change, plus the snapshot after and the diff
  fabro-after  the snapshot after and the diff alone (what the stage waits for once
               the CLI has exited)

`git status` runs in its own copy of the repository, built the same way and given the
same changes, so each keeps the index it would have on its own: fabro's scans store
git's untracked cache in the worktree's index (`core.untrackedCache`), which a plain
checkout does not have, and which `git status` would otherwise also read. Between
rounds both copies commit the change with `git add -A` and `git commit`, as the
stage's checkpoint would. Figures are medians after one warm-up round.

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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", default=None, help="where to build the repository")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="fabro-touched-", dir=args.dir))
    try:
        print(f"building {args.files} files in {root} ...", flush=True)
        (root / "git").mkdir()
        (root / "fabro").mkdir()
        plain = build_repo(root / "git", args.files)
        repo = build_repo(root / "fabro", args.files)
        status, fabro, after_only = [], [], []
        for rep in range(args.reps + 1):
            start = time.perf_counter()
            before = take_snapshot(repo)
            taken_before = time.perf_counter() - start
            expected = change(repo, args.files, args.changed, rep)
            change(plain, args.files, args.changed, rep)

            start = time.perf_counter()
            subprocess.run(["git", "status", "--porcelain"], cwd=plain, capture_output=True)
            git_time = time.perf_counter() - start

            start = time.perf_counter()
            after = take_snapshot(repo, keep_cache=False)  # as the stage takes it
            found = touched_paths(repo, before, after, limit=10_000)
            taken_after = time.perf_counter() - start
            if set(found) != expected:
                raise SystemExit(f"wrong files_touched: {sorted(found)} != {sorted(expected)}")

            for tree in (plain, repo):
                git(tree, "add", "-A")
                git(tree, "commit", "-q", "-m", f"rep {rep}")
            if rep == 0:
                continue  # warm-up
            status.append(git_time)
            fabro.append(taken_before + taken_after)
            after_only.append(taken_after)
        base = statistics.median(status)
        total = statistics.median(fabro)
        tail = statistics.median(after_only)
        # The median of each round's own ratio: load that comes and goes between rounds
        # (a shared machine) moves both sides of a round alike.
        ratio = statistics.median(f / g for f, g in zip(fabro, status, strict=True))
        tail_ratio = statistics.median(a / g for a, g in zip(after_only, status, strict=True))
        print(f"files {args.files}, {args.changed} changed, median of {args.reps}")
        print(f"git status --porcelain  {base * 1000:8.1f} ms")
        print(f"fabro (before+after)    {total * 1000:8.1f} ms   {ratio:.2f}x (target < 1.5x)")
        print(f"fabro-after             {tail * 1000:8.1f} ms   {tail_ratio:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
