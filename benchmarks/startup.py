"""How long `git-fabro --version` takes, next to the bare interpreter and to git.

The version probe must stay fast (target: under 100 ms), which holds only while the
heavy imports (typer, trio, dulwich, msgspec) stay lazy. Also times `git-fabro -h`,
which does load the CLI.

    python benchmarks/startup.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from installed import fabro_exe


def median_time(argv: list[str], reps: int) -> float:
    subprocess.run(argv, capture_output=True, check=True)
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    exe = fabro_exe()
    # Run the console script with this interpreter directly: version managers' shims
    # (pyenv) add their own start-up to whatever is measured through PATH.
    script = [sys.executable, exe]
    python = median_time([sys.executable, "-c", "pass"], args.reps)
    version = median_time([*script, "--version"], args.reps)
    short_help = median_time([*script, "-h"], args.reps)
    git = median_time(["git", "--version"], args.reps)
    print(f"python -c pass        {python * 1000:7.1f} ms")
    print(f"git --version         {git * 1000:7.1f} ms")
    print(
        f"git-fabro --version   {version * 1000:7.1f} ms   ({version / python:.2f}x the bare interpreter; target < 100 ms)"
    )
    print(f"git-fabro -h          {short_help * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
