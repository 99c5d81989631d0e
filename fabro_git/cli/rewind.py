"""`git fabro rewind`: replace a run by a new one that starts from an earlier checkpoint.

It is `fork` plus one more snapshot on the source run, which records that the run is
superseded: its manifest gains `superseded_by`, its log a `run.notice`, and the commit a
`Fabro-Superseded-By` trailer that `ps` reads without opening a blob. The source keeps
its outcome and its history; `resume` refuses it and names the run that replaced it.

The source's lock is held throughout, so it cannot be resumed while it is replaced.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec

from fabro_git.cli._timeline import print_timeline, select, timeline
from fabro_git.cli.fork import fork_run


def run(run_arg: str, target: str | None, *, list_only: bool) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.lock import RunLock
    from fabro_git.engine.session import load_run
    from fabro_git.errors import FabroError
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    source_id = resolve_run(repo, run_arg)
    manifest, _cp, _meta, _source = load_run(repo, source_id)
    entries = timeline(repo, source_id, base_sha=manifest.base_sha)
    if list_only:
        print_timeline(repo, entries, source_id)
        return 0
    if target is None:
        raise FabroError(
            "rewind needs the checkpoint to go back to, as NODE, NODE@VISIT or @N",
            hint=f"list run {source_id}'s checkpoints with `git fabro rewind {source_id} --list`",
        )
    entry = select(entries, target, run_id=source_id, command="rewind")
    lock = RunLock(repo, source_id)
    lock.acquire()
    try:
        manifest, _cp, meta, _source = load_run(repo, source_id)
        if manifest.superseded_by:
            raise FabroError(
                f"run {source_id} was already rewound: run {manifest.superseded_by} replaced it",
                hint=f"rewind that run instead, or fork this one with `git fabro fork {source_id} {target}`",
            )
        new_id = fork_run(repo, source_id, entry)
        try:
            mark_superseded(repo, source_id, new_id, entry.label, meta)
        except FabroError as err:
            raise FabroError(
                f"run {new_id} now starts from {source_id} at {entry.label}, but run {source_id} "
                f"could not be marked superseded: {err.message}",
                hint=f"do not rewind again: continue with `git fabro resume {new_id}`",
            ) from err
    finally:
        lock.release()
    from fabro_git.terminal import printable

    print(
        f"rewound run {source_id} to {printable(entry.label, one_line=True)} as {new_id};"
        f" continue it with `git fabro resume {new_id}`",
        file=sys.stderr,
    )
    print(new_id)
    return 0


def mark_superseded(repo: Any, source_id: str, new_id: str, label: str, meta: str) -> None:
    from fabro_git.engine.checkpoint import Checkpoint, decode_manifest, encode, read_checkpoint
    from fabro_git.engine.recorder import segment_path
    from fabro_git.engine.session import make_emitter
    from fabro_git.events import catalogue as ev
    from fabro_git.events.bus import EventBus, last_event_id
    from fabro_git.store import runs as runrefs
    from fabro_git.store.snapshot import MetaSnapshotter

    manifest = decode_manifest(repo.read_file(meta, runrefs.MANIFEST) or b"")
    cp = read_checkpoint(repo.read_file, meta) or Checkpoint()
    bus = EventBus(source_id)
    make_emitter(bus)(
        ev.RunNotice(
            level="info",
            code="superseded",
            message=f"rewound to {label} as run {new_id}; this run is superseded",
        )
    )
    segment = bus.take_segment()
    cp.event_segments += 1
    cp.last_event_id = last_event_id(segment)
    manifest = msgspec.structs.replace(manifest, superseded_by=new_id)
    info = repo.commit_info(meta)
    trailers = {k: v for k, v in info.trailers.items() if k != runrefs.TRAILER_SUPERSEDED_BY}
    trailers[runrefs.TRAILER_SUPERSEDED_BY] = new_id
    message = f"superseded by {new_id}\n\n" + "".join(f"{k}: {v}\n" for k, v in trailers.items())
    MetaSnapshotter(repo, runrefs.meta_ref(source_id)).write(
        {
            runrefs.MANIFEST: encode(manifest),
            runrefs.CHECKPOINT: encode(cp),
            segment_path(cp.event_segments): segment,
        },
        message,
        expected_tip=meta,
    )
