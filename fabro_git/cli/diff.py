"""`git fabro diff`: what a run, or one of its stages, changed, shown by git itself.

git runs with this process's terminal, so the user's pager, colours, diff drivers and
`diff.*` settings apply as they do to any `git diff`. A stage's change is measured from
the previous checkpoint commit, not from its commit's parent: an agent that commits by
itself leaves its own commits under the checkpoint commit, and they are part of its stage.

The files are an agent's work, though, and git shows them raw: a file holding
`ESC [8m` hides the lines after it from the review, `ESC ]52;` writes the clipboard, a
bidi override makes code read as something it is not. So git runs twice when it must:
once without colour, read here, and only when nothing in that output is a control
character does git show the diff itself, coloured and paged. Otherwise the uncoloured
output is shown through the sanitiser and the pager git would start (`_paged`), and a
line on standard error says why. `--raw` gives git's bytes unchanged, for `git apply`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(run_arg: str, node: str | None, *, stat: bool, raw: bool = False) -> int:
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
        if raw:
            return subprocess.run(args, cwd=repo.root, env=git_env(), check=False).returncode
        plain = [*args[:2], "--color=never", *args[2:]]
        if sys.stdout.isatty() and _shown_as_is(plain, repo.root):
            return subprocess.run(args, cwd=repo.root, env=git_env(), check=False).returncode
        # Escaped where it must be: on a terminal, in the pager git would start; into a
        # pipe or a file (where git paints and pages nothing), in one pass of git.
        return _shown_escaped(plain, repo.root)


def _shown_as_is(plain: list[str], cwd: Path) -> bool:
    """Whether git's uncoloured diff (`plain`) holds nothing a terminal acts on (read
    up to the first block of lines that does)."""
    from fabro_git.cli._paged import shown_as_is
    from fabro_git.store._gitcli import git_env

    with subprocess.Popen(
        plain, cwd=cwd, env=git_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as git:
        assert git.stdout is not None
        clean = shown_as_is(git.stdout)
        if not clean:
            git.kill()
    return clean


def _shown_escaped(plain: list[str], cwd: Path) -> int:
    from fabro_git.cli._paged import exit_status, git_pager, show_output
    from fabro_git.store._gitcli import git_env

    pager = git_pager(cwd, "diff")
    with subprocess.Popen(plain, cwd=cwd, env=git_env(), stdout=subprocess.PIPE) as git:
        assert git.stdout is not None
        try:
            escaped = show_output(git.stdout, pager, cwd)
        except BrokenPipeError:  # the reader went away (`| head`): no failure
            git.kill()
            return 0
    if escaped:
        print(
            "the run's changes hold control characters: shown escaped (\\x1b) and without"
            " colour; `--raw` gives git's bytes unchanged",
            file=sys.stderr,
        )
    return exit_status(git.returncode)
