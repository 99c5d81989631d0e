"""What the asset capture costs a command stage, next to `git status` on the same tree.

Builds a repository of N tracked files in directories of 100 (plus a `node_modules`
of 5,000 files the scan must skip, and a few asset files), then times, interleaved,
one `assets.baseline` (the scan before a command, hashing what it could copy), one
`assets.capture` (the scan after it) and `git status --porcelain`. Medians after a
warm-up round.

    python benchmarks/asset_scan.py [--files 100000] [--reps 7] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def build(root: Path, files: int) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for n in range(files):
        directory = root / "src" / f"m{n // 10_000}" / f"d{n // 100}"
        if n % 100 == 0:
            directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{n % 100}.txt").write_text("x")
    cache = root / "node_modules" / "pkg"
    cache.mkdir(parents=True)
    for n in range(5_000):
        (cache / f"f{n}.js").write_text("x")
    (root / ".gitignore").write_text("node_modules/\ntest-results/\n")
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    env = ["-c", "user.name=b", "-c", "user.email=b@example.com"]
    subprocess.run(["git", *env, "commit", "-q", "-m", "tree"], cwd=root, check=True)
    (root / "test-results").mkdir()
    for n in range(20):
        (root / "test-results" / f"shot{n}.png").write_bytes(b"p" * 50_000)
    (root / "src" / "m0" / "d0" / "junit.xml").write_text("<testsuite/>")


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    from fabro_git.outputs import assets

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as temp:
        root = Path(temp) / "repo"
        build(root, args.files)
        status = ["git", "-C", str(root), "status", "--porcelain"]
        samples: dict[str, list[float]] = {"baseline": [], "capture": [], "git status": []}
        for rep in range(args.reps + 1):
            before = assets.baseline(root)
            figures = {
                "baseline": timed(assets.baseline, root),
                "capture": timed(assets.capture, root, before),
                "git status": timed(subprocess.run, status, capture_output=True),
            }
            if rep:
                for name, seconds in figures.items():
                    samples[name].append(seconds)
        git = statistics.median(samples["git status"])
        for name, values in samples.items():
            median = statistics.median(values)
            print(f"{name:<11} {median * 1000:8.1f} ms  ({median / git:.2f}x git status)")


if __name__ == "__main__":
    main()
