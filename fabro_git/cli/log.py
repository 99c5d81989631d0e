"""`git fabro log [RUN] [git log options]`: `git log` over a run's metadata history.

A run's checkpoints are commits on `refs/fabro/meta/<id>`, which `git log fabro/meta/*`
does not reach: git globs no revisions. This names the ref (or, with no run, every
run's through `--glob`) and hands the rest of the command line to `git log` as argv,
never through a shell, so the user's `log.*` settings and formats apply.

What git prints is not git's own words, though: the commit messages, their trailers and
the ref names of a fetched run are whoever made it. So git's output comes here, through
the sanitiser (`fabro_git.terminal`), and goes on to the pager git would have started
(`pager.log`, `GIT_PAGER`, `core.pager`, `PAGER`) when standard output is a terminal.
git colours nothing: its colour escapes and a message's are the same bytes, and only
a message's may reach the terminal, shown.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(args: list[str]) -> int:
    from fabro_git.cli._paged import exit_status, git_pager, show_output
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
    pager = git_pager(repo.root, "log")
    sys.stdout.flush()
    argv = ["git", "log", "--no-color", *revisions, *rest]
    with subprocess.Popen(argv, cwd=repo.root, env=git_env(), stdout=subprocess.PIPE) as log:
        assert log.stdout is not None
        show_output(log.stdout, pager, repo.root)
    return exit_status(log.returncode)
