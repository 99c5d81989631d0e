"""Run every benchmark in this folder, one after another, with default settings.

Each prints its own figures as ratios against git doing the same work in the same run,
because absolute times on shared machines drift.

    python benchmarks/run_all.py [--quick]
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    plans = [
        ["startup.py"],
        ["pipeline.py", *(["--reps", "2"] if quick else [])],
        ["ps_many.py", *(["--reps", "2"] if quick else [])],
        ["checkpoint_cost.py", *(["--files", "20000", "--reps", "3"] if quick else [])],
        ["long_run.py", *(["--stages", "300"] if quick else [])],
        ["files_touched.py", *(["--files", "20000", "--reps", "3"] if quick else [])],
        ["validate_scale.py", *(["--small", "2000", "--large", "20000"] if quick else [])],
        ["big_output.py", *(["--mb", "100"] if quick else [])],
        ["offload_50mb.py", *(["--mb", "10"] if quick else [])],
    ]
    if importlib.util.find_spec("ray") is not None:  # the Ray extra: pip install '.[ray]'
        plans.append(["batch.py", *(["--quick"] if quick else [])])
    for plan in plans:
        print(f"== {plan[0]}", flush=True)
        subprocess.run([sys.executable, str(HERE / plan[0]), *plan[1:]], check=True)


if __name__ == "__main__":
    main()
