"""Finding a run whose metadata ref was deleted, from what this machine still holds.

A run is found by its `refs/fabro/meta/<id>`. When that ref is gone (a stage or a hand
ran `git update-ref -d`), the snapshots are usually still in the object store, and two
things still name the last one: the run's scratch dir, whose live event tail records
each `metadata.snapshot.completed` with its commit, and the run branch, whose tip's
`Fabro-Checkpoint` trailer names the snapshot it was made after. A candidate counts as
proven when it is a commit of this repository whose `manifest.json` names the run; of
two proven ones, the later in the metadata history wins.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from fabro_git.config.locations import repo_key, runs_dir
from fabro_git.errors import FabroError
from fabro_git.store import runs as runrefs
from fabro_git.store.repo import GitRepo

_SNAPSHOT_EVENT = b'"event":"metadata.snapshot.completed"'
_HEX = re.compile(r"[0-9a-f]{40}")
_TAIL_BYTES = 4 << 20  # the end of a long tail holds its last snapshots


class LostMeta(msgspec.Struct, frozen=True):
    run_id: str
    sha: str | None  # the snapshot to put the ref back at; None when none is proven
    scratch: Path
    detail: str  # why `sha` is None


def find_lost_run(repo: GitRepo, prefix: str) -> LostMeta | None:
    """The run, without a meta ref, whose id starts with `prefix` and whose scratch dir
    this repository still has; None when there is not exactly one."""
    wanted = prefix.strip().upper()
    suffix = "-" + repo_key(Path(repo.git_dir))
    try:
        names = [p.name for p in runs_dir().iterdir() if p.name.endswith(suffix)]
    except OSError:
        return None
    ids = [name.removesuffix(suffix) for name in names]
    matches = [rid for rid in ids if wanted and rid.upper().startswith(wanted)]
    matches = [rid for rid in matches if repo.read_ref(runrefs.meta_ref(rid)) is None]
    if len(matches) != 1:
        return None
    run_id = matches[0]
    scratch = runs_dir() / (run_id + suffix)
    named = (_from_tail(scratch), _from_branch(repo, run_id))
    candidates = [c for c in named if c and _HEX.fullmatch(c)]
    proven = [sha for sha in dict.fromkeys(candidates) if _is_snapshot_of(repo, sha, run_id)]
    if not proven:
        detail = (
            f"snapshot {candidates[0]} is not in this repository"
            if candidates
            else "neither its scratch dir nor its branch names a snapshot"
        )
        return LostMeta(run_id, None, scratch, detail)
    best = proven[0]
    for other in proven[1:]:
        try:
            if repo.is_ancestor(best, other):
                best = other
        except FabroError:
            continue
    return LostMeta(run_id, best, scratch, "")


def _from_tail(scratch: Path) -> str | None:
    """The commit of the last `metadata.snapshot.completed` in the run's live tail."""
    try:
        with (scratch / "events.jsonl").open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - _TAIL_BYTES))
            data = fh.read()
    except OSError:
        return None
    for line in reversed(data.splitlines()):
        if _SNAPSHOT_EVENT not in line:
            continue
        try:
            sha = msgspec.json.decode(line)["properties"]["commit_sha"]
        except (msgspec.DecodeError, KeyError, TypeError):
            continue
        if isinstance(sha, str):
            return sha
    return None


def _from_branch(repo: GitRepo, run_id: str) -> str | None:
    tip = repo.read_ref(runrefs.run_branch_ref(run_id))
    if tip is None:
        return None
    try:
        return repo.commit_info(tip).trailers.get(runrefs.TRAILER_CHECKPOINT)
    except FabroError:
        return None


def _is_snapshot_of(repo: GitRepo, sha: str, run_id: str) -> bool:
    try:
        data = repo.read_file(sha, runrefs.MANIFEST)
    except FabroError:
        return False
    if data is None:
        return False
    try:
        manifest = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return isinstance(manifest, dict) and manifest.get("run_id") == run_id


def restore_lost_run(repo: GitRepo, lost: LostMeta) -> str:
    """Put the meta ref back at the proven snapshot; the line that did it, to print."""
    assert lost.sha is not None
    ref = runrefs.meta_ref(lost.run_id)
    repo.update_ref(ref, lost.sha, old=None, message="fabro: resume restores a deleted meta ref")
    return f"git update-ref {ref} {lost.sha}"
