"""Bringing a fix into a stopped run on resume: a commit of the repository
(`resume --rebase REV`) or a corrected workflow (`resume --workflow FILE`).

A run branch holds only commits the run made: resume sets aside any other commit on it
(`stage_commits_set_aside`), so a fix committed there by hand is lost and a fix
committed on `main` never reaches the run. `--rebase` is the sanctioned way in.

It merges REV into the run branch's tip, in one commit with a `Fabro-Rebased-Onto`
trailer, rather than rebasing the run's commits onto REV or applying the diff of
base..REV as a new commit:

- the run's stage commits stay as they are, so every checkpoint's `git_commit_sha` and
  every `Fabro-Checkpoint` trailer still names a commit of the branch, and the run's own
  line is its first-parent line, which `reconcile` walks;
- git computes the change from the merge base, so a second `--rebase main` later brings
  only what is new on main (a diff of base..REV would apply the first fix again, and
  conflict with itself);
- REV becomes an ancestor of the branch: `git branch --contains FIX` finds the run.

The merge is computed with `git merge-tree --write-tree`, which writes objects only:
a conflict is refused, naming the files, before any ref moves. The new tip becomes the
checkpoint's commit, which the next snapshot records; a resume cut off before that
snapshot finds the merge by its trailer (`Recorder.reconcile`), part of the run, not a
commit to set aside.

A corrected workflow replaces the graph from the next stage on. Every node the run
completed must still exist (their outcomes and routing history name them); the new
graph is validated as `run` validates, and the next snapshot rewrites `graph.fabro`
(the old one stays in the meta ref's history).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import msgspec

from fabro_git.engine.checkpoint import Checkpoint, Manifest, encode
from fabro_git.engine.emit import Emit
from fabro_git.engine.recorder import Recorder
from fabro_git.errors import ConfigError, FabroError, WorkflowError
from fabro_git.events.catalogue import RunNotice
from fabro_git.store import runs as runrefs
from fabro_git.store.repo import GitRepo
from fabro_git.workflow import Graph


class Rebase(msgspec.Struct, frozen=True):
    """`--rebase REV`: the revision as the user named it, and its commit."""

    rev: str
    sha: str


class NewWorkflow(msgspec.Struct):
    """`--workflow FILE`: the corrected graph, validated and rendered, and its source."""

    graph: Graph
    source: str
    path: Path


class Fixes(msgspec.Struct):
    rebase: Rebase | None = None
    workflow: NewWorkflow | None = None


def resolve_rebase(repo: GitRepo, rev: str, run_id: str) -> Rebase:
    """The commit `rev` names here; a `ConfigError` when it names none."""
    from fabro_git.store._gitcli import out, run_git

    if not rev.strip() or rev.startswith("-"):
        raise ConfigError(f"--rebase {rev!r} does not name a revision")
    proc = run_git(
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
        cwd=repo.root,
        check=False,
    )
    if proc.returncode != 0:
        raise ConfigError(
            f"--rebase {rev!r} names no commit of this repository",
            hint=f"commit the fix on a branch (say main), then `git fabro resume {run_id} "
            "--rebase main`; in a clone, `git fetch` first if the fix is on the remote",
        )
    return Rebase(rev=rev, sha=out(proc).strip())


def merged_tree(repo: GitRepo, tip: str, onto: Rebase, run_id: str) -> str:
    """The tree of `onto` merged into `tip` (objects only, no ref moves); a
    `FabroError` naming the conflicting files when they do not merge cleanly."""
    from fabro_git.store._gitcli import git_failure, out_lines, run_git

    args = ["merge-tree", "--write-tree", "--name-only", "--no-messages", tip, onto.sha]
    proc = run_git(args, cwd=repo.root, check=False)
    lines = out_lines(proc)
    if proc.returncode == 0 and lines:
        return lines[0].strip()
    if proc.returncode != 1 or not lines:
        raise git_failure(args, repo.root, proc)
    files = list(dict.fromkeys(line for line in lines[1:] if line.strip()))
    raise FabroError(
        f"--rebase {onto.rev}: {onto.sha[:12]} conflicts with run {run_id}'s work in "
        f"{', '.join(files) or 'its files'}; nothing was changed",
        hint=f"make the fix on top of the run's branch instead: commit it on a branch "
        f"made from {runrefs.run_branch_name(run_id)} and pass that branch to --rebase",
    )


def check_rebase(repo: GitRepo, run_id: str, manifest: Manifest, rebase: Rebase) -> None:
    """Refuse before the resume touches anything what `apply_rebase` would refuse."""
    if manifest.in_place:
        raise ConfigError(
            f"run {run_id} ran in place: it has no run branch to bring a fix into",
            hint=f"commit the fix in this checkout, then `git fabro resume {run_id}`",
        )
    tip = repo.read_ref(runrefs.run_branch_ref(run_id))
    if tip is not None and not repo.is_ancestor(rebase.sha, tip):
        merged_tree(repo, tip, rebase, run_id)


def apply_rebase(
    repo: GitRepo, run_id: str, recorder: Recorder, cp: Checkpoint, rebase: Rebase, emit: Emit
) -> None:
    """Merge the fix into the run branch (after `reconcile`)."""
    tip = recorder.run_tip
    assert tip is not None
    branch = runrefs.run_branch_name(run_id)
    if repo.is_ancestor(rebase.sha, tip):
        emit(
            RunNotice(
                level="info",
                code="rebased",
                message=f"{branch} already holds {rebase.rev} ({rebase.sha[:12]}); "
                "nothing to merge",
            )
        )
        return
    tree = merged_tree(repo, tip, rebase, run_id)
    message = (
        f"fabro({run_id}): merge {rebase.rev} ({rebase.sha[:12]}) for resume\n\n"
        f"{runrefs.TRAILER_RUN}: {run_id}\n"
        f"{runrefs.TRAILER_REBASED_ONTO}: {rebase.sha}\n"
    )
    sha = repo.write_commit(tree=tree, parents=[tip, rebase.sha], message=message)
    repo.update_ref(
        recorder.run_ref, sha, old=tip, message=f"fabro: resume --rebase {rebase.sha[:12]}"
    )
    recorder.run_tip = sha
    cp.git_commit_sha = sha
    emit(
        RunNotice(
            level="info",
            code="rebased",
            message=f"merged {rebase.rev} ({rebase.sha[:12]}) into {branch} as "
            f"{sha[:12]}; the run goes on from {cp.next_node_id or 'its start'} with it",
        )
    )


def check_workflow(graph: Graph, cp: Checkpoint, path: Path, run_id: str) -> None:
    """Every node the run completed, and the one it goes on from, must be in `graph`."""
    needed = [*cp.completed_nodes, *([cp.next_node_id] if cp.next_node_id else [])]
    missing = [node for node in dict.fromkeys(needed) if node not in graph.nodes]
    if missing:
        raise WorkflowError(
            f"{path} lacks node(s) run {run_id} has reached: {', '.join(missing)}; a "
            "corrected workflow keeps every completed node (it may change them and what "
            "comes after)",
            path=path,
            hint=f"put them back, or start afresh with `{shlex.join(['git', 'fabro', 'run', str(path)])}`",
        )


def workflow_files(
    manifest: Manifest, new: NewWorkflow, read_dir: Callable[[str], dict[str, bytes]]
) -> dict[str, bytes | None]:
    """The meta files that record `new` as the run's graph: `graph.fabro`, the manifest
    naming its path, and `graphs/` holding the files it names (the old ones deleted)."""
    origin = new.graph.origin
    manifest.workflow_path = str(new.path.resolve())
    manifest.workflow_name = new.graph.name
    manifest.workflow_file = origin.relpath if origin is not None else None
    files: dict[str, bytes | None] = {
        runrefs.graph_path(relpath): None for relpath in read_dir(runrefs.GRAPHS_DIR)
    }
    if origin is not None and origin.snapshot is not None:
        files.update({runrefs.graph_path(rel): data for rel, data in origin.snapshot.items()})
    files[runrefs.GRAPH] = new.source.encode()
    files[runrefs.MANIFEST] = encode(manifest)
    return files


def apply_fixes(
    repo: GitRepo,
    run_id: str,
    manifest: Manifest,
    cp: Checkpoint,
    recorder: Recorder,
    fixes: Fixes,
    emit: Emit,
    read_dir: Callable[[str], dict[str, bytes]],
) -> dict[str, bytes | None]:
    """Apply `fixes` after `reconcile`; returns the meta files the next snapshot
    writes for them."""
    files: dict[str, bytes | None] = {}
    if fixes.rebase is not None:
        apply_rebase(repo, run_id, recorder, cp, fixes.rebase, emit)
    if fixes.workflow is not None:
        new = fixes.workflow
        files.update(workflow_files(manifest, new, read_dir))
        emit(
            RunNotice(
                level="info",
                code="workflow_replaced",
                message=f"the run goes on from {cp.next_node_id or 'its start'} with the "
                f"workflow {new.path} ({len(new.graph.nodes)} nodes); the graph it ran "
                "before stays in the meta ref's history",
            )
        )
    return files
