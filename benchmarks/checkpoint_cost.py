"""What one stage checkpoint costs, next to git doing the same commit itself.

For each repository size it builds a repository of N small files, opens a run worktree
with `add_worktree`, and then repeatedly changes a few files and measures:

  fabro        snapshot_tree (full scan) + write_commit + update_ref + a meta snapshot
  fabro-known  the same, with the changed paths passed to snapshot_tree
  git          `git add -A` + `git commit -q -m x` in the main working tree, same change

Runs are interleaved so drift (page cache, CPU frequency) hits all three alike; each
figure is the median over the repetitions after one warm-up.

    python benchmarks/checkpoint_cost.py [--files 20000 100000] [--changed 10] [--reps 7]
                                         [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabro_git.store import runs
from fabro_git.store import worktree as wt
from fabro_git.store.repo import GitRepo
from fabro_git.store.snapshot import MetaSnapshotter

EXCLUDES = ["**/node_modules/**", "**/.cache/**"]


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout.decode()


def file_path(i: int) -> str:
    # ~100 files per directory, two levels deep, like a real source tree.
    return f"src/d{i % 100:02d}/e{(i // 100) % 10}/f{i:06d}.txt"


def build_repo(root: Path, n: int) -> Path:
    """N files committed on main and checked out, via fast-import (seconds, not minutes)."""
    repo = root / "repo"
    git(root, "init", "-q", "-b", "main", str(repo))
    chunks: list[bytes] = []
    for i in range(n):
        data = f"file {i}\nsome content line\n".encode()
        chunks.append(b"blob\nmark :%d\ndata %d\n%s\n" % (i + 1, len(data), data))
    chunks.append(b"commit refs/heads/main\ncommitter Bench <bench@localhost> 1700000000 +0000\n")
    chunks.append(b"data 5\ninit\n")
    for i in range(n):
        chunks.append(b"M 100644 :%d %s\n" % (i + 1, file_path(i).encode()))
    git(repo, "fast-import", "--quiet", input=b"".join(chunks))
    git(repo, "reset", "-q", "--hard", "main")
    return repo


def change(tree: Path, n_files: int, changed: int, rep: int) -> list[str]:
    step = max(1, n_files // changed)
    paths = [file_path((k * step + rep * 7) % n_files) for k in range(changed)]
    for p in paths:
        with open(tree / p, "a") as f:
            f.write(f"rep {rep}\n")
    return paths


class Stage:
    """One run's checkpoint cycle, as the engine performs it after each stage."""

    def __init__(self, repo: GitRepo, run_id: str, worktree: Path, base: str) -> None:
        self.repo, self.run_id, self.worktree = repo, run_id, worktree
        self.run_tip = base
        self.meta = MetaSnapshotter(repo, runs.meta_ref(run_id))
        self.meta_tip = self.meta.write(
            {"manifest.json": b"{}", "graph.fabro": b"digraph {}"}, "init", expected_tip=None
        ).commit_sha
        self.seq = 0

    def checkpoint(self, paths: list[str] | None) -> None:
        self.seq += 1
        seq = self.seq
        tree = wt.snapshot_tree(self.worktree, exclude_globs=EXCLUDES, changed_paths=paths)
        snap = self.meta.write(
            {
                runs.CHECKPOINT: b'{"current_node": "work", "seq": %d}' % seq,
                runs.segment_path(seq): b'{"event": "stage.completed"}\n' * 20,
                f"nodes/work-{seq}/status.json": b'{"status": "success"}',
            },
            runs.snapshot_subject_checkpoint("work", seq),
            expected_tip=self.meta_tip,
        )
        self.meta_tip = snap.commit_sha
        sha = self.repo.write_commit(
            tree=tree,
            parents=[self.run_tip],
            message=runs.run_commit_message(self.run_id, "work", "succeeded", seq, snap.commit_sha),
        )
        self.repo.update_ref(
            runs.run_branch_ref(self.run_id), sha, old=self.run_tip, message="fabro: checkpoint"
        )
        self.run_tip = sha


def timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def bench(n_files: int, changed: int, reps: int, where: str | None) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix=f"fabro-bench-{n_files}-", dir=where))
    try:
        t0 = time.perf_counter()
        repo_path = build_repo(root, n_files)
        build_s = time.perf_counter() - t0
        repo = GitRepo.discover(repo_path)
        run_id = runs.new_ulid()
        base = repo.require_base().sha
        assert base is not None
        repo.update_ref(runs.run_branch_ref(run_id), base, old=None, message="fabro: start")
        t0 = time.perf_counter()
        worktree = root / "scratch" / run_id / "worktree"
        wt.add_worktree(repo, worktree, branch=runs.run_branch_name(run_id), commit=base)
        worktree_s = time.perf_counter() - t0
        print(
            f"  {n_files} files: repo built in {build_s:.1f}s, worktree added in {worktree_s:.1f}s",
            flush=True,
        )

        stage = Stage(repo, run_id, worktree, base)

        def git_commit() -> None:
            git(repo_path, "add", "-A")
            git(repo_path, "commit", "-q", "-m", "x")

        samples: dict[str, list[float]] = {"fabro": [], "fabro-known": [], "git": []}
        t0 = time.perf_counter()
        for rep in range(reps + 1):
            change(worktree, n_files, changed, 3 * rep)
            full = timed(stage.checkpoint, None)
            paths = change(worktree, n_files, changed, 3 * rep + 1)
            known = timed(stage.checkpoint, paths)
            change(repo_path, n_files, changed, 3 * rep + 2)
            plain = timed(git_commit)
            if rep:  # the first round warms caches and builds the untracked cache
                samples["fabro"].append(full)
                samples["fabro-known"].append(known)
                samples["git"].append(plain)
        print(
            f"  {n_files} files: {reps + 1} rounds in {time.perf_counter() - t0:.1f}s", flush=True
        )
        repo.close()
        status = git(worktree, "status", "--porcelain")
        assert status == "", f"worktree not clean after checkpoints:\n{status}"
        return {k: statistics.median(v) for k, v in samples.items()}
    finally:
        t0 = time.perf_counter()
        shutil.rmtree(root, ignore_errors=True)
        print(f"  {n_files} files: cleaned up in {time.perf_counter() - t0:.1f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--dir",
        default=None,
        help="where to build the repositories (default: the temp dir; /dev/shm takes "
        "disk contention out of the figures)",
    )
    args = parser.parse_args()
    os.environ.setdefault("GIT_AUTHOR_NAME", "Bench")
    os.environ.setdefault("GIT_AUTHOR_EMAIL", "bench@localhost")
    os.environ.setdefault("GIT_COMMITTER_NAME", "Bench")
    os.environ.setdefault("GIT_COMMITTER_EMAIL", "bench@localhost")
    print(
        f"git {git(Path.cwd(), '--version').split()[-1]}, {os.cpu_count()} cpus, "
        f"{args.changed} files changed per stage, median of {args.reps}"
    )
    rows = []
    for n in args.files:
        rows.append((n, bench(n, args.changed, args.reps, args.dir)))
    print()
    print(
        f"{'files':>8}  {'git add+commit':>15}  {'fabro':>8}  {'ratio':>6}  {'fabro-known':>12}  {'ratio':>6}"
    )
    for n, r in rows:
        print(
            f"{n:>8}  {r['git'] * 1000:>13.0f}ms  {r['fabro'] * 1000:>6.0f}ms  "
            f"{r['fabro'] / r['git']:>5.2f}x  {r['fabro-known'] * 1000:>10.0f}ms  "
            f"{r['fabro-known'] / r['git']:>5.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
