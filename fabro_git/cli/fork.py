"""`git fabro fork`: a new run that starts from a checkpoint of another one.

The new run is an ordinary run that has not been resumed yet: its meta ref starts with
an `init` snapshot holding the checkpoint as it stood when the chosen stage finished
(read from the source's meta history, never from its tip), and its run branch starts at
the run-branch commit made for that checkpoint, so the two runs share their history up
to there. `git fabro resume <new id>` carries on from the next stage. The source run's
refs are only read.

Its event log starts afresh with its own `run.created`, whose `fork_source_ref` names
the checkpoint; the events before that point stay in the source run's log.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec

from fabro_git.cli._timeline import CheckpointEntry, print_timeline, select, timeline


def run(run_arg: str, target: str | None, *, list_only: bool) -> int:
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.engine.session import load_run
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    source_id = resolve_run(repo, run_arg)
    with objects_of(source_id):
        manifest, _cp, _meta, _source = load_run(repo, source_id)
        entries = timeline(repo, source_id, base_sha=manifest.base_sha)
        if list_only:
            print_timeline(repo, entries, source_id)
            return 0
        entry = select(entries, target, run_id=source_id, command="fork")
        new_id = fork_run(repo, source_id, entry)
    from fabro_git.terminal import printable

    print(
        f"forked run {source_id} at {printable(entry.label, one_line=True)} as {new_id};"
        f" continue it with `git fabro resume {new_id}`",
        file=sys.stderr,
    )
    print(new_id)
    return 0


def fork_run(repo: Any, source_id: str, entry: CheckpointEntry) -> str:
    """Make the new run from `entry` of `source_id`; returns its id."""
    from fabro_git import __version__
    from fabro_git.config.locations import make_private_dir, run_scratch_dir
    from fabro_git.engine.checkpoint import decode_manifest, encode, read_checkpoint
    from fabro_git.engine.recorder import Recorder
    from fabro_git.engine.runner import now_iso
    from fabro_git.engine.session import _read_dir, make_emitter
    from fabro_git.errors import ConfigError, FabroError
    from fabro_git.events import catalogue as ev
    from fabro_git.events.bus import EventBus, TailFileSink
    from fabro_git.store import runs as runrefs

    at = entry.meta_sha
    manifest_data = repo.read_file(at, runrefs.MANIFEST)
    checkpoint = read_checkpoint(repo.read_file, at)
    source_text = repo.read_file(at, runrefs.GRAPH)
    if manifest_data is None or checkpoint is None or source_text is None:
        raise FabroError(
            f"run {source_id}: the checkpoint {entry.label} ({at[:12]}) is incomplete",
            hint=f"inspect it with `git show {at}`",
        )
    manifest = decode_manifest(manifest_data)
    if manifest.in_place:
        raise ConfigError(
            f"run {source_id} ran in place: it has no run-branch commits to start a new run from",
            hint="fork or rewind runs made in a worktree (without --in-place)",
        )
    cp = checkpoint
    # The run-branch commit of this checkpoint; if a crash kept it from being made,
    # the new run starts at its parent and resume makes it from the pending tree.
    if entry.run_commit is not None:
        start = entry.run_commit
        cp.git_commit_sha = start
        cp.pending_commit = None
    elif cp.pending_commit is not None:
        start = cp.pending_commit.parent
    else:
        start = cp.git_commit_sha or manifest.base_sha

    new_id = runrefs.new_ulid()
    now = now_iso()
    forked_from = {"run_id": source_id, "node": entry.node, "visit": entry.visit, "checkpoint": at}
    new_manifest = msgspec.structs.replace(
        manifest,
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
    cp.status = "running"
    cp.error = None
    cp.finished_at = None
    cp.started_at = now
    cp.timestamp = now
    cp.event_segments = 0
    cp.last_event_id = None
    cp.context_values["internal.run_id"] = new_id

    # The tail carries what the init snapshot cannot hold (its own completion event)
    # to the first resume, as for any new run.
    scratch = make_private_dir(run_scratch_dir(repo.git_dir, new_id))
    bus = EventBus(new_id, [TailFileSink(scratch / "events.jsonl")])
    emit = make_emitter(bus)
    created = _source_created_properties(repo, at)
    created.update(
        run_dir=str(scratch),
        source_directory=str(repo.root),
        repo_origin_url=new_manifest.origin_url,
        fork_source_ref={**forked_from, "git_commit_sha": start},
        in_place=False,
    )
    created.setdefault("settings", manifest.settings)
    created.setdefault("labels", manifest.labels)
    created.setdefault("workflow_slug", manifest.workflow_slug)
    created.setdefault("provenance", {"subject": {"kind": "user", "login": _login()}})
    created.setdefault("graph", {})
    emit(ev.RunCreated(**{k: v for k, v in created.items() if v is not None}))
    emit(
        ev.RunNotice(
            level="info",
            code="forked",
            message=f"forked from run {source_id} at {entry.label}; "
            f"continue with `git fabro resume {new_id}`",
        )
    )

    recorder = Recorder(
        repo,
        new_id,
        workflow_slug=new_manifest.workflow_slug,
        emit=emit,
        take_segment=bus.take_segment,
        worktree=None,
        exclude_globs=list(new_manifest.settings.get("exclude_globs") or []),
        meta_tip=None,
        run_tip=start,
    )
    files: dict[str, bytes | None] = {
        runrefs.MANIFEST: encode(new_manifest),
        runrefs.GRAPH: source_text,
    }
    for directory in (
        runrefs.GRAPHS_DIR,
        runrefs.NODES_DIR,
        runrefs.LEGACY_PROMPTS_DIR,
        runrefs.ARTIFACTS_DIR,
        runrefs.THREADS_DIR,
        runrefs.ASSETS_DIR,
    ):
        for relpath, data in _read_dir(repo, at, directory, run_id=source_id).items():
            files[f"{directory}/{relpath}"] = data
    try:
        meta_sha = recorder.snapshot("init", "init", cp, files)
    finally:
        bus.close()
    if meta_sha is None:
        raise FabroError(
            f"could not write the first snapshot of run {new_id} (see the error above)"
        )
    try:
        repo.update_ref(
            runrefs.run_branch_ref(new_id),
            start,
            old=None,
            message=f"fabro: fork {source_id} at {entry.label}",
        )
    except FabroError:
        # A run without its branch cannot be resumed: take the half-made run away again.
        repo.delete_ref(runrefs.meta_ref(new_id), old=meta_sha, message="fabro: fork failed")
        raise
    _copy_parallel_refs(repo, source_id, new_id, cp.node_visits)
    return new_id


def _copy_parallel_refs(repo: Any, source_id: str, new_id: str, visits: dict[str, int]) -> None:
    """The branch refs of the fan-outs the checkpoint has behind it, under the new run's
    name: its context names their commits, and they must stay reachable from its own refs
    whatever becomes of the source run."""
    from fabro_git.store import runs as runrefs

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


def _source_created_properties(repo: Any, meta_sha: str) -> dict[str, Any]:
    """The source run's own `run.created` properties (graph, source, settings), which
    the new run shares; empty if its first event segment does not hold one."""
    import json

    data = repo.read_file(meta_sha, "events/000001.jsonl") or b""
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


def _login() -> str:
    import os

    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
