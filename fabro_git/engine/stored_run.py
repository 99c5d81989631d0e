"""A run as git holds it, read back: its manifest, checkpoint and workflow.

Every command that opens a run (resume, fork, rewind and the commands that only look at
it) reads it through `load_run`, and the errors for a meta ref that leads nowhere are
worded here once. What a run stores under a directory of its meta ref is read with
`read_run_dir`, whose entry names are checked before anyone may write them to disk.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from fabro_git.confine import UnsafeEntry
from fabro_git.engine.checkpoint import Checkpoint, Manifest, decode_manifest, read_checkpoint
from fabro_git.errors import BlobTooLarge, FabroError, MissingObject, StoreError
from fabro_git.store import runs as runrefs
from fabro_git.store.repo import GitRepo
from fabro_git.workflow import Graph

if TYPE_CHECKING:
    from fabro_git.config.trust import Action, RecordedWorkflow, RunConfigActions


class StoredRun(NamedTuple):
    """A run as its meta ref's tip holds it."""

    manifest: Manifest
    checkpoint: Checkpoint  # complete, with a delta put back together
    meta_sha: str
    source: str  # the workflow source as it ran


def load_run(repo: GitRepo, run_id: str) -> StoredRun:
    """The run as its meta ref's tip holds it."""
    meta = repo.read_ref(runrefs.meta_ref(run_id))
    if meta is None:
        raise FabroError(f"run {run_id} has no metadata ref {runrefs.meta_ref(run_id)}")
    return load_run_at(repo, run_id, meta, what=f"the metadata snapshot {meta[:12]}")


def load_run_at(repo: GitRepo, run_id: str, meta: str, *, what: str) -> StoredRun:
    """The run as the meta commit `meta` holds it (`what` names that commit in errors)."""
    try:
        manifest_data = repo.read_file(meta, runrefs.MANIFEST)
        source = repo.read_file(meta, runrefs.GRAPH)
        checkpoint = read_checkpoint(repo.read_file, meta)
    except StoreError as exc:
        raise unreadable_meta(run_id, meta, exc) from exc
    except msgspec.DecodeError as exc:
        raise FabroError(f"run {run_id}: cannot read its metadata ({exc})") from exc
    if manifest_data is None or checkpoint is None or source is None:
        raise FabroError(
            f"run {run_id}: {what} is incomplete",
            hint=f"inspect it with `{shlex.join(['git', 'show', meta])}`",
        )
    try:
        manifest = decode_manifest(manifest_data)
    except msgspec.DecodeError as exc:
        raise FabroError(f"run {run_id}: cannot read its metadata ({exc})") from exc
    return StoredRun(manifest, checkpoint, meta, source.decode("utf-8"))


# The stage lines a trust question lists before it counts the rest.
_STAGES_SHOWN = 20


def run_trust(repo: GitRepo, run_id: str, stored: StoredRun) -> RunConfigActions:
    """What resuming the stored run `run_id` would do on its own say (its recorded
    configuration and its workflow's stages) and the digest the user's trust is kept
    under: of what the meta ref holds (masked), never of what the run was given."""
    from fabro_git.config.trust import Action, recorded_actions
    from fabro_git.errors import WorkflowError
    from fabro_git.workflow import parse

    try:
        actions = workflow_actions(parse(stored.source))
    except WorkflowError:
        actions = [Action("workflow", "runs a workflow this version cannot read")]
    objects = _workflow_objects_at(repo, stored.meta_sha, run_id)
    workflow = recorded_workflow(objects, stored.manifest, actions)
    return recorded_actions(stored.manifest.settings, workflow)


def new_run_trust(files: Mapping[str, bytes], graph: Graph) -> RunConfigActions:
    """`run_trust` of a run about to be recorded, from its first snapshot's `files` as
    git will hold them (masked): the same digest, known before the run exists."""
    from fabro_git.config.trust import recorded_actions

    manifest = decode_manifest(files[runrefs.MANIFEST])
    objects = {
        path: _blob_id(data)
        for path, data in files.items()
        if path == runrefs.GRAPH or path.startswith(_WORKFLOW_DIRS)
    }
    workflow = recorded_workflow(objects, manifest, workflow_actions(graph))
    return recorded_actions(manifest.settings, workflow)


# Where a run keeps the files its workflow names (and, before `graphs/`, its prompts).
_WORKFLOW_DIRS = (f"{runrefs.GRAPHS_DIR}/", f"{runrefs.LEGACY_PROMPTS_DIR}/")


def _blob_id(data: bytes) -> str:
    """The id git gives a blob of `data`."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _workflow_objects_at(repo: GitRepo, meta: str, run_id: str) -> dict[str, str]:
    """The blob id of each file of the meta commit `meta` that makes the run's
    workflow: `graph.fabro` and every file under `graphs/` (or the old `prompts/`)."""
    entries = repo.dir_entries(meta, "") or {}
    found = {runrefs.GRAPH: entries[runrefs.GRAPH][1]} if runrefs.GRAPH in entries else {}
    for directory in (runrefs.GRAPHS_DIR, runrefs.LEGACY_PROMPTS_DIR):
        for relpath, sha in blob_ids_under(repo, meta, directory, run_id=run_id).items():
            found[f"{directory}/{relpath}"] = sha
    return found


def recorded_workflow(
    objects: Mapping[str, str], manifest: Manifest, actions: list[Action]
) -> RecordedWorkflow:
    """The workflow a run records, for the trust a resume needs: its digest is of the
    blob ids of its files (`objects`: the graph's source, the files it names, the old
    layout's prompts), as the run reads them, and of the goal and inputs the templates
    fill in."""
    from fabro_git.config.trust import RecordedWorkflow

    made_of = {"objects": dict(objects), "goal": manifest.goal, "inputs": manifest.inputs}
    digest = hashlib.sha256(msgspec.json.encode(made_of, order="sorted")).hexdigest()
    return RecordedWorkflow(digest, actions)


def workflow_actions(graph: Graph) -> list[Action]:
    """What the stages of `graph` would do that needs the user's consent, in words:
    the programs its commands run, its agents and model calls, its child workflows."""
    from fabro_git.config.trust import Action, shown
    from fabro_git.workflow import model

    found = []
    for node in graph.nodes.values():
        kind = node.handler_type
        if kind == model.COMMAND:
            script = node.get("script") or node.get("tool_command") or ""
            found.append(Action(f"stage {node.id}", f"runs {shown(script)}"))
        elif kind == model.AGENT:
            found.append(Action(f"stage {node.id}", "runs an agent on its recorded prompt"))
        elif kind == model.PROMPT:
            found.append(Action(f"stage {node.id}", "sends its recorded prompt to a model"))
        elif kind == model.MANAGER_LOOP:
            found.append(Action(f"stage {node.id}", "runs a child workflow the run recorded"))
    if len(found) > _STAGES_SHOWN:
        rest = len(found) - _STAGES_SHOWN
        found = [*found[:_STAGES_SHOWN], Action("stages", f"and {rest} more stages that act")]
    return found


def unreadable_meta(run_id: str, meta: str, exc: StoreError) -> FabroError:
    if isinstance(exc, BlobTooLarge):
        return exc.for_run(run_id)
    ref = runrefs.meta_ref(run_id)
    if isinstance(exc, MissingObject):
        return missing_object_error(run_id, ref, meta, exc)
    return FabroError(
        f"run {run_id}: {ref} does not point at a metadata snapshot ({exc.message})",
        hint=f"look at it with `{shlex.join(['git', 'show', meta])}`; if it is not a run, "
        f"delete it with `{shlex.join(['git', 'update-ref', '-d', ref])}`",
    )


def objects_lost_error(run_id: str, lost: list[str]) -> str:
    """Why a run that reached its end is failed instead: objects it wrote are gone."""
    shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
    return (
        f"{len(lost)} object(s) this run wrote are missing from the repository ({shown}); "
        "something removed them while the run was writing (a `git gc --prune=now` can). "
        "The run is not marked succeeded: fetch it from a remote that has it "
        f"(`git fabro fetch`), or go back to an earlier checkpoint that is whole "
        f"(`git fabro rewind {run_id} --list`) and resume from there"
    )


def missing_object_error(run_id: str, ref: str, sha: str, exc: StoreError) -> FabroError:
    """A run ref that leads to an object git no longer has, and the ways back."""
    return FabroError(
        f"run {run_id}: {ref} points at {sha[:12]}, but part of it is missing from the "
        f"repository ({exc.message}); a `git gc --prune=now` while the run was writing "
        "can do this",
        hint=f"if a remote has the run, delete the ref (`git update-ref -d {ref}`) and fetch "
        f"it again (`git fabro fetch`); otherwise delete the ref, or point it back at an "
        f"earlier state from `git reflog show {ref}`",
    )


def load_graph(repo: GitRepo, run_id: str, manifest: Manifest, source: str, meta: str) -> Graph:
    """The graph as the run first walked it: its source, the files it names and its
    templates all come from the run's snapshot and manifest, never from the disk."""
    from fabro_git.engine.templating import render_graph
    from fabro_git.workflow import parse
    from fabro_git.workflow.paths import Origin

    path = Path(manifest.workflow_path) if manifest.workflow_path else None
    graph = parse(source, path)
    relpath = manifest.workflow_file
    if relpath is not None:
        depth = len(Path(relpath).parts)
        root = path.parents[depth - 1] if path is not None and len(path.parents) >= depth else None
        snapshot = read_run_dir(repo, meta, runrefs.GRAPHS_DIR, run_id=run_id)
        graph.origin = Origin(relpath=relpath, root=root, snapshot=snapshot)
    else:
        # Recorded before `graphs/`: @file prompts were kept as prompts/<node>.md; the
        # other files it names are nowhere in the run: an empty snapshot, so that nothing
        # is read from the disk around the path its (fetched) manifest gives.
        graph.origin = Origin(
            relpath=path.name if path is not None else "graph.fabro", root=None, snapshot={}
        )
        for node in graph.nodes.values():
            saved = repo.read_file(meta, f"{runrefs.LEGACY_PROMPTS_DIR}/{node.id}.md")
            if saved is not None:
                node.attrs["prompt"] = saved.decode("utf-8")
    render_graph(graph, goal=manifest.goal, inputs=manifest.inputs)
    return graph


def restore_artifacts(
    repo: GitRepo, run_id: str, meta: str, checkpoint: Checkpoint, scratch: Path
) -> None:
    """Write the offloaded values the meta ref holds into this scratch dir, and point the
    checkpoint at them: a resume in another clone (or after the scratch dir was cleaned)
    finds pointers into a directory that is not there."""
    from fabro_git.outputs.artifacts import TEXT_SUFFIX, ArtifactStore, encode_value

    store = ArtifactStore(scratch)
    files = read_run_dir(repo, meta, runrefs.ARTIFACTS_DIR, run_id=run_id)
    values = {n.removesuffix(".json"): data for n, data in files.items() if n.endswith(".json")}
    for name, data in files.items():
        if name.endswith(TEXT_SUFFIX):  # a value kept as its raw text: a long reply
            values[name.removesuffix(TEXT_SUFFIX)] = encode_value(data.decode("utf-8", "replace"))
    try:
        store.materialise(values)
    except UnsafeEntry as err:
        raise err.for_run(run_id) from None
    store.repoint(checkpoint.context_values)
    for record in checkpoint.node_outcomes.values():
        updates = record.get("context_updates")
        if isinstance(updates, dict):
            store.repoint(updates)


def read_run_dir(repo: GitRepo, commit: str, directory: str, *, run_id: str) -> dict[str, bytes]:
    """Every file under `directory` of `commit`, by its path inside it. The run's
    (`run_id`) entry names are checked as paths (`blob_ids_under`): whoever reads them
    may write them to disk, or into another run."""
    return {
        relpath: repo.read_blob(sha, path=f"{directory}/{relpath}")
        for relpath, sha in blob_ids_under(repo, commit, directory, run_id=run_id).items()
    }


def blob_ids_under(repo: GitRepo, commit: str, directory: str, *, run_id: str) -> dict[str, str]:
    """The blob id of every file under `directory` of `commit` (a submodule's entry is
    none), by its path inside it. Each entry's path is checked (`fabro_git.confine`) as
    it is met, so a tree nested without end is refused, not walked."""
    from fabro_git.confine import checked_parts

    found: dict[str, str] = {}
    pending = [""]
    while pending:
        sub = pending.pop()
        for name, (mode, sha) in (
            repo.dir_entries(commit, f"{directory}/{sub}".rstrip("/")) or {}
        ).items():
            relpath = f"{sub}/{name}" if sub else name
            try:
                checked_parts(relpath)
            except UnsafeEntry as err:
                raise UnsafeEntry(f"{directory}/{relpath}", err.reason, run_id=run_id) from None
            if mode & 0o170000 == 0o040000:
                pending.append(relpath)
            elif mode != 0o160000:
                found[relpath] = sha
    return found
