"""`git fabro __complete KIND [ARG]`: the words a completion script offers, one a line.

The scripts (`completion.py`) run it at every Tab, so it is answered before the CLI's
app is built (`cli.main`) and lists refs through git itself (`store.run_names`): no
typer, no dulwich, no engine.

Most words come from what a clone or a fetch brought: a run's workflow name is a
trailer of its meta commit, a checkpoint's label a node id of its graph, a workflow
name a directory of the repository. A word is offered only when it is made of
letters, digits and `._@+=:,/-`: a shell puts the words it is given back into a command
line, and bash's `compgen -W` expands `$(...)` in them; a terminal shows them in its
menu.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SAFE_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+=:,/-]*")
KINDS = ("runs", "batches", "checkpoints", "workflows", "examples")


def main(args: list[str]) -> int:
    """Print the words of `args` (KIND, and ARG for `checkpoints`). Errors print nothing:
    a completion must never put a message in the middle of the user's command line."""
    if not 1 <= len(args) <= 2 or args[0] not in KINDS:
        print(f"usage: git fabro __complete {'|'.join(KINDS)} [RUN]", file=sys.stderr)
        return 2
    try:
        found = _words(args[0], args[1] if len(args) == 2 else None)
    except Exception:  # see the docstring
        return 0
    sys.stdout.write("".join(f"{w}\n" for w in dict.fromkeys(found) if SAFE_WORD.fullmatch(w)))
    return 0


def _words(kind: str, arg: str | None) -> list[str]:
    if kind == "examples":
        from fabro_git.cli._examples import example_names

        return example_names()
    if kind == "workflows":
        from fabro_git.cli._workflows import named_workflows, repository_root

        return [w.name for w in named_workflows(repository_root())]
    from fabro_git.store import run_names

    if kind == "batches":
        return [
            ident for ident, _ in reversed(run_names.listed(run_names.BATCH_PREFIX, Path.cwd()))
        ]
    if kind == "runs":
        runs = list(
            reversed(run_names.listed(run_names.META_PREFIX, Path.cwd(), trailer="Fabro-Workflow"))
        )
        return [ident for ident, _ in runs] + [names[0] for _, names in runs if names]
    if kind == "checkpoints" and arg:
        from fabro_git.cli._timeline import timeline
        from fabro_git.store import runs as runrefs
        from fabro_git.store.repo import GitRepo

        repo = GitRepo.discover(Path.cwd())
        run_id = runrefs.resolve_run_id(repo, arg, remote=None)
        return [e.label for e in timeline(repo, run_id, base_sha=None)]
    return []
