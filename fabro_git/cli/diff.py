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
from typing import Any


def run(run_arg: str, node: str | None, *, stat: bool) -> int:
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.engine.session import load_run
    from fabro_git.errors import FabroError
    from fabro_git.store import runs as runrefs
    from fabro_git.store._gitcli import git_env
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    run_id = resolve_run(repo, run_arg)
    with objects_of(run_id):
        manifest, _cp, _meta, _source = load_run(repo, run_id)
        if manifest.in_place:
            raise FabroError(
                f"run {run_id} ran in place: it made no commits to compare",
                hint="look at the working tree with `git diff` instead",
            )
        tip = repo.read_ref(runrefs.run_branch_ref(run_id))
        if tip is None:
            raise FabroError(
                f"run {run_id} has no branch {runrefs.run_branch_ref(run_id)} here",
                hint="fetch it with `git fabro fetch`",
            )
        if node is None:
            old, new = manifest.base_sha, tip
        else:
            old, new = stage_range(repo, run_id, manifest.base_sha, tip, node)
        args = ["git", "diff", *(["--stat"] if stat else []), old, new, "--"]
        sys.stdout.flush()
        return subprocess.run(args, cwd=repo.root, env=git_env(), check=False).returncode


def stage_range(repo: Any, run_id: str, base: str, tip: str, target: str) -> tuple[str, str]:
    """(previous checkpoint commit, this stage's checkpoint commit) for NODE or NODE@VISIT.

    NODE alone means its latest visit. Visits are read from the meta history, which a
    fork lacks for the stages it inherited; for those the Nth commit of NODE is visit N.
    """
    from fabro_git.cli._timeline import timeline
    from fabro_git.errors import FabroError

    chain = []  # checkpoint commits from the base up, each with its node
    for info in repo.iter_log(tip):
        if info.sha == base:
            break
        if info.trailers.get("Fabro-Checkpoint"):
            chain.append((info.sha, _node_of(info.subject)))
    chain.reverse()
    node, _, visit_text = target.rpartition("@") if "@" in target else (target, "", "")
    commits = [sha for sha, name in chain if name == node]
    if not commits:
        stages = ", ".join(dict.fromkeys(name for _, name in chain if name)) or "none yet"
        raise FabroError(
            f"run {run_id} has no commit for a stage {node!r}; its stages are: {stages}",
            hint=f"list its checkpoints with `git fabro fork {run_id} --list`",
        )
    if visit_text:
        if not visit_text.isdigit():
            raise FabroError(f"{target!r} is not NODE or NODE@VISIT", hint="for example: plan@2")
        visit = int(visit_text)
        by_visit = {
            e.visit: e.run_commit for e in timeline(repo, run_id, base_sha=base) if e.node == node
        }
        commit = by_visit.get(visit) or (commits[visit - 1] if 0 < visit <= len(commits) else None)
        if commit is None:
            raise FabroError(
                f"stage {node} of run {run_id} has no visit {visit}",
                hint=f"it ran {len(commits)} time(s): name one as {node}@1 to {node}@{len(commits)}",
            )
    else:
        commit = commits[-1]
        if len(commits) > 1:
            from fabro_git.terminal import printable

            name = printable(node, one_line=True)
            print(
                f"{name} ran {len(commits)} times; showing its last visit (name one as {name}@N)",
                file=sys.stderr,
            )
    index = [sha for sha, _ in chain].index(commit)
    return (chain[index - 1][0] if index else base), commit


def _node_of(subject: str) -> str | None:
    """The node of a checkpoint commit's subject `fabro(<run>): NODE (status)`, as
    engine/recorder.py `run_commit_message` writes it."""
    _, sep, rest = subject.partition("): ")
    if not sep:
        return None
    return rest.rsplit(" (", 1)[0]
