"""`git fabro log [RUN] [git log options]`: `git log` over a run's metadata history.

A run's checkpoints are commits on `refs/fabro/meta/<id>`, which `git log fabro/meta/*`
does not reach: git globs no revisions. This names the ref (or, with no run, every
run's through `--glob`) and hands the rest of the command line to `git log` as argv,
never through a shell, with this process's terminal, so the user's pager, colours and
`log.*` settings apply.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(args: list[str]) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.store import runs as runrefs
    from fabro_git.store._gitcli import git_env
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    if args and not args[0].startswith("-"):
        revisions, rest = [runrefs.meta_ref(resolve_run(repo, args[0]))], args[1:]
    else:
        if not runrefs.list_run_ids(repo):
            print("no runs here", file=sys.stderr)
            return 0
        revisions, rest = [f"--glob={runrefs.META_PREFIX}*"], args
    sys.stdout.flush()
    argv = ["git", "log", *revisions, *rest]
    return subprocess.run(argv, cwd=repo.root, env=git_env(), check=False).returncode
