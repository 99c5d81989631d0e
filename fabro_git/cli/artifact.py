"""`git fabro artifact list|cp`: a run's captured assets and offloaded values, from git.

Both live on the run's metadata ref, so a clone that fetched the run reads them with no
scratch dir: assets under `assets/<node_slug>/retry_<n>/` (one dir per attempt of a
stage, with its `manifest.json`), offloaded context values under
`artifacts/<node_slug>/<key>.json` (one per stage visit that set the key).

Each is named by a path in one tree: `<node_slug>/retry_<n>/<path in the worktree>` for
an asset, `<node_slug>/values/<key>.json` for a value. `list` prints those paths,
`cp RUN:PATH` copies one file (or a directory of them), and `cp --tree` lays files out
the same way; without `--tree` each file lands under its own name (its path in the
worktree, or `<key>.json`), and where two share a name the later stage's or retry's
wins, as in the context.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import BinaryIO

from fabro_git.engine.reader import Artifact, RunReader
from fabro_git.errors import ConfigError

# The reader's names for what this command lists.
Item = Artifact


def select(items: list[Item], node: str | None, retry: int | None) -> list[Item]:
    """Items of the stage `node` (NODE, NODE@VISIT or its slug) and attempt `retry`; an
    offloaded value has no attempt, so `retry` leaves assets only."""
    if node is not None:
        items = [i for i in items if node in (i.node, i.stage, i.slug)]
    if retry is not None:
        items = [i for i in items if i.retry == retry]
    return items


def human_size(size: int) -> str:
    if size < 1000:
        return f"{size} B"
    for unit in ("KB", "MB", "GB"):
        size_f = size / 1000
        if size_f < 1000 or unit == "GB":
            return f"{size_f:.1f} {unit}"
        size = int(size_f)
    return f"{size} B"


def _open(run_id: str) -> RunReader:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.reader import open_run
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    return open_run(repo, resolve_run(repo, run_id))


def _check_node(items: list[Item], node: str | None, reader: RunReader) -> None:
    if node is None:
        return
    found = reader.stages()
    if any(node in (s.name, s.label) for s in found) or any(node == i.slug for i in items):
        return
    known = ", ".join(dict.fromkeys(s.label for s in found)) or "none"
    raise ConfigError(f"no stage {node!r} in this run", hint=f"its stages: {known}")


def run_list(run_id: str, node: str | None, retry: int | None, json_output: bool) -> int:
    reader = _open(run_id)
    full_id = reader.run_id
    everything = reader.artifacts()
    _check_node(everything, node, reader)
    items = select(everything, node, retry)
    out = sys.stdout
    if json_output:
        out.write(json.dumps({"run_id": full_id, "artifacts": [i.to_json() for i in items]}))
        out.write("\n")
        return 0
    if not items:
        sys.stderr.write(f"no assets or offloaded values in run {full_id[:12]}")
        sys.stderr.write(" for that filter\n" if node or retry is not None else "\n")
        return 0
    from fabro_git.terminal import printable

    # Stage names and paths come from the run's tree: shown through the one sanitiser.
    rows = [(printable(i.kind, one_line=True), printable(i.stage, one_line=True), i) for i in items]
    width = max(len("STAGE"), *(len(stage) for _, stage, _ in rows))
    out.write(f"{'KIND':<5}  {'STAGE':<{width}}  {'RETRY':>5}  {'SIZE':>9}  PATH\n")
    for kind, stage, item in rows:
        retry_text = str(item.retry) if item.retry is not None else "-"
        out.write(
            f"{kind:<5}  {stage:<{width}}  {retry_text:>5}  "
            f"{human_size(item.size):>9}  {printable(item.tree_path, one_line=True)}\n"
        )
    out.write(f"\ncopy them: git fabro artifact cp {full_id[:12]}[:PATH] DEST [--tree]\n")
    return 0


def _write_confined(reader: RunReader, dest: Path, targets: dict[str, Item]) -> tuple[int, int]:
    """Write each target's bytes below `dest`, every path checked first
    (`fabro_git.confine`): tree entry names come from the run's metadata, which may come
    from anywhere, and `dest` may be a checkout whose symlinks lead out of it."""
    from fabro_git.confine import UnsafeEntry, checked_parts, write_confined

    sizes: list[int] = []
    try:
        for target in targets:
            checked_parts(target)
        for target, item in targets.items():
            # Read as it is written, a big one streamed: never all of them in memory.
            write_confined(dest, target, partial(_copy, reader, item, sizes))
    except UnsafeEntry as err:
        raise err.for_run(reader.run_id) from None
    return len(sizes), sum(sizes)


def _copy(reader: RunReader, item: Item, sizes: list[int], out: BinaryIO) -> None:
    """Write `item` to `out`, and its size to `sizes`."""
    if reader.copy_artifact(item, out):
        sizes.append(out.tell())


def run_cp(source: str, dest: Path, node: str | None, retry: int | None, tree: bool) -> int:
    run_id, _, wanted = source.partition(":")
    reader = _open(run_id)
    full_id = reader.run_id
    everything = reader.artifacts()
    _check_node(everything, node, reader)
    items = select(everything, node, retry)
    wanted = wanted.strip("/")
    if wanted:
        items = [i for i in items if i.tree_path == wanted or i.tree_path.startswith(wanted + "/")]
    if not items:
        what = f"{wanted!r} in run {full_id[:12]}" if wanted else f"run {full_id[:12]}"
        raise ConfigError(
            f"no assets or offloaded values match {what}",
            hint=f"see what there is: git fabro artifact list {full_id[:12]}",
        )
    targets: dict[str, Item] = {}
    superseded = 0
    for item in items:  # in the order the stages ran: the latest file of a name wins
        target = item.tree_path if tree else item.name
        superseded += target in targets
        targets[target] = item
    if tree:
        # With the tree layout, each attempt's manifest comes along.
        for slug, attempt in sorted({(i.slug, i.retry) for i in items if i.retry is not None}):
            manifest = f"{slug}/retry_{attempt}/manifest.json"
            meta_path = f"assets/{manifest}"
            if reader.repo.file_size(reader.meta_sha, meta_path) is not None:
                targets[manifest] = Item("asset", "", "", slug, attempt, "", meta_path, 0)
    written, total = _write_confined(reader, dest, targets)
    sys.stdout.write(
        f"copied {written} file{'s' if written != 1 else ''} ({human_size(total)}) to {dest}\n"
    )
    if superseded:
        sys.stdout.write(
            f"{superseded} earlier file{'s' if superseded != 1 else ''} of the same name "
            "left out (a later stage or retry wrote it again); --tree keeps every one\n"
        )
    return 0
