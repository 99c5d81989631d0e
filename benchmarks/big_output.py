"""A command that prints 500 MB: peak memory of the run, and whether git holds it whole.

One `git fabro run` of a workflow whose one command stage prints `--mb` megabytes of
text lines. It is started from a small wrapper process that reports the peak RSS of its
process tree (`getrusage(RUSAGE_CHILDREN)`: the largest of `git fabro`, its git
children and the command itself). Then:

  stored      the stage's `stdout.log` blob on the meta ref against the blob id of the
              same bytes (`git hash-object` of the file the same command writes)
  rss         peak RSS of the run's process tree (target: under 200 MB)
  checkpoint  from the command's end to its checkpoint (stage.started + duration_ms to
              checkpoint.completed, off the run's own events)
  git         `git hash-object -w` of the same file, as a whole process, with its RSS

    python benchmarks/big_output.py [--mb 500] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from installed import environ_with_fabro

LINE = "benchmark output line 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Runs argv, then prints the peak RSS (KiB) of every process it waited for, on stderr.
WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print("maxrss_kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


def measured(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, str, str]:
    """(wall seconds, peak RSS in MB of the process tree, stdout, stderr)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    rss = next(
        int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("maxrss_kib")
    )
    return wall, rss // 1024, proc.stdout, proc.stderr


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def checkpoint_seconds(repo: Path, run_id: str, env: dict[str, str], node: str) -> float:
    """From the end of `node`'s handler to its checkpoint, off the run's events."""
    proc = subprocess.run(
        ["git", "fabro", "logs", run_id], cwd=repo, env=env, capture_output=True, text=True
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    started = next(e for e in events if e["event"] == "stage.started" and e.get("node_id") == node)
    completed = next(
        e for e in events if e["event"] == "stage.completed" and e.get("node_id") == node
    )
    checkpoint = next(
        e for e in events if e["event"] == "checkpoint.completed" and e.get("node_id") == node
    )
    handler_end = _ts(started["ts"]) + completed["properties"]["duration_ms"] / 1000
    return _ts(checkpoint["ts"]) - handler_end


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    size = args.mb * 1_000_000
    root = Path(tempfile.mkdtemp(prefix="fabro-big-output-", dir=args.dir))
    try:
        env = environ_with_fabro()
        env["FABRO_HOME"] = str(root / "fabro-home")
        env.pop("GIT_DIR", None)
        repo = root / "repo"
        git(root, "init", "-q", "-b", "main", str(repo))
        script = f"yes '{LINE}' | head -c {size}"
        (repo / "wf.fabro").write_text(
            "digraph Big {\n"
            "    start [shape=Mdiamond]\n"
            "    exit  [shape=Msquare]\n"
            f'    big   [shape=parallelogram, script="{script}"]\n'
            "    start -> big -> exit\n"
            "}\n"
        )
        git(repo, "add", "wf.fabro")
        git(repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "wf")
        expected = root / "expected.out"
        subprocess.run(["bash", "-c", f"{script} > {expected}"], check=True)
        expected_sha = git(repo, "hash-object", str(expected)).strip()

        wall, rss, out, _err = measured(
            ["git", "fabro", "run", "wf.fabro", "--json", "-q"], repo, env
        )
        run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
        stored = subprocess.run(
            ["git", "rev-parse", f"refs/fabro/meta/{run_id}:nodes/big/stdout.log"],
            cwd=repo,
            capture_output=True,
            text=True,
        ).stdout.strip()
        stored_size = subprocess.run(
            ["git", "cat-file", "-s", stored], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
        checkpoint = checkpoint_seconds(repo, run_id, env, "big")

        plain = root / "plain"
        git(root, "init", "-q", "--bare", str(plain))
        git_wall, git_rss, _, _ = measured(
            ["git", "--git-dir", str(plain), "hash-object", "-w", str(expected)], root, env
        )
        identical = stored == expected_sha
        print(f"output        {args.mb} MB ({size:,} bytes)")
        print(
            f"stored blob   {'byte-identical' if identical else 'DIFFERENT'}"
            f" ({stored[:12] or '-'}, {stored_size or '?'} bytes; expected {expected_sha[:12]})"
        )
        print(f"peak RSS      {rss} MB (target < 200 MB: {'met' if rss < 200 else 'NOT met'})")
        print(f"run           {wall:.1f} s wall for the whole `git fabro run`")
        print(f"checkpoint    {checkpoint:.2f} s from the command's end to its checkpoint")
        print(f"git           {git_wall:.2f} s, {git_rss} MB peak for `git hash-object -w`")
        print(f"ratio         checkpoint / git hash-object -w: {checkpoint / git_wall:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
