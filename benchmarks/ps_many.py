"""`git fabro ps` over many runs, next to git listing the same refs and trailers.

Makes one real run, then gives it N-1 siblings: copies of its final meta commit under new
run ids (a fresh ULID in the trailers, so every ref points at its own commit), half of
them packed into `packed-refs` as `git gc` would leave them. Then times, interleaved:

  fabro  `git-fabro ps` (the whole process)
  git    `git for-each-ref --format='%(refname) %(contents:trailers)' refs/fabro/meta/`

Target: `ps` under 1 s for 1,000 runs.

    python benchmarks/ps_many.py [--runs 1000] [--reps 5]
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
from pathlib import Path

from installed import fabro_exe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabro_git.store import runs
from fabro_git.store.repo import GitRepo

HELLO = """digraph Hello {
  start [shape=Mdiamond]
  exit [shape=Msquare]
  work [shape=parallelogram, script="echo hi > hi.txt"]
  start -> work -> exit
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    exe = fabro_exe()
    base = Path(tempfile.mkdtemp(prefix="fabro-ps-"))
    env = dict(
        os.environ,
        FABRO_HOME=str(base / "home"),
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@b",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@b",
    )
    os.environ.update(env)
    repo_dir = base / "repo"
    repo_dir.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo_dir, check=True)
    (repo_dir / "wf.fabro").write_text(HELLO)
    subprocess.run(["git", "add", "-A"], cwd=repo_dir, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "init"], cwd=repo_dir, check=True)
    subprocess.run([exe, "run", "wf.fabro"], cwd=repo_dir, env=env, check=True, capture_output=True)

    repo = GitRepo.discover(repo_dir)
    [(ref, sha)] = repo.list_refs("refs/fabro/meta/").items()
    source_id = ref.rsplit("/", 1)[1]
    info = repo.commit_info(sha)
    updates = []
    for _ in range(args.runs - 1):
        run_id = runs.new_ulid()
        message = info.message.replace(source_id, run_id)
        commit = repo.write_commit(tree=info.tree, parents=list(info.parents), message=message)
        updates.append(f"create {runs.meta_ref(run_id)} {commit}\n")
    subprocess.run(
        ["git", "update-ref", "--stdin"],
        cwd=repo_dir,
        input="".join(updates),
        text=True,
        check=True,
    )
    # Half the refs packed, as after `git gc`, half loose, as in a busy repository.
    half = updates[: len(updates) // 2]
    subprocess.run(["git", "pack-refs", "--all"], cwd=repo_dir, check=True)
    for line in half:
        _, name, commit = line.split()
        subprocess.run(["git", "update-ref", name, commit], cwd=repo_dir, check=True)
    repo.close()

    def fabro() -> float:
        start = time.perf_counter()
        proc = subprocess.run(
            [exe, "ps"], cwd=repo_dir, env=env, capture_output=True, text=True, check=True
        )
        elapsed = time.perf_counter() - start
        assert proc.stdout.count("\n") == args.runs + 1, "ps did not list every run"
        return elapsed

    def plain_git() -> float:
        start = time.perf_counter()
        subprocess.run(
            ["git", "for-each-ref", "--format=%(refname) %(contents:trailers)", "refs/fabro/meta/"],
            cwd=repo_dir,
            capture_output=True,
            check=True,
        )
        return time.perf_counter() - start

    fabro(), plain_git()  # warm-up
    f = statistics.median(fabro() for _ in range(args.reps))
    g = statistics.median(plain_git() for _ in range(args.reps))
    print(
        f"ps over {args.runs} runs, median of {args.reps}: fabro {f:.3f}s   git for-each-ref {g:.3f}s"
        f"   ratio {f / g:.1f}x   (target: fabro under 1 s)"
    )
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
