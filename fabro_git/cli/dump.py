"""`git fabro dump`: a run's recorded state as a directory of plain files.

Everything comes from the run's meta ref, so a clone that fetched the run's refs dumps
the same directory as the repository that ran it. The layout follows the metadata
tree, with the history surfaces that are spread over commits flattened out:

    run.json             the manifest (with the run's status and meta commit)
    checkpoint.json      the latest checkpoint
    graph.fabro          the workflow source; graphs/ the files it names
    events.jsonl         every event segment, in order (and, as `logs` adds them,
                         the local live tail's events no snapshot holds yet)
    checkpoints/NNN-NODE@VISIT.json   the checkpoint as each stage left it
    nodes/...            per-stage files, as stored (artifacts/ too, when recorded)
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

STREAM_AT = 1_000_000


def run(run_arg: str, output: Path) -> int:
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.confine import UnsafeEntry, checked_parts, write_confined
    from fabro_git.engine.checkpoint import encode, read_checkpoint
    from fabro_git.engine.reader import open_run
    from fabro_git.errors import ConfigError
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    target = output.expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{target} is not empty; dump writes only into a new or empty directory",
            hint="pass a new directory with -o, or empty this one first",
        )
    repo = GitRepo.discover(Path.cwd())
    run_id = resolve_run(repo, run_arg)
    with objects_of(run_id):
        reader = open_run(repo, run_id)
        manifest, cp, meta = reader.manifest, reader.checkpoint, reader.meta_sha
        files: dict[str, bytes] = {}
        # Files over STREAM_AT (a command's whole output) are copied from git to the dump
        # as a stream, never held in memory.
        streamed: list[str] = []
        for relpath, size in repo.list_files(meta, ""):
            if relpath.startswith(f"{runrefs.EVENTS_DIR}/") or relpath == runrefs.MANIFEST:
                continue
            if relpath == runrefs.CHECKPOINT:
                files[relpath] = encode(cp)  # complete, even when git holds a delta
            elif size > STREAM_AT:
                streamed.append(relpath)
            else:
                files[relpath] = repo.read_file(meta, relpath) or b""
        import msgspec

        from fabro_git.jsondata import JsonObject

        doc: JsonObject = msgspec.to_builtins(manifest)
        doc["status"] = reader.status
        doc["meta_sha"] = meta
        files["run.json"] = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        # As `logs` shows them: the live tail's events that no snapshot holds yet come last.
        files["events.jsonl"] = reader.recorded_events()
        entries = reader.timeline()
        width = max(3, len(str(len(entries))))
        for entry in entries:
            # Complete, as resume reads it (git holds most stage checkpoints as deltas).
            recorded = read_checkpoint(repo.read_file, entry.meta_sha)
            if recorded is not None:
                name = f"checkpoints/{entry.ordinal:0{width}d}-{entry.label}.json"
                files[name] = encode(recorded)
        # Every path is checked before anything is written (`fabro_git.confine`): the run's
        # metadata names them, and it may come from anywhere.
        try:
            for relpath in [*files, *streamed]:
                checked_parts(relpath)
            target.mkdir(parents=True, exist_ok=True)
            for relpath, data in sorted(files.items()):
                write_confined(target, relpath, data)
            for relpath in streamed:
                write_confined(target, relpath, partial(repo.copy_file, meta, relpath))
        except UnsafeEntry as err:
            raise err.for_run(run_id) from None
        print(
            f"dumped run {run_id} to {target} ({len(files) + len(streamed)} files, "
            f"{len(entries)} checkpoints)",
            file=sys.stderr,
        )
        return 0
