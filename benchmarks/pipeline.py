"""A 50-stage run against git doing the same commits itself, in one process each.

Builds a scratch repository, writes a linear workflow of N command stages, and times,
interleaved over several repetitions:

  fabro     the whole `git-fabro run pipeline.fabro` process, start to exit (every stage
            checkpointed: a meta snapshot and a run-branch commit each)
  git       N x (`bash -c SCRIPT`, `git add -A`, `git commit -q --allow-empty -m x`) in a
            copy of the repository: the same stage commands, each recorded by git
  git-only  N x (`git add -A`, `git commit ...`) with the stage's file written by this
            script rather than by a shell, so only git's recording is timed

and prints the medians and the ratios (target: fabro at most 1.6x git), the ratio of
the fastest of each, which the machine's other load takes least from, and the ratios
of the rounds' pairs (each fabro run against the git loop timed right after it), which
a machine whose speed drifts from round to round moves least. Two workloads:
every stage runs `true` (nothing to record but the commit), and every stage runs the
pipeline of the speed target, `echo i > f_i.txt` (a new file a stage). Before each
round the git copy is put back to its first commit, so both sides add the same files
to the same tree.

`--against EXE` times a second `git-fabro` (say, an install of an earlier commit) in the
same rounds, interleaved with the first and with git, so a before/after comparison sees
the same load.

`--refs N` gives the repository (and git's copy) N loose tags first, as a repository
that has seen many runs has loose refs: the repository guard looks at them twice a
stage.

    python benchmarks/pipeline.py [--stages 50] [--reps 5] [--refs 0] [--workload both]
                                  [--against OTHER/git-fabro]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from installed import fabro_exe


def sh(cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, env=env)


def workflow(stages: int, script: str) -> str:
    lines = ["digraph Pipeline {", "  start [shape=Mdiamond]", "  exit [shape=Msquare]"]
    prev = "start"
    for i in range(stages):
        lines.append(f'  s{i} [shape=parallelogram, script="{script.format(i=i)}"]')
        lines.append(f"  {prev} -> s{i}")
        prev = f"s{i}"
    lines += [f"  {prev} -> exit", "}"]
    return "\n".join(lines) + "\n"


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def loose_tags(repo: Path, count: int, env: dict[str, str]) -> None:
    """`count` loose tags on HEAD, written as git writes loose refs."""
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, env=env, check=True, capture_output=True
    ).stdout
    for i in range(count):
        tag = repo / ".git" / "refs" / "tags" / "bench" / f"g{i % 50}" / f"t{i}"
        tag.parent.mkdir(parents=True, exist_ok=True)
        tag.write_bytes(sha)


def measure(
    stages: int, reps: int, script: str, label: str, against: str | None = None, refs: int = 0
) -> tuple[float, float]:
    exe = fabro_exe()
    bash = shutil.which("bash") or "/bin/sh"
    exes = [exe, *([against] if against else [])]
    base = Path(tempfile.mkdtemp(prefix="fabro-bench-"))
    env = dict(
        os.environ,
        FABRO_HOME=str(base / "home"),
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@b",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@b",
    )
    # As a user runs it: with compiled bytecode (an editable install under this variable
    # would compile every module at every start).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    repo = base / "repo"
    repo.mkdir()
    sh(repo, "git", "init", "-q", "-b", "main", env=env)
    for i in range(20):
        (repo / f"file{i}.txt").write_text(f"{i}\n")
    (base / "pipeline.fabro").write_text(workflow(stages, script))
    (base / "empty.fabro").write_text(workflow(0, script))
    sh(repo, "git", "add", "-A", env=env)
    sh(repo, "git", "commit", "-q", "-m", "init", env=env)
    copy = base / "git-copy"
    sh(base, "git", "clone", "-q", str(repo), str(copy), env=env)
    loose_tags(repo, refs, env)
    loose_tags(copy, refs, env)
    first = (
        subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=copy, env=env, check=True, capture_output=True
        )
        .stdout.decode()
        .strip()
    )

    def fabro(exe: str, name: str = "pipeline.fabro") -> None:
        subprocess.run(
            [exe, "run", str(base / name)],
            cwd=repo,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def reset_copy() -> None:
        sh(copy, "git", "reset", "-q", "--hard", first, env=env)
        sh(copy, "git", "clean", "-q", "-fdx", env=env)

    def plain_git(run_script: bool) -> None:
        for i in range(stages):
            if run_script:
                subprocess.run([bash, "-c", script.format(i=i)], cwd=copy, env=env, check=True)
            elif "f_" in script:
                (copy / f"f_{i}.txt").write_text(f"{i}\n")
            subprocess.run(["git", "add", "-A"], cwd=copy, env=env, check=True)
            subprocess.run(
                ["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=copy, env=env, check=True
            )

    fabro_times: dict[str, list[float]] = {x: [] for x in exes}
    empty_times: dict[str, list[float]] = {x: [] for x in exes}
    git_times: list[float] = []
    git_only_times: list[float] = []
    for x in exes:
        fabro(x)  # warm-up: page cache, pyc files
    for with_script in (True, False):
        reset_copy()
        plain_git(with_script)
    for _ in range(reps):
        for x in exes:
            fabro_times[x].append(timed(functools.partial(fabro, x)))
            empty_times[x].append(timed(functools.partial(fabro, x, "empty.fabro")))
        reset_copy()
        git_times.append(timed(functools.partial(plain_git, True)))
        reset_copy()
        git_only_times.append(timed(functools.partial(plain_git, False)))
    shutil.rmtree(base, ignore_errors=True)
    g = statistics.median(git_times)
    g_only = statistics.median(git_only_times)
    f = 0.0
    for x in exes:
        f, e = statistics.median(fabro_times[x]), statistics.median(empty_times[x])
        per_stage = (f - e) / stages
        name = label if x == exe else f"  ({x})"
        print(
            f"{name:<28} fabro {f:6.3f}s   git {g:6.3f}s   ratio {f / g:5.2f}x"
            f"   (git-only {g_only:6.3f}s: {f / g_only:5.2f}x)"
        )
        print(
            f"{'':<28} per stage: fabro {per_stage * 1000:5.1f}ms (after {e:.3f}s of fixed"
            f" start-up and finish)   git {g / stages * 1000:5.1f}ms"
            f"   ratio {per_stage / (g / stages):5.2f}x"
        )
        # The fastest of each: what the machine's other load took least from.
        best_f, best_g = min(fabro_times[x]), min(git_times)
        print(
            f"{'':<28} best of {len(git_times)}: fabro {best_f:6.3f}s   git {best_g:6.3f}s"
            f"   ratio {best_f / best_g:5.2f}x"
        )
        # Each round's fabro against the git loop timed right after it: a machine whose
        # speed drifts between rounds moves both sides of a pair alike.
        paired = sorted(f / g for f, g in zip(fabro_times[x], git_times, strict=True))
        print(
            f"{'':<28} paired by round: median {statistics.median(paired):5.2f}x"
            f"   from {paired[0]:5.2f}x to {paired[-1]:5.2f}x"
        )
    return statistics.median(fabro_times[exe]), g


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stages", type=int, default=50)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--against", help="another git-fabro to time in the same rounds")
    parser.add_argument("--refs", type=int, default=0, help="loose refs in the repository")
    parser.add_argument(
        "--workload",
        choices=["true", "file", "both"],
        default="both",
        help="stages that run `true`, stages that write a file (the target's), or both",
    )
    args = parser.parse_args()
    refs = f", {args.refs} loose refs" if args.refs else ""
    print(
        f"{args.stages}-stage linear pipeline{refs}, median of {args.reps} "
        "(whole process vs git add+commit per stage)"
    )
    if args.workload in ("true", "both"):
        measure(args.stages, args.reps, "true", "stages run `true`", args.against, args.refs)
    if args.workload in ("file", "both"):
        measure(
            args.stages,
            args.reps,
            "echo {i} > f_{i}.txt",
            "each stage writes a file",
            args.against,
            args.refs,
        )


if __name__ == "__main__":
    main()
