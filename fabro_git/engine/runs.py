"""The run lifecycle: making, opening, forking and superseding runs.

Every change to which runs exist goes through here, so each one writes its meta
snapshots through a `Recorder` (snapshot events, masked files and commit messages) and
moves its refs in the same order: the meta ref first, the run branch after it.

- `create_run` turns a workflow into a run: refs, scratch dir and an `init` snapshot, so
  the run exists in git before any stage starts.
- `open_run` makes a stored run ready to drive again (`git fabro resume`, and the child
  of `run -d`): its lock, its event bus with the live tail, its recorder and its graph.
- `fork_run` makes a new run from one checkpoint of another; `supersede_run` records on
  the source that a new run (made by `git fabro rewind`) replaced it.

Driving an open run is `engine.session`'s.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, Unpack

import msgspec

from fabro_git import __version__
from fabro_git.config.locations import make_private_dir, run_scratch_dir
from fabro_git.config.run_config import EffectiveConfig
from fabro_git.engine import process_groups
from fabro_git.engine.checkpoint import Checkpoint, Manifest, TrackedMap, encode
from fabro_git.engine.context import Context
from fabro_git.engine.emit import Emit, EnvelopeFields
from fabro_git.engine.event_sinks import attach as attach_event_sinks
from fabro_git.engine.lock import RunLock
from fabro_git.engine.recorder import Recorder
from fabro_git.engine.runner import Options, now_iso
from fabro_git.engine.stored_run import load_graph, load_run, load_run_at, read_run_dir
from fabro_git.errors import ConfigError, FabroError, StoreError
from fabro_git.events.bus import EventBus, TailFileSink, tail_after
from fabro_git.events.catalogue import MetadataSnapshotFailed, RunCreated, RunNotice
from fabro_git.events.envelope import Actor, EventProps
from fabro_git.files import NAMED_GRAPH_FILE
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as runrefs
from fabro_git.store.durability import prefetch as prefetch_durability
from fabro_git.store.repo import GitRepo, HeadInfo
from fabro_git.workflow import Graph


class RunSpec(msgspec.Struct):
    graph: Graph
    source: str
    workflow_path: Path | None
    goal: str
    inputs: dict[str, str]
    labels: dict[str, str]
    options: Options
    setup_commands: list[str]
    exclude_globs: list[str]
    # The effective run configuration, recorded in the manifest's settings.
    config: EffectiveConfig
    # An id allocated beforehand (`git fabro batch` names every run before any starts).
    run_id: str | None = None


class OpenRun(msgspec.Struct):
    """A run made ready to drive: its records, its event bus, its recorder, its scratch
    dir, the lock held on it and its graph."""

    run_id: str
    manifest: Manifest
    checkpoint: Checkpoint
    bus: EventBus
    recorder: Recorder
    scratch: Path
    lock: RunLock
    graph: Graph
    repo: GitRepo

    @property
    def emit(self) -> Emit:
        return make_emitter(self.bus)


def make_emitter(bus: EventBus) -> Emit:
    def emit(
        event: EventProps,
        /,
        *,
        node_id: str | None = None,
        node_label: str | None = None,
        stage_id: str | None = None,
        session_id: str | None = None,
        parent_session_id: str | None = None,
        actor: Actor | None = None,
    ) -> None:
        bus.emit(
            event,
            node_id=node_id,
            node_label=node_label,
            stage_id=stage_id,
            session_id=session_id,
            parent_session_id=parent_session_id,
            actor=actor,
        )

    return emit


def graph_record(graph: Graph) -> JsonObject:
    return {
        "name": graph.name,
        "attrs": {**graph.attrs},
        "nodes": [
            {"id": n.id, "handler_type": n.handler_type, "attrs": {**n.attrs}}
            for n in graph.nodes.values()
        ],
        "edges": [{"from": e.source, "to": e.target, "attrs": {**e.attrs}} for e in graph.edges],
    }


def graph_slug(graph: Graph, path: Path | None) -> str:
    base = path.stem if path is not None else graph.name
    if path is not None and path.name == NAMED_GRAPH_FILE and path.parent.name:
        base = path.parent.name
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "workflow"


def _login() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"


# -- creating a run -------------------------------------------------------------------------


def create_run(
    repo: GitRepo,
    spec: RunSpec,
    *,
    warn: Callable[[str], object],
    before_recorded: Callable[[str, Mapping[str, bytes]], object] | None = None,
) -> OpenRun:
    """The new run, recorded. `before_recorded` is given the run's id and its first
    snapshot's files as git will hold them (masked), before the snapshot makes the run
    exist: what must be known of a run before anyone can find it (the user's trust)."""
    base = repo.require_base()
    assert base.sha is not None
    run_id = spec.run_id or runrefs.new_ulid()
    if spec.run_id is not None and repo.read_ref(runrefs.meta_ref(run_id)) is not None:
        raise StoreError(f"run {run_id} exists already", hint=f"git fabro resume {run_id}")
    runrefs.check_names_free(repo, run_id, with_branch=not spec.options.in_place)
    scratch = make_private_dir(run_scratch_dir(repo.git_dir, run_id))
    lock = RunLock(repo, run_id)
    lock.acquire()
    try:
        if spec.options.in_place:
            lock.hold_checkout()
        return _record_new_run(repo, spec, base, run_id, scratch, lock, warn, before_recorded)
    except BaseException:
        if _never_made(repo, run_id):  # nothing names it: what was made for it goes
            lock.release()
            shutil.rmtree(scratch, ignore_errors=True)
        raise


def _never_made(repo: GitRepo, run_id: str) -> bool:
    """Whether run `run_id` has no meta ref (as far as can be told)."""
    try:
        return repo.read_ref(runrefs.meta_ref(run_id)) is None
    except (FabroError, OSError):
        return False


def _record_new_run(
    repo: GitRepo,
    spec: RunSpec,
    base: HeadInfo,
    run_id: str,
    scratch: Path,
    lock: RunLock,
    warn: Callable[[str], object],
    before_recorded: Callable[[str, Mapping[str, bytes]], object] | None,
) -> OpenRun:
    """The run's manifest, first checkpoint, bus and recorder, its creation announced and
    its first snapshot written: from then on it exists."""
    assert base.sha is not None
    # Two git processes asked at once and answered below: they run side by side, and
    # while this process works. The configuration answers both the origin's URL and
    # what to flush (`fabro_git.store.durability`).
    dirty_later = repo.uncommitted_changes_later()
    settings = repo.settings_later()
    prefetch_durability(repo.root, settings)
    origin = repo.origin_url_in(settings())
    manifest = _new_manifest(repo, spec, run_id, base.sha, base.branch, origin)
    checkpoint = _first_checkpoint(spec, run_id, manifest.created_at)
    dirty = dirty_later()

    bus = EventBus(run_id, [TailFileSink(scratch / "events.jsonl")])
    emit = make_emitter(bus)
    attach_event_sinks(
        bus, manifest.run_config, emit=emit, host_dir=repo.root, scratch=scratch, warn=warn
    )
    emit(_created_event(repo, spec, manifest, scratch, dirty=bool(dirty)))
    if dirty:
        message = (
            f"{len(dirty)} uncommitted change(s) in {repo.root} are not part of this run; "
            "it starts from the committed HEAD. Commit or stash them, or use --in-place."
        )
        warn(message)
        emit(RunNotice(level="warn", code="uncommitted_changes", message=message))
    in_place = manifest.in_place
    recorder = Recorder(
        repo,
        run_id,
        workflow_slug=manifest.workflow_slug,
        emit=emit,
        take_segment=bus.take_segment,
        worktree=None if in_place else scratch / "worktree",
        exclude_globs=spec.exclude_globs,
        meta_tip=None,
        run_tip=None if in_place else base.sha,
        requeue=bus.restore_pending,
    )
    files = {runrefs.MANIFEST: encode(manifest), runrefs.GRAPH: spec.source.encode()}
    files.update(_workflow_files(spec.graph))
    if before_recorded is not None:
        mask = recorder.redactor.mask_bytes
        before_recorded(run_id, {path: mask(data) for path, data in files.items()})
    sha = recorder.snapshot("init", "init", checkpoint, files)
    if sha is None:
        raise StoreError(
            f"could not write the first snapshot of run {run_id} to {runrefs.meta_ref(run_id)}"
        )
    # The branch comes after the snapshot: a run cut off in between has its meta ref,
    # and resume makes the branch from the manifest, instead of a branch nothing names.
    if not in_place:
        create_run_branch(repo, run_id, base.sha)
    return OpenRun(run_id, manifest, checkpoint, bus, recorder, scratch, lock, spec.graph, repo)


def _new_manifest(
    repo: GitRepo,
    spec: RunSpec,
    run_id: str,
    base_sha: str,
    base_branch: str | None,
    origin_url: str | None,
) -> Manifest:
    options, graph = spec.options, spec.graph
    return Manifest(
        run_id=run_id,
        workflow_name=graph.name,
        workflow_slug=graph_slug(graph, spec.workflow_path),
        workflow_path=str(spec.workflow_path) if spec.workflow_path else None,
        goal=spec.goal,
        inputs=spec.inputs,
        labels=spec.labels,
        base_sha=base_sha,
        base_branch=base_branch,
        run_branch=None if options.in_place else runrefs.run_branch_name(run_id),
        meta_ref=runrefs.meta_ref(run_id),
        created_at=now_iso(),
        source_directory=str(repo.root),
        origin_url=origin_url,
        in_place=options.in_place,
        settings={
            "dry_run": options.dry_run,
            "auto_approve": options.auto_approve,
            "retro": options.retro,
            "retro_narrative": options.retro_narrative,
            "model": options.model,
            "provider": options.provider,
            "setup_commands": [*spec.setup_commands],
            "exclude_globs": [*spec.exclude_globs],
            **spec.config.settings(),
        },
        tool_version=__version__,
        workflow_file=graph.origin.relpath if graph.origin is not None else None,
    )


def _first_checkpoint(spec: RunSpec, run_id: str, created_at: str) -> Checkpoint:
    checkpoint = Checkpoint(status="running", started_at=created_at, timestamp=created_at)
    context = Context()
    for key, value in spec.graph.attrs.items():
        context.set(f"graph.{key}", value)
    context.set("graph.goal", spec.goal)
    context.set("internal.run_id", run_id)
    checkpoint.context_values = TrackedMap(context.snapshot())
    return checkpoint


def _created_event(
    repo: GitRepo, spec: RunSpec, manifest: Manifest, scratch: Path, *, dirty: bool
) -> RunCreated:
    return RunCreated(
        settings=manifest.settings,
        graph=graph_record(spec.graph),
        workflow_source=spec.source,
        labels=spec.labels,
        run_dir=str(scratch),
        source_directory=str(repo.root),
        repo_origin_url=manifest.origin_url,
        base_branch=manifest.base_branch,
        workflow_slug=manifest.workflow_slug,
        provenance={"subject": {"kind": "user", "login": _login()}},
        pre_run_git={
            "display_base_sha": manifest.base_sha[:12],
            "local_dirty": "dirty" if dirty else "clean",
        },
        in_place=manifest.in_place,
    )


def create_run_branch(repo: GitRepo, run_id: str, base_sha: str) -> None:
    repo.update_ref(
        runrefs.run_branch_ref(run_id), base_sha, old=None, message=f"fabro: create run {run_id}"
    )


def _workflow_files(graph: Graph) -> dict[str, bytes]:
    """The files the workflow names (`@file` prompts, child workflows) as this run reads
    them, under `graphs/`: a resume, here or in a clone, reads them from there."""
    origin = graph.origin
    if origin is None or origin.snapshot is None:
        return {}
    return {runrefs.graph_path(relpath): data for relpath, data in origin.snapshot.items()}


# -- opening a stored run ---------------------------------------------------------------------


def open_run(repo: GitRepo, run_id: str, *, workflow: Graph | None = None) -> OpenRun:
    """The stored run made ready to drive again, under its lock. `workflow` is the graph
    it goes on with when not the one it ran (`resume --workflow`)."""
    lock = RunLock(repo, run_id)
    lock.acquire()
    try:
        lock.clear_stale_ref_locks(
            [runrefs.meta_ref(run_id), runrefs.run_branch_ref(run_id)],
            [f"{runrefs.PARALLEL_PREFIX}{run_id}"],
        )
        manifest, checkpoint, meta, source = load_run(repo, run_id)
        if manifest.in_place:
            lock.hold_checkout()
        scratch = make_private_dir(run_scratch_dir(repo.git_dir, run_id))
        bus = EventBus(run_id)
        tail = scratch / "events.jsonl"
        if tail.exists():
            bus.restore_pending(tail_after(tail.read_bytes(), checkpoint.last_event_id))
        bus.add_sink(TailFileSink(tail))
        attach_event_sinks(
            bus, manifest.run_config, emit=make_emitter(bus), host_dir=repo.root, scratch=scratch
        )
        run_tip = _run_tip(repo, run_id, manifest, checkpoint)
        recorder = Recorder(
            repo,
            run_id,
            workflow_slug=manifest.workflow_slug,
            emit=make_emitter(bus),
            take_segment=bus.take_segment,
            worktree=None if manifest.in_place else scratch / "worktree",
            exclude_globs=list(manifest.options.exclude_globs),
            meta_tip=meta,
            run_tip=run_tip,
            requeue=bus.restore_pending,
        )
        graph = workflow or load_graph(repo, run_id, manifest, source, meta)
        # A crash leaves stage commands running; they must not write into the worktree
        # this run restores.
        process_groups.kill_recorded(process_groups.records_dir(scratch))
    except BaseException:
        lock.release()
        raise
    return OpenRun(run_id, manifest, checkpoint, bus, recorder, scratch, lock, graph, repo)


def _run_tip(repo: GitRepo, run_id: str, manifest: Manifest, checkpoint: Checkpoint) -> str | None:
    """The run branch's tip (None for an in-place run), made again from the manifest
    when the run was cut off before it had one."""
    if manifest.in_place:
        return None
    run_tip = repo.read_ref(runrefs.run_branch_ref(run_id))
    if run_tip is None and not checkpoint.completed_nodes and checkpoint.pending_commit is None:
        # Cut off between the init snapshot and the branch: nothing was committed yet.
        create_run_branch(repo, run_id, manifest.base_sha)
        return manifest.base_sha
    if run_tip is None:
        raise FabroError(
            f"run {run_id} has lost its branch {runrefs.run_branch_ref(run_id)}",
            hint=f"fetch it with `git fabro fetch`, or restore it from `git reflog show {runrefs.run_branch_name(run_id)}`",
        )
    return run_tip


# -- forking and superseding ------------------------------------------------------------------


class ForkPoint(Protocol):
    """A checkpoint of a run to start a new one from (`cli._timeline.CheckpointEntry`)."""

    @property
    def node(self) -> str: ...

    @property
    def visit(self) -> int: ...

    @property
    def meta_sha(self) -> str:
        """The meta commit holding the checkpoint as of this stage."""
        ...

    @property
    def run_commit(self) -> str | None:
        """The run-branch commit made for it; None if none was made."""
        ...

    @property
    def label(self) -> str: ...


# What a fork carries over from the source's meta snapshot, besides its manifest and graph.
_FORKED_DIRS = (
    runrefs.GRAPHS_DIR,
    runrefs.NODES_DIR,
    runrefs.LEGACY_PROMPTS_DIR,
    runrefs.ARTIFACTS_DIR,
    runrefs.THREADS_DIR,
    runrefs.ASSETS_DIR,
)


def fork_run(repo: GitRepo, source_id: str, point: ForkPoint) -> str:
    """Make a new run from the checkpoint `point` of run `source_id`; returns its id.

    The new run is an ordinary run that has not been resumed yet: its meta ref starts
    with an `init` snapshot holding the checkpoint as it stood when the chosen stage
    finished, and its run branch starts at the run-branch commit made for it. Its event
    log starts afresh with its own `run.created`, whose `fork_source_ref` names the
    checkpoint. The source run's refs are only read."""
    at = point.meta_sha
    stored = load_run_at(repo, source_id, at, what=f"the checkpoint {point.label} ({at[:12]})")
    if stored.manifest.in_place:
        raise ConfigError(
            f"run {source_id} ran in place: it has no run-branch commits to start a new run from",
            hint="fork or rewind runs made in a worktree (without --in-place)",
        )
    checkpoint = stored.checkpoint
    start = _fork_start(checkpoint, point, stored.manifest.base_sha)
    new_id = runrefs.new_ulid()
    now = now_iso()
    forked_from = {"run_id": source_id, "node": point.node, "visit": point.visit, "checkpoint": at}
    manifest = msgspec.structs.replace(
        stored.manifest,
        run_id=new_id,
        run_branch=runrefs.run_branch_name(new_id),
        meta_ref=runrefs.meta_ref(new_id),
        created_at=now,
        source_directory=str(repo.root),
        origin_url=repo.origin_url(),
        tool_version=__version__,
        forked_from=forked_from,
        superseded_by=None,
    )
    _restart_checkpoint(checkpoint, new_id, now)

    # The tail carries what the init snapshot cannot hold (its own completion event)
    # to the first resume, as for any new run.
    scratch = make_private_dir(run_scratch_dir(repo.git_dir, new_id))
    bus = EventBus(new_id, [TailFileSink(scratch / "events.jsonl")])
    emit = make_emitter(bus)
    fork_source = {**forked_from, "git_commit_sha": start}
    emit(_forked_created_event(repo, at, manifest, scratch, fork_source))
    emit(
        RunNotice(
            level="info",
            code="forked",
            message=f"forked from run {source_id} at {point.label}; "
            f"continue with `git fabro resume {new_id}`",
        )
    )
    recorder = Recorder(
        repo,
        new_id,
        workflow_slug=manifest.workflow_slug,
        emit=emit,
        take_segment=bus.take_segment,
        worktree=None,
        exclude_globs=list(manifest.options.exclude_globs),
        meta_tip=None,
        run_tip=start,
    )
    files: dict[str, bytes | None] = {
        runrefs.MANIFEST: encode(manifest),
        runrefs.GRAPH: stored.source.encode(),
    }
    for directory in _FORKED_DIRS:
        for relpath, data in read_run_dir(repo, at, directory, run_id=source_id).items():
            files[f"{directory}/{relpath}"] = data
    try:
        meta_sha = recorder.snapshot("init", "init", checkpoint, files)
    finally:
        bus.close()
    if meta_sha is None:
        # No ref names the new run: its scratch dir (the tail) is nobody's.
        shutil.rmtree(scratch, ignore_errors=True)
        raise _fork_refused(recorder.last_error, new_id, source_id)
    _create_fork_branch(repo, source_id, new_id, start, meta_sha, point.label)
    _copy_parallel_refs(repo, source_id, new_id, checkpoint.node_visits)
    return new_id


def _fork_refused(refused: FabroError | None, new_id: str, source_id: str) -> FabroError:
    """Why a fork's first snapshot was not written: a fork shows no run's progress, so
    git's reason goes in the message itself."""
    return FabroError(
        f"could not write the first snapshot of run {new_id}: "
        + (refused.message if refused is not None else "git refused it"),
        hint=refused.hint
        if refused is not None and refused.hint
        else f"run {source_id} is unchanged: fix what stopped the write, then fork again",
    )


def _forked_created_event(
    repo: GitRepo, at: str, manifest: Manifest, scratch: Path, fork_source: dict[str, object]
) -> RunCreated:
    """The new run's `run.created`: the source's own (its graph, source and settings),
    with what is the new run's."""
    created = _source_created_properties(repo, at)
    created.update(
        run_dir=str(scratch),
        source_directory=str(repo.root),
        repo_origin_url=manifest.origin_url,
        fork_source_ref=fork_source,
        in_place=False,
    )
    created.setdefault("settings", manifest.settings)
    created.setdefault("labels", manifest.labels)
    created.setdefault("workflow_slug", manifest.workflow_slug)
    created.setdefault("provenance", {"subject": {"kind": "user", "login": _login()}})
    created.setdefault("graph", {})
    return msgspec.convert({k: v for k, v in created.items() if v is not None}, RunCreated)


def _fork_start(checkpoint: Checkpoint, point: ForkPoint, base_sha: str) -> str:
    """The run-branch commit of this checkpoint; if a crash kept it from being made, the
    new run starts at its parent and resume makes it from the pending tree."""
    if point.run_commit is not None:
        checkpoint.git_commit_sha = point.run_commit
        checkpoint.pending_commit = None
        return point.run_commit
    if checkpoint.pending_commit is not None:
        return checkpoint.pending_commit.parent
    return checkpoint.git_commit_sha or base_sha


def _restart_checkpoint(checkpoint: Checkpoint, new_id: str, now: str) -> None:
    """The source's checkpoint as the first of a new run that has not started yet."""
    checkpoint.status = "running"
    checkpoint.error = None
    checkpoint.finished_at = None
    checkpoint.started_at = now
    checkpoint.timestamp = now
    checkpoint.event_segments = 0
    checkpoint.last_event_id = None
    checkpoint.context_values["internal.run_id"] = new_id


def _create_fork_branch(
    repo: GitRepo, source_id: str, new_id: str, start: str, meta_sha: str, label: str
) -> None:
    try:
        repo.update_ref(
            runrefs.run_branch_ref(new_id),
            start,
            old=None,
            message=f"fabro: fork {source_id} at {label}",
        )
    except FabroError:
        # A run without its branch cannot be resumed: take the half-made run away again.
        repo.delete_ref(runrefs.meta_ref(new_id), old=meta_sha, message="fabro: fork failed")
        raise


def _copy_parallel_refs(repo: GitRepo, source_id: str, new_id: str, visits: dict[str, int]) -> None:
    """The branch refs of the fan-outs the checkpoint has behind it, under the new run's
    name: its context names their commits, and they must stay reachable from its own refs
    whatever becomes of the source run."""
    prefix = f"{runrefs.PARALLEL_PREFIX}{source_id}/"
    for name, sha in repo.list_refs(prefix).items():
        relpath = name[len(prefix) :]
        if relpath.startswith("_child/"):
            continue  # a child workflow's progress in a stage the new run starts afresh
        node, _, visit = relpath.split("/", 1)[0].split(".", 1)[0].rpartition("-")
        if visit.isdigit() and int(visit) > visits.get(node, 0):
            continue  # a fan-out that ran after the checkpoint
        repo.update_ref(
            f"{runrefs.PARALLEL_PREFIX}{new_id}/{relpath}",
            sha,
            old=None,
            message=f"fabro: fork {source_id}",
        )


def _source_created_properties(repo: GitRepo, meta_sha: str) -> dict[str, object]:
    """The source run's own `run.created` properties (graph, source, settings), which
    the new run shares; empty if its first event segment does not hold one."""
    data = runrefs.read_segment(repo, meta_sha, 1) or b""
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "run.created" and isinstance(event.get("properties"), dict):
            props = dict(event["properties"])
            props.pop("pre_run_git", None)
            return props
    return {}


def supersede_run(repo: GitRepo, source_id: str, new_id: str, label: str, meta: str) -> None:
    """Record on run `source_id`, whose meta ref is at `meta`, that run `new_id` replaced
    it from its checkpoint `label`: its manifest gains `superseded_by`, its log a
    `run.notice`, and the snapshot's commit a `Fabro-Superseded-By` trailer that `ps`
    reads without opening a blob. The caller holds the source's lock."""
    stored = load_run_at(repo, source_id, meta, what=f"the metadata snapshot {meta[:12]}")
    manifest = msgspec.structs.replace(stored.manifest, superseded_by=new_id)
    bus = EventBus(source_id)
    failures: list[str] = []

    def emit(event: EventProps, /, **scope: Unpack[EnvelopeFields]) -> None:
        if isinstance(event, MetadataSnapshotFailed):
            failures.append(event.error or "git refused the snapshot")
        bus.emit(event, **scope)

    def take_segment() -> bytes:
        # The notice is the source's last event: it goes after the snapshot's start,
        # into the segment that snapshot writes.
        emit(
            RunNotice(
                level="info",
                code="superseded",
                message=f"rewound to {label} as run {new_id}; this run is superseded",
            )
        )
        return bus.take_segment()

    recorder = Recorder(
        repo,
        source_id,
        workflow_slug=manifest.workflow_slug,
        emit=emit,
        take_segment=take_segment,
        worktree=None,
        exclude_globs=[],
        meta_tip=meta,
        run_tip=None,
    )
    trailers = {runrefs.TRAILER_SUPERSEDED_BY: new_id}
    files: dict[str, bytes | Path | None] = {runrefs.MANIFEST: encode(manifest)}
    try:
        sha = recorder.snapshot(
            "finalize", f"superseded by {new_id}", stored.checkpoint, files, trailers=trailers
        )
    finally:
        bus.close()
    if sha is None:
        raise StoreError(f"could not write to {runrefs.meta_ref(source_id)}: {'; '.join(failures)}")


def rewind_run(repo: GitRepo, source_id: str, point: ForkPoint) -> str:
    """Replace run `source_id` by a new run from its checkpoint `point` (`fork_run`),
    and mark the source superseded (`supersede_run`); returns the new run's id. The
    source's lock is held throughout, so it cannot be resumed while it is replaced."""
    lock = RunLock(repo, source_id)
    lock.acquire()
    try:
        stored = load_run(repo, source_id)
        if stored.manifest.superseded_by:
            raise FabroError(
                f"run {source_id} was already rewound: run {stored.manifest.superseded_by} replaced it",
                hint="rewind that run instead, or fork this one with "
                f"`{shlex.join(['git', 'fabro', 'fork', source_id, point.label])}`",
            )
        new_id = fork_run(repo, source_id, point)
        try:
            supersede_run(repo, source_id, new_id, point.label, stored.meta_sha)
        except FabroError as err:
            raise FabroError(
                f"run {new_id} now starts from {source_id} at {point.label}, but run {source_id} "
                f"could not be marked superseded: {err.message}",
                hint=f"do not rewind again: continue with `git fabro resume {new_id}`",
            ) from err
    finally:
        lock.release()
    return new_id
