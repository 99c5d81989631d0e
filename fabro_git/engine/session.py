"""Starting, resuming and finishing runs: everything around the walk itself.

`create_run` turns a workflow into a run: refs, worktree and an `init` snapshot, so the
run exists in git before any stage starts. `execute_run` drives it under trio: the lock,
the event sinks, the crash reconciliation, Ctrl-C and the stall watchdog, and the
`finalize` snapshot. `resume` is `execute_run` on a run that already exists, possibly
fetched from a remote and with no scratch dir left at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import trio

from fabro_git import __version__
from fabro_git.config.locations import make_private_dir, run_scratch_dir, runs_dir
from fabro_git.confine import UnsafeEntry
from fabro_git.engine import control, cutoff, process_groups, retros
from fabro_git.engine import outcome as oc
from fabro_git.engine.checkpoint import (
    Checkpoint,
    Manifest,
    TrackedMap,
    decode_manifest,
    encode,
    read_checkpoint,
)
from fabro_git.engine.context import Context
from fabro_git.engine.emit import Emit
from fabro_git.engine.event_sinks import attach as attach_event_sinks
from fabro_git.engine.event_sinks import close as close_event_sinks
from fabro_git.engine.fixes import Fixes, apply_fixes
from fabro_git.engine.gates import AttendedRun, GateDesk, SharedInterviewer
from fabro_git.engine.interviewer import make_interviewer
from fabro_git.engine.lifecycle import AgentReply, LifecycleHooks
from fabro_git.engine.lock import RunLock
from fabro_git.engine.recorder import Recorder
from fabro_git.engine.replication import LivePush
from fabro_git.engine.runner import (
    Options,
    RunFailed,
    Runtime,
    Scope,
    SpendingCapReached,
    now_iso,
    walk_finished,
)
from fabro_git.engine.stage import Handler
from fabro_git.engine.watchdog import watch_for_stall
from fabro_git.errors import ConfigError, FabroError, MissingObject, StoreError
from fabro_git.events import catalogue as ev
from fabro_git.events.bus import EventBus, Sink, TailFileSink, tail_after
from fabro_git.events.envelope import Actor, EventProps
from fabro_git.store import runs as runrefs
from fabro_git.store import worktree as wt
from fabro_git.store.durability import prefetch as prefetch_durability
from fabro_git.store.repo import GitRepo
from fabro_git.workflow import Graph

TERMINAL = ("succeeded", "partially_succeeded", "failed")


class RunResult(msgspec.Struct):
    run_id: str
    status: str
    run_branch: str | None
    meta_ref: str
    final_git_commit_sha: str | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "run_branch": self.run_branch,
            "meta_ref": self.meta_ref,
            "final_git_commit_sha": self.final_git_commit_sha,
        }

    @property
    def exit_code(self) -> int:
        if self.status in (oc.SUCCEEDED, oc.PARTIAL):
            return 0
        if self.status == "interrupted":
            return 130
        return 1


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


def graph_record(graph: Graph) -> dict[str, Any]:
    return {
        "name": graph.name,
        "attrs": dict(graph.attrs),
        "nodes": [
            {"id": n.id, "handler_type": n.handler_type, "attrs": dict(n.attrs)}
            for n in graph.nodes.values()
        ],
        "edges": [{"from": e.source, "to": e.target, "attrs": dict(e.attrs)} for e in graph.edges],
    }


# -- creating a run -------------------------------------------------------------------------


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
    # The effective run configuration.
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    # An id allocated beforehand (`git fabro batch` names every run before any starts).
    run_id: str | None = None


class OpenRun(msgspec.Struct):
    """A run made ready to drive: its records, its event bus, its recorder, its scratch
    dir, the lock held on it and its graph."""

    run_id: str
    manifest: Manifest
    checkpoint: Checkpoint
    bus: EventBus
    recorder: Recorder | None
    scratch: Path
    lock: RunLock
    graph: Graph


def create_run(repo: GitRepo, spec: RunSpec, *, warn: Callable[[str], object]) -> OpenRun:
    base = repo.require_base()
    assert base.sha is not None
    run_id = spec.run_id or runrefs.new_ulid()
    if spec.run_id is not None and repo.read_ref(runrefs.meta_ref(run_id)) is not None:
        raise StoreError(f"run {run_id} exists already", hint=f"git fabro resume {run_id}")
    runrefs.check_names_free(repo, run_id, with_branch=not spec.options.in_place)
    scratch = make_private_dir(run_scratch_dir(repo.git_dir, run_id))
    lock = RunLock(repo, run_id)
    lock.acquire()
    # Three git processes asked at once and answered below: they run side by side, and
    # while this process works.
    dirty_later = repo.uncommitted_changes_later()
    origin_later = repo.origin_url_later()
    prefetch_durability(repo.root)
    in_place = spec.options.in_place
    graph = spec.graph
    slug = graph_slug(graph, spec.workflow_path)
    manifest = Manifest(
        run_id=run_id,
        workflow_name=graph.name,
        workflow_slug=slug,
        workflow_path=str(spec.workflow_path) if spec.workflow_path else None,
        goal=spec.goal,
        inputs=spec.inputs,
        labels=spec.labels,
        base_sha=base.sha,
        base_branch=base.branch,
        run_branch=None if in_place else runrefs.run_branch_name(run_id),
        meta_ref=runrefs.meta_ref(run_id),
        created_at=now_iso(),
        source_directory=str(repo.root),
        origin_url=origin_later(),
        in_place=in_place,
        settings={
            "dry_run": spec.options.dry_run,
            "auto_approve": spec.options.auto_approve,
            "retro": spec.options.retro,
            "retro_narrative": spec.options.retro_narrative,
            "model": spec.options.model,
            "provider": spec.options.provider,
            "setup_commands": spec.setup_commands,
            "exclude_globs": spec.exclude_globs,
            **spec.settings,
        },
        tool_version=__version__,
        workflow_file=graph.origin.relpath if graph.origin is not None else None,
    )
    cp = Checkpoint(status="running", started_at=manifest.created_at, timestamp=manifest.created_at)
    ctx = Context()
    for key, value in graph.attrs.items():
        ctx.set(f"graph.{key}", value)
    ctx.set("graph.goal", spec.goal)
    ctx.set("internal.run_id", run_id)
    cp.context_values = TrackedMap(ctx.snapshot())
    dirty = dirty_later()

    bus = EventBus(run_id, [TailFileSink(scratch / "events.jsonl")])
    emit = make_emitter(bus)
    attach_event_sinks(
        bus, manifest.settings, emit=emit, host_dir=repo.root, scratch=scratch, warn=warn
    )
    emit(
        ev.RunCreated(
            settings=manifest.settings,
            graph=graph_record(graph),
            workflow_source=spec.source,
            labels=spec.labels,
            run_dir=str(scratch),
            source_directory=str(repo.root),
            repo_origin_url=manifest.origin_url,
            base_branch=base.branch,
            workflow_slug=slug,
            provenance={
                "subject": {
                    "kind": "user",
                    "login": os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown",
                }
            },
            pre_run_git={
                "display_base_sha": base.sha[:12],
                "local_dirty": "dirty" if dirty else "clean",
            },
            in_place=in_place,
        )
    )
    if dirty:
        message = (
            f"{len(dirty)} uncommitted change(s) in {repo.root} are not part of this run; "
            "it starts from the committed HEAD. Commit or stash them, or use --in-place."
        )
        warn(message)
        emit(ev.RunNotice(level="warn", code="uncommitted_changes", message=message))
    recorder = Recorder(
        repo,
        run_id,
        workflow_slug=slug,
        emit=emit,
        take_segment=bus.take_segment,
        worktree=None if in_place else scratch / "worktree",
        exclude_globs=spec.exclude_globs,
        meta_tip=None,
        run_tip=None if in_place else base.sha,
        requeue=bus.restore_pending,
    )
    files = {
        runrefs.MANIFEST: encode(manifest),
        runrefs.GRAPH: spec.source.encode(),
    }
    files.update(_workflow_files(graph))
    sha = recorder.snapshot("init", "init", cp, files)
    if sha is None:
        raise StoreError(
            f"could not write the first snapshot of run {run_id} to {runrefs.meta_ref(run_id)}"
        )
    # The branch comes after the snapshot: a run cut off in between has its meta ref,
    # and resume makes the branch from the manifest, instead of a branch nothing names.
    if not in_place:
        create_run_branch(repo, run_id, base.sha)
    return OpenRun(run_id, manifest, cp, bus, recorder, scratch, lock, graph)


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


def graph_slug(graph: Graph, path: Path | None) -> str:
    import re

    base = path.stem if path is not None else graph.name
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "workflow"


# -- running -----------------------------------------------------------------------------------


class StoredRun(NamedTuple):
    """A run as its meta ref's tip holds it."""

    manifest: Manifest
    checkpoint: Checkpoint  # complete, with a delta put back together
    meta_sha: str
    source: str  # the workflow source as it ran


def load_run(repo: GitRepo, run_id: str) -> StoredRun:
    meta = repo.read_ref(runrefs.meta_ref(run_id))
    if meta is None:
        raise FabroError(f"run {run_id} has no metadata ref {runrefs.meta_ref(run_id)}")
    try:
        manifest_data = repo.read_file(meta, runrefs.MANIFEST)
        source = repo.read_file(meta, runrefs.GRAPH)
        cp = read_checkpoint(repo.read_file, meta)
    except StoreError as exc:
        raise unreadable_meta(run_id, meta, exc) from exc
    except msgspec.DecodeError as exc:
        raise FabroError(f"run {run_id}: cannot read its metadata ({exc})") from exc
    if manifest_data is None or cp is None or source is None:
        raise FabroError(
            f"run {run_id}: the metadata snapshot {meta[:12]} is incomplete",
            hint=f"inspect it with `git show {meta}`",
        )
    try:
        manifest = decode_manifest(manifest_data)
    except msgspec.DecodeError as exc:
        raise FabroError(f"run {run_id}: cannot read its metadata ({exc})") from exc
    return StoredRun(manifest, cp, meta, source.decode("utf-8"))


def unreadable_meta(run_id: str, meta: str, exc: StoreError) -> FabroError:
    ref = runrefs.meta_ref(run_id)
    if isinstance(exc, MissingObject):
        return missing_object_error(run_id, ref, meta, exc)
    return FabroError(
        f"run {run_id}: {ref} does not point at a metadata snapshot ({exc.message})",
        hint=f"look at it with `git show {meta}`; if it is not a run, delete it with `git update-ref -d {ref}`",
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


def _load_graph(repo: GitRepo, run_id: str, manifest: Manifest, source: str, meta: str) -> Graph:
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
        snapshot = _read_dir(repo, meta, runrefs.GRAPHS_DIR, run_id=run_id)
        graph.origin = Origin(relpath=relpath, root=root, snapshot=snapshot)
    else:
        # Recorded before `graphs/`: @file prompts were kept as prompts/<node>.md.
        for node in graph.nodes.values():
            saved = repo.read_file(meta, f"{runrefs.LEGACY_PROMPTS_DIR}/{node.id}.md")
            if saved is not None:
                node.attrs["prompt"] = saved.decode("utf-8")
    render_graph(graph, goal=manifest.goal, inputs=manifest.inputs)
    return graph


def _restore_artifacts(
    repo: GitRepo, run_id: str, meta: str, cp: Checkpoint, scratch: Path
) -> None:
    """Write the offloaded values the meta ref holds into this scratch dir, and point the
    checkpoint at them: a resume in another clone (or after the scratch dir was cleaned)
    finds pointers into a directory that is not there."""
    from fabro_git.outputs.artifacts import TEXT_SUFFIX, ArtifactStore, encode_value

    store = ArtifactStore(scratch)
    files = _read_dir(repo, meta, runrefs.ARTIFACTS_DIR, run_id=run_id)
    values = {n.removesuffix(".json"): data for n, data in files.items() if n.endswith(".json")}
    for name, data in files.items():
        if name.endswith(TEXT_SUFFIX):  # a value kept as its raw text: a long reply
            values[name.removesuffix(TEXT_SUFFIX)] = encode_value(data.decode("utf-8", "replace"))
    try:
        store.materialise(values)
    except UnsafeEntry as err:
        raise err.for_run(run_id) from None
    store.repoint(cp.context_values)
    for record in cp.node_outcomes.values():
        updates = record.get("context_updates")
        if isinstance(updates, dict):
            store.repoint(updates)


def _read_dir(repo: GitRepo, commit: str, directory: str, *, run_id: str) -> dict[str, bytes]:
    """Every file under `directory` of `commit`, by its path inside it. The run's
    (`run_id`) entry names are checked as paths (`fabro_git.confine`): whoever reads
    them may write them to disk, or into another run."""
    from fabro_git.confine import checked_parts

    out: dict[str, bytes] = {}
    pending = [""]
    while pending:
        sub = pending.pop()
        for name in repo.list_dir(commit, f"{directory}/{sub}".rstrip("/")) or []:
            relpath = f"{sub}/{name}" if sub else name
            try:
                checked_parts(relpath)
            except UnsafeEntry as err:
                raise UnsafeEntry(f"{directory}/{relpath}", err.reason, run_id=run_id) from None
            data = repo.read_file(commit, f"{directory}/{relpath}")
            if data is None:
                pending.append(relpath)
            else:
                out[relpath] = data
    return out


def ensure_worktree(
    repo: GitRepo, run_id: str, scratch: Path, run_tip: str, emit: Emit, *, new: bool = False
) -> tuple[Path, bool]:
    """The run's worktree at the run branch's tip: reuse, reset or rebuild it. A `new`
    run made its branch and scratch dir just now: nothing of git's can hold either, so
    git's list of worktrees is not consulted."""
    path = scratch / "worktree"
    branch = runrefs.run_branch_name(run_id)
    if new:
        wt.add_worktree(repo, path, branch=branch, commit=run_tip, new=True)
        return path, True
    # One listing for both checks below; `add_worktree` lists again under its lock.
    checkouts = wt.checkouts_of(repo, branch)
    checkouts = _drop_stale_checkouts(repo, checkouts, path)
    if (path / ".git").exists():
        try:
            wt.checkout(path, run_tip)
            emit(ev.GitReset(sha=run_tip))
            return path, False
        except FabroError:
            with contextlib.suppress(FabroError):
                wt.remove_worktree(repo, path)
            import shutil

            shutil.rmtree(path, ignore_errors=True)
    for other in checkouts:
        if other.resolve() != path.resolve():
            raise StoreError(
                f"run {run_id}: its branch {branch} is checked out at {other}, and a branch "
                "can be checked out in one worktree only",
                hint=f"switch that worktree away (git -C {other} switch --detach) or remove it "
                f"(git worktree remove {other}), then run the command again",
            )
    wt.add_worktree(repo, path, branch=branch, commit=run_tip)
    return path, True


def _drop_stale_checkouts(repo: GitRepo, checkouts: list[Path], path: Path) -> list[Path]:
    """Remove this repository's other scratch checkouts of the run branch (`checkouts`,
    where it is checked out); returns those left.

    The scratch dir is keyed by the repository's path, so a repository that moved (or
    a scratch dir from before the key) leaves a checkout of the run branch under the old
    name, and git refuses a second one. We hold the run lock and a run worktree holds
    nothing git lacks, so it goes (its files first: after a move, its link back to the
    repository is broken and `git worktree remove` refuses it).
    """
    import shutil

    root = runs_dir().resolve()
    left = []
    for other in checkouts:
        resolved = other.resolve()
        if resolved != path.resolve() and resolved.is_relative_to(root):
            shutil.rmtree(other, ignore_errors=True)
            wt.remove_worktree(repo, other)
        else:
            left.append(other)
    return left


def execute_run(
    repo: GitRepo,
    run_id: str,
    *,
    options: Options,
    renderer: Sink | None,
    resuming: bool,
    handlers: Callable[[str], Handler | None],
    prepared: OpenRun | None = None,
    before: Sequence[EventProps] = (),
    fixes: Fixes | None = None,
    agent_hooks: AgentReply | None = None,
) -> RunResult:
    """Drive the run to its end. `before` are events about how the run got here (resume
    fetched it from a remote), emitted first; `fixes` what resume brings in first."""
    fixes = fixes or Fixes()
    if prepared is None:
        lock = RunLock(repo, run_id)
        lock.acquire()
        lock.clear_stale_ref_locks(
            [runrefs.meta_ref(run_id), runrefs.run_branch_ref(run_id)],
            [f"{runrefs.PARALLEL_PREFIX}{run_id}"],
        )
        manifest, cp, meta, source = load_run(repo, run_id)
        scratch = make_private_dir(run_scratch_dir(repo.git_dir, run_id))
        bus = EventBus(run_id)
        tail = scratch / "events.jsonl"
        if tail.exists():
            bus.restore_pending(tail_after(tail.read_bytes(), cp.last_event_id))
        bus.add_sink(TailFileSink(tail))
        emit = make_emitter(bus)
        attach_event_sinks(bus, manifest.settings, emit=emit, host_dir=repo.root, scratch=scratch)
        run_tip = None if manifest.in_place else repo.read_ref(runrefs.run_branch_ref(run_id))
        if (
            not manifest.in_place
            and run_tip is None
            and not cp.completed_nodes
            and cp.pending_commit is None
        ):
            # Cut off between the init snapshot and the branch: nothing was committed yet.
            create_run_branch(repo, run_id, manifest.base_sha)
            run_tip = manifest.base_sha
        if not manifest.in_place and run_tip is None:
            raise FabroError(
                f"run {run_id} has lost its branch {runrefs.run_branch_ref(run_id)}",
                hint=f"fetch it with `git fabro fetch`, or restore it from `git reflog show {runrefs.run_branch_name(run_id)}`",
            )
        recorder: Recorder | None = Recorder(
            repo,
            run_id,
            workflow_slug=manifest.workflow_slug,
            emit=emit,
            take_segment=bus.take_segment,
            worktree=None if manifest.in_place else scratch / "worktree",
            exclude_globs=list(manifest.settings.get("exclude_globs") or []),
            meta_tip=meta,
            run_tip=run_tip,
            requeue=bus.restore_pending,
        )
        if fixes.workflow is not None:
            graph = fixes.workflow.graph
        else:
            graph = _load_graph(repo, run_id, manifest, source, meta)
        # A crash leaves stage commands running; they must not write into the worktree
        # this run restores.
        process_groups.kill_recorded(process_groups.records_dir(scratch))
    else:
        manifest, cp, bus, recorder = (
            prepared.manifest,
            prepared.checkpoint,
            prepared.bus,
            prepared.recorder,
        )
        scratch, lock, graph = prepared.scratch, prepared.lock, prepared.graph
        emit = make_emitter(bus)
    for event in before:
        emit(event)
    if renderer is not None:
        bus.add_sink(renderer)
    hooks = LifecycleHooks.from_settings(
        manifest.settings,
        run_id=run_id,
        workflow=graph.name,
        host_dir=repo.root,
        scratch=scratch,
        emit=emit,
    )
    hooks.agent_reply = agent_hooks
    try:
        return trio.run(
            _drive_hooked,
            hooks,
            repo,
            run_id,
            manifest,
            cp,
            emit,
            recorder,
            scratch,
            graph,
            options,
            resuming,
            handlers,
            fixes,
        )
    finally:
        close_event_sinks(bus)  # before the kill: a sink's program reads to the end first
        records = process_groups.records_dir(scratch)
        process_groups.kill_recorded(records, grace=2.0)
        process_groups.stop_watcher(records)
        bus.close()
        lock.release()


async def _drive_hooked(hooks: LifecycleHooks, *args: Any) -> RunResult:
    """The drive, with its non-blocking lifecycle hooks allowed to finish after it."""
    async with hooks.running():
        return await _drive(*args, hooks=hooks)


async def _drive(
    repo: GitRepo,
    run_id: str,
    manifest: Manifest,
    cp: Checkpoint,
    emit: Emit,
    recorder: Recorder | None,
    scratch: Path,
    graph: Graph,
    options: Options,
    resuming: bool,
    handlers: Callable[[str], Handler | None],
    fixes: Fixes,
    *,
    hooks: LifecycleHooks,
) -> RunResult:
    in_place = manifest.in_place
    hooks.on_usage = cp.spend  # what a prompt or agent hook's model spends is the run's
    cut_off = cutoff.CutOff()
    if resuming:
        meta = recorder.meta_tip if recorder else None
        tail = scratch / "events.jsonl"
        cut_off = cutoff.find_cut_off(cutoff.since_checkpoint(repo, meta, cp, tail))
    # The start-up's git calls run on a worker thread, as every git call from the trio
    # loop does: nothing else runs yet, but the loop is never the one that blocks.
    if recorder is not None and resuming:
        try:
            await trio.to_thread.run_sync(
                partial(recorder.reconcile, cp, base_sha=manifest.base_sha)
            )
        except MissingObject as exc:
            raise missing_object_error(
                run_id, recorder.run_ref, recorder.run_tip or "", exc
            ) from exc
    # What resume brings in (`--rebase`, `--workflow`): the next snapshot records it.
    fixed: dict[str, bytes | None] = {}
    if recorder is not None and (fixes.rebase is not None or fixes.workflow is not None):
        meta_tip = recorder.meta_tip
        assert meta_tip is not None
        fixed = await trio.to_thread.run_sync(
            partial(
                apply_fixes,
                repo,
                run_id,
                manifest,
                cp,
                recorder,
                fixes,
                emit,
                partial(_read_dir, repo, meta_tip, run_id=run_id),
            )
        )
    # A process killed after the exit checkpoint may have announced run.completed in the
    # tail (now queued for the next segment); the finish must not announce it twice.
    announced = (
        resuming
        and walk_finished(cp, graph)
        and _tail_has(scratch, cp.last_event_id, "run.completed")
    )
    if cp.status in TERMINAL and resuming and cp.status != oc.FAILED:
        return RunResult(
            run_id,
            cp.status,
            manifest.run_branch,
            manifest.meta_ref,
            recorder.run_tip if recorder else None,
        )
    emit(ev.SandboxInitializing(provider="local"))
    t0 = time.monotonic()
    fresh = False
    if in_place:
        check_in_place_home(repo, run_id, manifest)
        worktree = Path(repo.root)
    else:
        assert recorder is not None and recorder.run_tip is not None
        try:
            worktree, fresh = await trio.to_thread.run_sync(
                partial(
                    ensure_worktree,
                    repo,
                    run_id,
                    scratch,
                    recorder.run_tip,
                    emit,
                    new=not resuming,
                )
            )
        except FabroError as exc:
            emit(
                ev.SandboxFailed(
                    provider="local",
                    error=str(exc),
                    duration_ms=int((time.monotonic() - t0) * 1000),
                )
            )
            raise
        if not fresh:
            # What a cut-off stage left untracked must not leak into its rerun.
            await trio.to_thread.run_sync(
                partial(wt.remove_untracked, worktree, exclude_globs=recorder.exclude_globs)
            )
        recorder.worktree = worktree
    hooks.worktree = worktree
    emit(
        ev.SandboxReady(
            provider="local", duration_ms=int((time.monotonic() - t0) * 1000), name=str(worktree)
        )
    )
    emit(
        ev.SandboxInitialized(
            working_directory=str(worktree), provider="local", identifier=run_id, repo_cloned=False
        )
    )
    cp.context_values["internal.work_dir"] = str(worktree)
    if resuming and recorder is not None and recorder.meta_tip is not None:
        await trio.to_thread.run_sync(
            _restore_artifacts, repo, run_id, recorder.meta_tip, cp, scratch
        )
    if resuming and _has_begun(cp, scratch):
        emit(
            ev.RunNotice(
                level="info",
                code="resumed",
                message=f"resuming from checkpoint after {cp.current_node or 'start'}; next: {cp.next_node_id or 'start'}",
            )
        )
    cutoff.count_serials_on(cut_off, cp.stage_serials)
    cutoff.close_cut_off(cut_off, emit)
    cp.status = "running"
    cp.error = None
    pusher = LivePush(repo, run_id, options.push_remote, emit) if options.push_remote else None
    desk = GateDesk()  # the gates `git fabro attach` sees and answers
    emit(
        ev.RunStarted(
            name=graph.name,
            base_branch=manifest.base_branch,
            base_sha=manifest.base_sha,
            run_branch=manifest.run_branch,
            worktree_dir=str(worktree),
            goal=manifest.goal or None,
        )
    )
    runtime = Runtime(
        run_id=run_id,
        repo=repo,
        graph=graph,
        manifest=manifest,
        checkpoint=cp,
        emit_event=pusher.watching(emit) if pusher else emit,
        recorder=recorder,
        scratch=scratch,
        worktree=worktree,
        interviewer=SharedInterviewer(
            make_interviewer(
                auto_approve=options.auto_approve,
                answers=options.answers,
                interactive=options.interactive,
            ),
            desk,
            detached=options.detached,
        ),
        options=options,
        handlers=handlers,
        hooks=hooks,
    )
    runtime.resumed_attempts = cut_off.attempts
    runtime.pending_files.update(fixed)
    scope = runtime.main_scope()
    status = "running"
    error: str | None = None
    interrupted = False
    spent: SpendingCapReached | None = None
    # Signals are taken for the whole drive, the final snapshot included: the first
    # Ctrl-C (or SIGTERM) cancels the stage in flight, later ones only wait for the
    # checkpoint, and none can cut the finish short with a KeyboardInterrupt.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            main_scope = trio.CancelScope()
            stall = graph.get_duration("stall_timeout", 1800.0) or 0.0

            def interrupt() -> None:
                # The user asked to stop: nothing of the run may hold the exit, the
                # hooks running beside it included.
                nonlocal interrupted
                if not interrupted:
                    interrupted = True
                    main_scope.cancel()
                    hooks.stop()

            async def watch_signals() -> None:
                async for _ in signals:
                    interrupt()

            def stalled(idle: float) -> None:
                nonlocal error
                emit(
                    ev.WatchdogTimeout(idle_seconds=int(idle)),
                    node_id=scope.context.get("current_node"),
                )
                error = f"stall watchdog: no activity for {int(idle)}s (stall_timeout={stall:g}s)"
                main_scope.cancel()

            async def control_request(request: dict[str, Any]) -> dict[str, Any] | control.Stream:
                actor = _actor(request.get("actor"))
                if request.get("op") == "interrupt":
                    emit(ev.RunInterrupt(), actor=actor)
                    interrupt()
                    return {"ok": True}
                if request.get("op") == "steer" and isinstance(request.get("text"), str):
                    text = request["text"]
                    emit(ev.RunSteer(text=text), actor=actor)
                    return {"ok": True, "delivered": runtime.steer(text)}
                if request.get("op") == "attach":
                    return control.Stream(desk.follow)
                if request.get("op") == "answer" and isinstance(request.get("text"), str):
                    gate = request.get("id")
                    accepted = isinstance(gate, int) and desk.answer(gate, request["text"])
                    return {"ok": True, "accepted": accepted}
                return {"ok": False, "error": f"unknown request {request.get('op')!r}"}

            nursery.start_soon(watch_signals)
            await nursery.start(control.serve, scratch, control_request)
            if pusher is not None:
                await nursery.start(pusher.serve)
            if stall > 0:
                nursery.start_soon(watch_for_stall, AttendedRun(runtime, desk), stall, stalled)
            with main_scope:
                try:
                    if (
                        not cp.completed_nodes
                        and not cp.node_visits
                        and not cp.context_values.get("internal.setup_done")
                    ):
                        await _run_setup(runtime, manifest, worktree)
                        scope.context.set("internal.setup_done", True)
                    if fresh and not resuming and not manifest.settings.get("setup_commands"):
                        # The checkout is the tip's tree: a CLI stage needs no snapshot.
                        from fabro_git.engine import clean_start

                        await clean_start.after_fresh_checkout(runtime)
                    await _start_hooks(hooks, resuming=resuming)
                    status = await runtime.run_main(scope)
                except RunFailed as exc:
                    status, error = oc.FAILED, str(exc)
                except _SetupFailed as exc:
                    status, error = oc.FAILED, str(exc)
                except SpendingCapReached as exc:
                    status, spent = "interrupted", exc
                    emit(
                        ev.RunNotice(
                            level="warn",
                            code="max_cost_reached",
                            message=f"{exc}; stopped at the checkpoint after "
                            f"{cp.current_node}. Continue with a higher cap: "
                            f"`git fabro resume {run_id} --max-cost USD`",
                        )
                    )
            if main_scope.cancelled_caught:
                if interrupted:
                    status = "interrupted"
                else:
                    status = oc.FAILED
                    error = error or "run cancelled"
            nursery.cancel_scope.cancel()

        # What stages left running in the background goes before the worktree does (the
        # non-blocking hooks still running are awaited at the very end).
        process_groups.kill_recorded(process_groups.records_dir(scratch), grace=2.0, kind="stage")
        narrative = None
        if options.retro and options.retro_narrative and status != "interrupted":
            narrative = await retros.narrative_for(runtime, status, error)
        result = await _finish_heeding(
            signals,
            hooks,
            _finish(runtime, scope, status, error, announce=not announced, narrative=narrative),
        )
        if pusher is not None:
            await pusher.finish(signals)
        if spent is not None:
            result.error = str(spent)  # why it stopped, for the command's last words
        return result


async def _finish_heeding(
    signals: AsyncIterator[int], hooks: LifecycleHooks, finish: Awaitable[RunResult]
) -> RunResult:
    """Await `finish`; asked again meanwhile (Ctrl-C, SIGTERM), the hooks of the finish
    give way (`LifecycleHooks.cut_short`) and the final snapshot is still written. What
    `finish` raises comes out as it was raised."""

    async def cut_hooks_short() -> None:
        async for _ in signals:
            hooks.cut_short()

    try:
        async with trio.open_nursery() as finishing:
            finishing.start_soon(cut_hooks_short)
            try:
                return await finish
            finally:
                finishing.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The watcher raises nothing of its own: the error is the finish's.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def _actor(value: Any) -> Actor:
    """Who asked, as the requesting command said; a user of this machine either way."""
    if isinstance(value, dict) and isinstance(value.get("login"), str):
        return Actor(kind="user", login=value["login"], auth_method="local")
    return Actor(kind="user", auth_method="local")


def _has_begun(cp: Checkpoint, scratch: Path) -> bool:
    """Whether an earlier process started this run: `run -d` has its detached child load
    the run it just created the way a resume does, and that first start is no resume."""
    return (
        cp.status != "running"
        or cp.stage_index > 0
        or bool(cp.node_visits)
        or _tail_has(scratch, cp.last_event_id, "run.started")
    )


def _tail_has(scratch: Path, last_event_id: str | None, event: str) -> bool:
    """Whether the live tail holds `event` after the last snapshotted event."""
    tail = scratch / "events.jsonl"
    if not tail.exists():
        return False
    for line in tail_after(tail.read_bytes(), last_event_id).splitlines():
        with contextlib.suppress(msgspec.DecodeError):
            if msgspec.json.decode(line).get("event") == event:
                return True
    return False


class _SetupFailed(Exception):
    pass


async def _start_hooks(hooks: LifecycleHooks, *, resuming: bool) -> None:
    """`sandbox_ready`, then `run_start`: a block from either fails the run before its
    first stage (a skip has no stage to skip, and proceeds)."""
    for event in ("sandbox_ready", "run_start"):
        decision = await hooks.fire(event, resumed=resuming or None)
        if decision.action == "block":
            raise RunFailed(decision.describe(event))


async def _run_setup(runtime: Runtime, manifest: Manifest, worktree: Path) -> None:
    from fabro_git.engine.process import argv_for, run_script
    from fabro_git.engine.stage_env import (
        NOTICE_CODE,
        mentioned_stripped,
        stage_environment,
        stripped_notice,
    )
    from fabro_git.workflow.templates import script_environment

    commands = list(manifest.settings.get("setup_commands") or [])
    if not commands:
        return
    emit = runtime.emit
    emit(ev.SetupStarted(command_count=len(commands)))
    t0 = time.monotonic()
    logs = make_private_dir(runtime.scratch / "setup")
    records = process_groups.records_dir(runtime.scratch)
    sandbox = dict(((manifest.settings.get("config") or {}).get("sandbox") or {}).get("env") or {})
    try:
        # Setup commands are swept with the stages', when the walk ends.
        base = stage_environment(sandbox=sandbox, mark=process_groups.process_mark(records))
    except ConfigError as exc:
        raise _SetupFailed(str(exc)) from None
    env = script_environment(
        base, goal=manifest.goal, inputs=manifest.inputs, run_id=runtime.run_id
    )
    for index, command in enumerate(commands):
        names = mentioned_stripped(command, os.environ, sandbox)
        if names:
            where = f"setup command {index + 1}"
            emit(
                ev.RunNotice(level="warn", code=NOTICE_CODE, message=stripped_notice(names, where))
            )
        emit(ev.SetupCommandStarted(command=command, index=index))
        c0 = time.monotonic()
        out, err = logs / f"{index}.stdout", logs / f"{index}.stderr"
        code, _timed_out = await run_script(
            argv_for(command, "shell"),
            cwd=worktree,
            stdout=out,
            stderr=err,
            env=env,
            timeout=None,
            groups=records,
        )
        exit_code = -1 if code is None else code
        if exit_code != 0:
            stderr = err.read_bytes()[-4000:].decode("utf-8", "replace")
            emit(ev.SetupFailed(command=command, index=index, exit_code=exit_code, stderr=stderr))
            raise _SetupFailed(
                f"setup command {index + 1} ({command!r}) exited with status {exit_code}"
            )
        emit(
            ev.SetupCommandCompleted(
                command=command,
                index=index,
                exit_code=exit_code,
                duration_ms=int((time.monotonic() - c0) * 1000),
            )
        )
    emit(ev.SetupCompleted(duration_ms=int((time.monotonic() - t0) * 1000)))


async def _finish(
    runtime: Runtime,
    scope: Scope,
    status: str,
    error: str | None,
    *,
    announce: bool = True,
    narrative: dict[str, Any] | None = None,
) -> RunResult:
    cp = runtime.cp
    emit = runtime.emit
    recorder = runtime.recorder
    manifest = runtime.manifest
    cp.context_values = msgspec.json.decode(
        msgspec.json.encode(scope.context.snapshot(), enc_hook=str)
    )
    cp.timestamp = now_iso()
    cp.active_ms = runtime.active_ms()
    final_sha = recorder.run_tip if recorder else None
    if recorder is not None and status in (oc.SUCCEEDED, oc.PARTIAL):
        # No success that git cannot back: what the run wrote must still be there.
        lost = await runtime.store_call(recorder.missing_objects)
        if lost:
            status = oc.FAILED
            error = objects_lost_error(runtime.run_id, lost)
    if status == "interrupted":
        # The stage in flight did not finish: resume runs it again from a clean worktree.
        current = scope.context.get("current_node")
        if current and cp.next_node_id != current and cp.current_node != current:
            cp.next_node_id = current
        if current:
            _undo_unfinished_visit(cp, current)
        emit(
            ev.RunNotice(
                level="warn",
                code="interrupted",
                message=f"run interrupted; continue it with `git fabro resume {runtime.run_id}`",
            )
        )
    elif status == oc.FAILED:
        current = scope.context.get("current_node")
        if current and cp.pending_commit is None:
            cp.next_node_id = current
        cp.error = error
        emit(
            ev.RunFailed(
                error=error or "run failed", duration_ms=cp.active_ms, git_commit_sha=final_sha
            )
        )
        # The run is over: these hooks' decisions have nothing left to decide.
        await runtime.hooks.fire("run_failed", status=status, failure_reason=error or "run failed")
    else:
        cp.finished_at = cp.timestamp
        if announce:
            emit(
                ev.RunCompleted(
                    duration_ms=cp.active_ms,
                    artifact_count=cp.artifact_count,
                    status=oc.event_status(status),
                    total_cost=round(cp.total_cost, 6) if cp.total_cost else None,
                    final_git_commit_sha=final_sha,
                    usage=_run_usage(cp),
                )
            )
            await runtime.hooks.fire("run_complete", status=status)
    cp.status = status
    # A pending commit left by a failed run commit stays: the stage is recorded, and
    # resume makes (or finds) its commit before going on.
    # Every end releases the worktree, failed and interrupted ones too: the run branch is
    # then free for the user's own `git switch`, and resume checks it out again from git.
    # Ignored files in it (build caches) go with it; only a killed run keeps them.
    if recorder is not None and recorder.worktree is not None:
        await runtime.hooks.fire("sandbox_cleanup", status=status)
        await runtime.hooks.wait_worktree_free()
        emit(ev.SandboxCleanupStarted(provider="local"))
        c0 = time.monotonic()
        try:
            wt.remove_worktree(runtime.repo, recorder.worktree)
            emit(
                ev.SandboxCleanupCompleted(
                    provider="local", duration_ms=int((time.monotonic() - c0) * 1000)
                )
            )
        except FabroError as exc:
            emit(ev.SandboxCleanupFailed(provider="local", error=str(exc)))
    # The run's last record holds what its last hooks said (their notices).
    await runtime.hooks.wait_all_done()
    if recorder is not None:
        files = dict(runtime.pending_files)
        runtime.pending_files = {}
        if runtime.options.retro:
            failure = error if status == oc.FAILED else None
            files.update(retros.retro_files(runtime, status, failure, narrative))
        if recorder.snapshot("finalize", f"finalize {status}", cp, files) is None:
            # Reported above as run.notice; the exit status must not claim an outcome
            # that git does not hold.
            raise StoreError(
                f"run {runtime.run_id} ended {status}, but its final state could not be written to git",
                hint=f"fix the git error shown above, then `git fabro resume {runtime.run_id}`",
            )
    return RunResult(
        runtime.run_id,
        status,
        manifest.run_branch,
        manifest.meta_ref,
        final_sha,
        error,
    )


def _run_usage(cp: Checkpoint) -> ev.TokenUsage | None:
    """The run's tokens for `run.completed.usage`; None when no model was called."""
    tokens = cp.tokens
    if not tokens.total_tokens:
        return None
    return ev.TokenUsage(
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        total_tokens=tokens.total_tokens,
        reasoning_tokens=tokens.reasoning_tokens or None,
        cache_read_tokens=tokens.cache_read_tokens or None,
        cache_write_tokens=tokens.cache_write_tokens or None,
    )


def _undo_unfinished_visit(cp: Checkpoint, node_id: str) -> None:
    """A stage stopped before its outcome was recorded was no visit: resume runs the same
    visit again (as after a kill -9), and a node with max_visits=1 can still run."""
    entered = cp.node_visits.get(node_id, 0)
    if entered and cp.node_outcomes.get(node_id, {}).get("visit") != entered:
        if entered == 1:
            del cp.node_visits[node_id]
        else:
            cp.node_visits[node_id] = entered - 1


def write_json_result(result: RunResult) -> None:
    from fabro_git.terminal import json_printable

    sys.stdout.write(json_printable(msgspec.json.encode(result.to_json()).decode()) + "\n")
    sys.stdout.flush()


def check_in_place_home(repo: GitRepo, run_id: str, manifest: Manifest) -> None:
    """An in-place run resumes only in the checkout it ran in. The manifest's
    `source_directory` is run data (a fetched run's says whatever its author wrote), so it
    never chooses where stages run: it is only compared with this checkout."""
    if not manifest.in_place:
        return
    here = Path(repo.root).resolve()
    if Path(manifest.source_directory).resolve() != here:
        raise FabroError(
            f"run {run_id} ran in place in {manifest.source_directory!r}, not in {here}",
            hint="resume it from that checkout, or continue it in a worktree here with "
            f"`git fabro fork {run_id}`",
        )


def check_resumable(
    repo: GitRepo, run_id: str, stored: StoredRun, options: Options, graph: Graph | None = None
) -> None:
    """Refuse, before a resume touches the run, what `check_options` refuses before a
    run: a key unset since the run started, an agent CLI uninstalled since. `graph`
    is the workflow it goes on with, when not the one it ran."""
    if options.dry_run:
        return
    manifest, _cp, meta, source = stored
    check_in_place_home(repo, run_id, manifest)
    config = manifest.settings.get("config") or {}
    check_options(
        options,
        graph or _load_graph(repo, run_id, manifest, source, meta),
        (config.get("model") or {}).get("fallbacks"),
        cli_command=(config.get("agent") or {}).get("cli_command"),
    )


def check_options(
    options: Options,
    graph: Graph,
    fallbacks: Sequence[str] | None = None,
    *,
    cli_command: Sequence[str] | None = None,
) -> None:
    """Refuse, before the run exists, a workflow whose LLM stages cannot run: an unknown
    model or provider, a missing key, an agent CLI not installed. With --dry-run nothing
    is resolved."""
    if options.dry_run:
        return
    from fabro_git.engine.model_choice import check_stages
    from fabro_git.workflow.paths import descendants

    check_stages(
        [graph, *descendants(graph)],
        model=options.model,
        provider=options.provider,
        fallbacks=fallbacks,
        env=os.environ,
        cli_command=cli_command,
    )
