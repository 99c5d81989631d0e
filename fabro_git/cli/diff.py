"""`git fabro diff`: what a run, or one of its stages, changed, shown by git itself.

git runs with this process's terminal, so the user's pager, colours, diff drivers and
`diff.*` settings apply as they do to any `git diff`. A stage's change is measured from
the previous checkpoint commit, not from its commit's parent: an agent that commits by
itself leaves its own commits under the checkpoint commit, and they are part of its stage.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(run_arg: str, node: str | None, *, stat: bool) -> int:
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.engine.reader import open_run
    from fabro_git.errors import FabroError
    from fabro_git.store import runs as runrefs
    from fabro_git.store._gitcli import git_env
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    run_id = resolve_run(repo, run_arg)
    with objects_of(run_id):
        reader = open_run(repo, run_id)
        manifest = reader.manifest
        if manifest.in_place:
            raise FabroError(
                f"run {run_id} ran in place: it made no commits to compare",
                hint="look at the working tree with `git diff` instead",
            )
        tip = reader.run_tip
        if tip is None:
            raise FabroError(
                f"run {run_id} has no branch {runrefs.run_branch_ref(run_id)} here",
                hint="fetch it with `git fabro fetch`",
            )
        if node is None:
            old, new = manifest.base_sha, tip
        else:
            old, new = reader.stage_commits(node, note=lambda text: print(text, file=sys.stderr))
        # The ids come from the run's records: never where git reads an option.
        args = ["git", "diff", *(["--stat"] if stat else []), "--end-of-options", old, new, "--"]
        sys.stdout.flush()
        return subprocess.run(args, cwd=repo.root, env=git_env(), check=False).returncode
