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
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from fabro_git.engine.reader import CheckpointEntry
    from fabro_git.store.repo import GitRepo

# A file of the dump: its bytes, or what writes them to the open file (read from git
# only then, so the dump holds one file in memory at a time).
Content = bytes | Callable[[BinaryIO], object]


def run(run_arg: str, output: Path) -> int:
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.confine import UnsafeEntry, checked_parts, write_confined
    from fabro_git.engine.checkpoint import encode
    from fabro_git.engine.reader import open_run
    from fabro_git.errors import ConfigError
    from fabro_git.store import runs as runrefs
    from fabro_git.store.blobs import STREAM_AT
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
        files: dict[str, Content] = {}
        for relpath, size in repo.list_files(meta, ""):
            if relpath.startswith(f"{runrefs.EVENTS_DIR}/") or relpath == runrefs.MANIFEST:
                continue
            if relpath == runrefs.CHECKPOINT:
                files[relpath] = encode(cp)  # complete, even when git holds a delta
            elif size > STREAM_AT:  # a command's whole output: streamed by git
                files[relpath] = partial(repo.copy_file, meta, relpath)
            else:
                files[relpath] = partial(_copy_small, repo, meta, relpath)
        import msgspec

        from fabro_git.jsondata import JsonObject

        doc: JsonObject = msgspec.to_builtins(manifest)
        doc["status"] = reader.status
        doc["meta_sha"] = meta
        files["run.json"] = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
        # As `logs` shows them: the live tail's events that no snapshot holds yet come
        # last. Every segment is checked now, and read while the file is written.
        files["events.jsonl"] = partial(_write_blocks, reader.recorded_blocks())
        entries = reader.timeline()
        width = max(3, len(str(len(entries))))
        for entry in entries:
            # Complete, as resume reads it (git holds most stage checkpoints as deltas).
            if repo.file_size(entry.meta_sha, runrefs.CHECKPOINT) is not None:
                name = f"checkpoints/{entry.ordinal:0{width}d}-{entry.label}.json"
                files[name] = partial(_write_checkpoint, repo, run_id, entry)
        # Every path is checked before anything is written (`fabro_git.confine`): the run's
        # metadata names them, and it may come from anywhere.
        try:
            for relpath in files:
                checked_parts(relpath)
            target.mkdir(parents=True, exist_ok=True)
            for relpath, content in sorted(files.items()):
                write_confined(target, relpath, content)
        except UnsafeEntry as err:
            raise err.for_run(run_id) from None
        print(
            f"dumped run {run_id} to {target} ({len(files)} files, {len(entries)} checkpoints)",
            file=sys.stderr,
        )
        return 0


def _copy_small(repo: GitRepo, meta: str, relpath: str, out: BinaryIO) -> None:
    """A file of at most STREAM_AT bytes, read whole and written."""
    out.write(repo.read_file(meta, relpath) or b"")


def _write_blocks(blocks: Iterator[bytes], out: BinaryIO) -> None:
    for block in blocks:
        out.write(block)


def _write_checkpoint(repo: GitRepo, run_id: str, entry: CheckpointEntry, out: BinaryIO) -> None:
    """The checkpoint as the stage `entry` left it, complete (a delta put together)."""
    import msgspec

    from fabro_git.engine.checkpoint import encode, read_checkpoint
    from fabro_git.errors import FabroError

    try:
        recorded = read_checkpoint(repo.read_file, entry.meta_sha)
    except msgspec.DecodeError as exc:
        raise FabroError(
            f"run {run_id}: the checkpoint of {entry.label} ({entry.meta_sha[:12]}) cannot "
            f"be read ({exc}); the dump is incomplete"
        ) from exc
    if recorded is not None:
        out.write(encode(recorded))
