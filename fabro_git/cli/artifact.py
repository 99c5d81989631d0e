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
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabro_git.errors import ConfigError

_RETRY_RE = re.compile(r"retry_(\d+)\Z")


@dataclass(frozen=True)
class Item:
    kind: str  # "asset" or "value"
    stage: str  # NODE@VISIT, with the parent's id for a child workflow's stage
    node: str
    slug: str
    retry: int | None  # the attempt, for an asset
    name: str  # the path in the worktree (asset) or `<key>.json` (value)
    meta_path: str  # where the bytes are on the metadata ref
    size: int

    @property
    def tree_path(self) -> str:
        if self.kind == "asset":
            return f"{self.slug}/retry_{self.retry}/{self.name}"
        return f"{self.slug}/values/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "stage": self.stage,
            "node": self.node,
            "retry": self.retry,
            "path": self.tree_path,
            "name": self.name,
            "bytes": self.size,
        }


def collect(repo: Any, meta: str) -> list[Item]:
    """Every asset and offloaded value of the snapshot `meta`, in the order the stages
    ran (then by retry and path); `manifest.json` files aside."""
    from fabro_git.cli.show import stages
    from fabro_git.store import runs as layout

    order: dict[str, tuple[int, str, str]] = {}
    for index, stage in enumerate(stages(repo, meta)):
        slug = layout.node_slug(stage.path.removeprefix(f"{layout.NODES_DIR}/"))
        order[slug] = (index, stage.label, stage.name)
    items: list[Item] = []
    for relpath, size in repo.list_files(meta, layout.ASSETS_DIR):
        slug, _, rest = relpath.partition("/")
        retry_dir, _, name = rest.partition("/")
        match = _RETRY_RE.match(retry_dir)
        if not match or not name or name == "manifest.json":
            continue
        items.append(
            _item(order, "asset", slug, int(match.group(1)), name, f"assets/{relpath}", size)
        )
    for relpath, size in repo.list_files(meta, layout.ARTIFACTS_DIR):
        slug, _, name = relpath.partition("/")
        if not name or "/" in name:
            continue  # a key's current value: the same bytes as a stage visit's file
        items.append(_item(order, "value", slug, None, name, f"artifacts/{relpath}", size))
    items.sort(key=lambda i: (order.get(i.slug, (len(order), "", ""))[0], i.retry or 0, i.name))
    return items


def _item(
    order: dict[str, tuple[int, str, str]],
    kind: str,
    slug: str,
    retry: int | None,
    name: str,
    meta_path: str,
    size: int,
) -> Item:
    _, stage, node = order.get(slug, (0, slug, slug))
    return Item(kind, stage, node, slug, retry, name, meta_path, size)


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


def _open(run_id: str) -> tuple[Any, str, str]:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.session import load_run
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    _manifest, _cp, meta, _source = load_run(repo, full_id)
    return repo, full_id, meta


def _check_node(items: list[Item], node: str | None, repo: Any, meta: str) -> None:
    if node is None:
        return
    from fabro_git.cli.show import stages

    found = stages(repo, meta)
    if any(node in (s.name, s.label) for s in found) or any(node == i.slug for i in items):
        return
    known = ", ".join(dict.fromkeys(s.label for s in found)) or "none"
    raise ConfigError(f"no stage {node!r} in this run", hint=f"its stages: {known}")


def run_list(run_id: str, node: str | None, retry: int | None, json_output: bool) -> int:
    repo, full_id, meta = _open(run_id)
    everything = collect(repo, meta)
    _check_node(everything, node, repo, meta)
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


def _write_confined(
    repo: Any, run_id: str, meta: str, dest: Path, targets: dict[str, Item]
) -> tuple[int, int]:
    """Write each target's bytes below `dest`, every path checked first
    (`fabro_git.confine`): tree entry names come from the run's metadata, which may come
    from anywhere, and `dest` may be a checkout whose symlinks lead out of it."""
    from fabro_git.confine import UnsafeEntry, checked_parts, write_confined

    written = total = 0
    try:
        for target in targets:
            checked_parts(target)
        for target, item in targets.items():
            data = repo.read_file(meta, item.meta_path)
            if data is None:
                continue
            write_confined(dest, target, data)
            written += 1
            total += len(data)
    except UnsafeEntry as err:
        raise err.for_run(run_id) from None
    return written, total


def run_cp(source: str, dest: Path, node: str | None, retry: int | None, tree: bool) -> int:
    run_id, _, wanted = source.partition(":")
    repo, full_id, meta = _open(run_id)
    everything = collect(repo, meta)
    _check_node(everything, node, repo, meta)
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
            if repo.read_file(meta, meta_path) is not None:
                targets[manifest] = Item("asset", "", "", slug, attempt, "", meta_path, 0)
    written, total = _write_confined(repo, full_id, meta, dest, targets)
    sys.stdout.write(
        f"copied {written} file{'s' if written != 1 else ''} ({human_size(total)}) to {dest}\n"
    )
    if superseded:
        sys.stdout.write(
            f"{superseded} earlier file{'s' if superseded != 1 else ''} of the same name "
            "left out (a later stage or retry wrote it again); --tree keeps every one\n"
        )
    return 0
