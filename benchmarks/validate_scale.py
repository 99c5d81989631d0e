"""How parse + validate time grows with the size of a workflow.

Two shapes, each at a small and a large size (10k and 100k nodes by default):

  chain    start -> n_0 -> n_1 -> ... -> exit
  fan-out  start -> n_i -> exit, for every i

Each size is parsed (`workflow.load`, stylesheet included) and validated in process and
timed in CPU seconds, which other jobs on a shared machine disturb less than wall time;
`git fabro validate` is run on the large chain as a whole command. Work that is linear
in the size grows by the size ratio (10x); the target is at most 12x from 10k to 100k,
which a quadratic step (100x) cannot meet.

    python benchmarks/validate_scale.py [--small 10000] [--large 100000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabro_git.workflow import load, validate

HEADER = """digraph Scale {
    graph [goal="scale", model_stylesheet="* { model: claude-sonnet-4-5; } .heavy { reasoning_effort: high; }"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
"""


def chain(size: int) -> str:
    lines = [HEADER]
    lines += [
        f'    n_{i} [shape=parallelogram, script="true", class="heavy"]\n' for i in range(size)
    ]
    lines.append("    start -> n_0\n")
    lines += [f"    n_{i} -> n_{i + 1}\n" for i in range(size - 1)]
    lines.append(f"    n_{size - 1} -> exit\n}}\n")
    return "".join(lines)


def fan_out(size: int) -> str:
    lines = [HEADER]
    lines += [f'    n_{i} [shape=parallelogram, script="true"]\n' for i in range(size)]
    lines += [f"    start -> n_{i} -> exit\n" for i in range(size)]
    lines.append("}\n")
    return "".join(lines)


def time_validate(path: Path) -> tuple[float, float, int]:
    """CPU and wall seconds to load and validate `path`, and its node count."""
    started, started_cpu = time.perf_counter(), time.process_time()
    graph = load(path)
    diagnostics = validate(graph)
    cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    errors = [d for d in diagnostics if d.severity == "error"]
    assert not errors, errors[:3]
    return cpu, wall, len(graph.nodes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=100_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fabro-scale-"))
    try:
        for name, make in (("chain", chain), ("fan-out", fan_out)):
            times = []
            for size in (args.small, args.large):
                path = base / f"{name}-{size}.fabro"
                path.write_text(make(size))
                cpu, wall, nodes = time_validate(path)
                times.append(cpu)
                print(
                    f"{name:8} {nodes:>7} nodes: parse+validate {cpu:6.2f} s CPU ({wall:6.2f} s wall)",
                    flush=True,
                )
            print(
                f"{name:8} {args.large // args.small}x the nodes: {times[1] / times[0]:.1f}x the CPU time   (target: at most 12x)"
            )
        exe = shutil.which("git-fabro", path=str(Path(sys.executable).parent)) or shutil.which(
            "git-fabro"
        )
        if exe is not None:
            path = base / f"chain-{args.large}.fabro"
            started = time.perf_counter()
            proc = subprocess.run(
                [exe, "validate", str(path)], capture_output=True, text=True, check=False
            )
            elapsed = time.perf_counter() - started
            verdict = (
                proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()
            )
            print(
                f"git-fabro validate on the {args.large}-node chain: {elapsed:.2f} s (exit {proc.returncode}): {verdict}"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
