"""Does a stage cost the same at stage 1,000 as at stage 10?

A snapshot must cost O(what changed), not O(history): the event log is sharded
(`events/<NNN>/<NNNNNN>.jsonl`), unchanged `nodes/` subtrees keep their ids, and the
worktree scan follows the change. This runs whole `git fabro run`s of a linear
pipeline of N stages (default 1,000) and reads each stage's cost off the run's own
event log: the time from one
`stage.started` to the next, which covers the stage, its checkpoint (tree, meta
snapshot, run-branch commit) and the walk to the next stage. It prints the median over
a window of stages near the start and near the end, and their ratio (target: at most
1.2x). Two workloads:

  add      each stage writes a new file (`echo i > f_i.txt`): the worktree grows with
           the run too, so the run-branch tree and the index grow, as they would for
           git doing the same commits
  rewrite  each stage rewrites one file (`echo i > out.txt`): only the run's own
           history grows (events, `nodes/`, the checkpoint)

    python benchmarks/long_run.py [--stages 1000] [--window 20] [--workload add|rewrite|both]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path

SCRIPTS = {"add": "echo {i} > f_{i}.txt", "rewrite": "echo {i} > out.txt"}


def workflow(stages: int, script: str = SCRIPTS["add"]) -> str:
    lines = ["digraph Long {", "  start [shape=Mdiamond]", "  exit [shape=Msquare]"]
    prev = "start"
    for i in range(stages):
        lines.append(f'  s{i} [shape=parallelogram, script="{script.format(i=i)}"]')
        lines.append(f"  {prev} -> s{i}")
        prev = f"s{i}"
    lines += [f"  {prev} -> exit", "}"]
    return "\n".join(lines) + "\n"


def _ms(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stages", type=int, default=1000)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--workload", choices=["add", "rewrite", "both"], default="both")
    args = parser.parse_args()
    for workload in ("add", "rewrite") if args.workload == "both" else (args.workload,):
        measure(args.stages, args.window, workload)


def measure(stages: int, w: int, workload: str) -> None:
    exe = shutil.which("git-fabro")
    if exe is None:
        raise SystemExit("git-fabro is not on PATH; pip install the project first")
    base = Path(tempfile.mkdtemp(prefix="fabro-long-"))
    env = dict(
        os.environ,
        FABRO_HOME=str(base / "home"),
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@b",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@b",
    )
    try:
        repo = base / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True, env=env)
        (repo / "README").write_text("long run\n")
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
        subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo, check=True, env=env)
        (base / "long.fabro").write_text(workflow(stages, SCRIPTS[workload]))
        subprocess.run(
            [exe, "run", str(base / "long.fabro")],
            cwd=repo,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        run_id = subprocess.run(
            ["git", "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta"],
            cwd=repo,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[0]
        logs = subprocess.run(
            [exe, "logs", run_id], cwd=repo, env=env, check=True, capture_output=True, text=True
        ).stdout
        started = {}
        for line in logs.splitlines():
            event = json.loads(line)
            node = event.get("node_id") or ""
            if event["event"] == "stage.started" and node[:1] == "s" and node[1:].isdigit():
                started[int(node[1:])] = _ms(event["ts"])
        cost = [started[i + 1] - started[i] for i in range(stages - 1)]
        start = max(0, 10 - w // 2)
        early = statistics.median(cost[start : start + w])
        late = statistics.median(cost[-w:])
        print(f"{stages}-stage pipeline, workload {workload!r} (whole `git fabro run`)")
        print(f"  per-stage cost near stage 10:    {early:6.1f} ms (median of {w} stages)")
        print(f"  per-stage cost near stage {stages}: {late:6.1f} ms (median of {w} stages)")
        print(f"  ratio {late / early:5.2f}x (target: at most 1.2x)")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
