"""Run ids and the names of the refs a run owns.

A run is known by a ULID: it sorts by creation time, so `git for-each-ref` and `ps` list
runs in order without reading anything else, and any unique prefix names a run. All of
a run's state hangs off refs derived from its id, so listing runs is listing
`refs/fabro/meta/*`, and a fresh clone (which copies `refs/heads/*` only) can find a
run on the remote and fetch just that run's refs.

This module is also the one owner of the run layout: ref names, the subjects and
trailers of run-branch, branch and meta commits, and the paths of the metadata tree.
Writers and readers both go through the names here, so the two cannot drift.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import re
import threading
import time
from collections.abc import Collection, Iterator, Mapping

import msgspec

from fabro_git.errors import AmbiguousRunId, RunNotFound, StoreError
from fabro_git.store import remote as _remote
from fabro_git.store.blobs import SEGMENT_MAX_BYTES
from fabro_git.store.repo import RUN_BRANCH_PREFIX, GitRepo, ref_conflict_error
from fabro_git.store.run_names import BATCH_PREFIX as BATCH_PREFIX
from fabro_git.store.run_names import META_PREFIX as META_PREFIX
from fabro_git.store.run_names import is_run_id as is_run_id

PARALLEL_PREFIX = "refs/fabro/parallel/"
BATCH_RECORD = "batch.json"

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ALIASES = str.maketrans({"I": "1", "L": "1", "O": "0"})
_ULID_LEN = 26


def run_branch_name(run_id: str) -> str:
    return f"fabro/run/{run_id}"


def run_branch_ref(run_id: str) -> str:
    return f"{RUN_BRANCH_PREFIX}{run_id}"


def meta_ref(run_id: str) -> str:
    return f"{META_PREFIX}{run_id}"


def batch_ref(batch_id: str) -> str:
    """Where a batch's record is kept: under `refs/fabro/`, so `fetch` and `push` of
    runs carry it, but outside the run namespaces, so no listing of runs sees it."""
    return f"{BATCH_PREFIX}{batch_id}"


def parallel_ref(run_id: str, node_id: str, branch_index: int) -> str:
    # Its own namespace, so it can never sit beneath the run branch or the meta ref
    # (git refuses `a/b/c` next to a ref `a/b`).
    return f"{PARALLEL_PREFIX}{run_id}/{node_id}/{branch_index}"


def child_progress_ref(run_id: str, stage_id: str) -> str:
    """Where a child workflow's progress inside the parent stage `stage_id` is kept:
    beside the run's branch refs, so `rm`, `prune`, `fetch` and `push` take it along."""
    return f"{PARALLEL_PREFIX}{run_id}/_child/{stage_id}"


# -- the metadata tree ---------------------------------------------------------------

MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint.json"
GRAPH = "graph.fabro"
GRAPHS_DIR = "graphs"
EVENTS_DIR = "events"
NODES_DIR = "nodes"
NODE_STATUS = "status.json"
ARTIFACTS_DIR = "artifacts"
THREADS_DIR = "threads"
ASSETS_DIR = "assets"
# Runs recorded before `graphs/` kept their @file prompts as `prompts/<node>.md`.
LEGACY_PROMPTS_DIR = "prompts"
# Written at the run's end (`outputs.retro`); `inspect --retro` reads it.
RETRO = "retro.json"
# Event segments per shard directory: `events/<NNN>/` holds segments NNN000..NNN999, so a
# snapshot rewrites one shard tree of at most this many entries, however long the run.
SEGMENTS_PER_SHARD = 1000
_SEGMENT_RE = re.compile(r"^(\d{6,})\.jsonl$")
_SHARD_RE = re.compile(r"^\d{3,}$")


def segment_path(number: int) -> str:
    """Where the `number`th event segment (1-based) lives in the metadata tree."""
    return f"{EVENTS_DIR}/{number // SEGMENTS_PER_SHARD:03d}/{number:06d}.jsonl"


def flat_segment_path(number: int) -> str:
    """Where runs recorded before the sharded layout kept their `number`th segment."""
    return f"{EVENTS_DIR}/{number:06d}.jsonl"


def segment_number(name: str) -> int | None:
    """The segment number a file name such as `000042.jsonl` stands for; None otherwise."""
    match = _SEGMENT_RE.match(name)
    return int(match.group(1)) if match else None


def node_dir(node_dir_name: str) -> str:
    """The metadata directory of a stage: `nodes/<node>` or `nodes/<node>-<visit>`."""
    return f"{NODES_DIR}/{node_dir_name}"


def node_dir_name(node_id: str, visit: int) -> str:
    """A repeat visit appends its count to the node's directory name (the first does not)."""
    return node_id if visit <= 1 else f"{node_id}-{visit}"


def artifact_path(name: str, *, text: bool = False) -> str:
    """Where an offloaded context value is kept: `artifacts/<name>.json`, or for one
    kept as its raw text (a long reply, `outputs.artifacts.TextFile`) `<name>.md`."""
    return f"{ARTIFACTS_DIR}/{name}{'.md' if text else '.json'}"


_THREAD_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def thread_path(thread_id: str) -> str:
    """Where a shared conversation (`thread_id`) is kept: `threads/<id>.json`, or under
    a digest of the id when it is not a plain file name."""
    name = thread_id
    if not _THREAD_NAME_RE.match(name) or name.endswith("."):
        name = "sha256-" + hashlib.sha256(thread_id.encode()).hexdigest()[:32]
    return f"{THREADS_DIR}/{name}.json"


def node_slug(node_dir_name: str) -> str:
    """A stage's directory name as one path component: a child workflow's stage
    `parent/nodes/child-2` is `parent.child-2` (node ids hold neither `.` nor `-`)."""
    return node_dir_name.replace(f"/{NODES_DIR}/", ".")


def asset_dir(slug: str, attempt: int) -> str:
    """Where the assets one attempt of a stage captured are kept:
    `assets/<node_slug>/retry_<attempt>` (the first attempt is `retry_1`)."""
    return f"{ASSETS_DIR}/{slug}/retry_{attempt}"


def graph_path(relative: str) -> str:
    """Where a child workflow or @file prompt the run read is kept, by its relative path."""
    return f"{GRAPHS_DIR}/{relative}"


def list_segments(repo: GitRepo, meta_sha: str) -> list[str]:
    """The paths of every event segment of the snapshot `meta_sha`, in order.

    Both layouts are read: the sharded `events/<NNN>/<NNNNNN>.jsonl` and the flat
    `events/<NNNNNN>.jsonl` of runs recorded before it; a run resumed across the change
    holds both, and the numbers say the order.
    """
    return [path for path, _ in _segments(repo, meta_sha)]


def _segments(repo: GitRepo, meta_sha: str) -> Iterator[tuple[str, str]]:
    """Every event segment of `meta_sha` (see `list_segments`) in order: its path and
    blob id. The shards are listed one at a time, each when its turn comes: shard NNN
    holds segments NNN000..NNN999, so the flat ones are merged in by number."""
    flat: list[tuple[int, str, str]] = []
    shards: list[tuple[int, str]] = []
    for name, (mode, sha) in (repo.dir_entries(meta_sha, EVENTS_DIR) or {}).items():
        number = segment_number(name)
        if number is not None and _is_file(mode):
            flat.append((number, f"{EVENTS_DIR}/{name}", sha))
        elif _SHARD_RE.match(name):
            shards.append((int(name), f"{EVENTS_DIR}/{name}"))

    def sharded() -> Iterator[tuple[int, str, str]]:
        for _, shard in sorted(shards):
            found = []
            for inner, (mode, sha) in (repo.dir_entries(meta_sha, shard) or {}).items():
                number = segment_number(inner)
                if number is not None and _is_file(mode):
                    found.append((number, f"{shard}/{inner}", sha))
            yield from sorted(found)

    for _, path, sha in heapq.merge(sharded(), sorted(flat), key=lambda found: found[0]):
        yield path, sha


def _is_file(mode: int) -> bool:
    """Whether a tree entry's mode is a file's (a blob), not a directory's or a submodule's."""
    return mode & 0o170000 not in (0o040000, 0o160000)


def read_segment(repo: GitRepo, meta_sha: str, number: int) -> bytes | None:
    """The `number`th event segment of `meta_sha`, in either layout; None if absent."""
    data = repo.read_file(meta_sha, segment_path(number), limit=SEGMENT_MAX_BYTES)
    if data is None:
        data = repo.read_file(meta_sha, flat_segment_path(number), limit=SEGMENT_MAX_BYTES)
    return data


def check_segments(repo: GitRepo, meta_sha: str) -> None:
    """Refuse the event log of the snapshot `meta_sha` before a segment of it is read:
    `BlobTooLarge` when one is bigger than a segment may be (`SEGMENT_MAX_BYTES`),
    `MissingObject` when git does not have one. Each is judged by its header."""
    for path, sha in _segments(repo, meta_sha):
        repo.check_blob(sha, path=path, limit=SEGMENT_MAX_BYTES)


def iter_segments(repo: GitRepo, meta_sha: str) -> Iterator[bytes]:
    """Every event segment of the snapshot `meta_sha`, in order, each newline-terminated
    and the only one in memory: what reads them costs the largest segment, not the run.
    The segments are read by id: the trees on the way are read once, not once a
    segment."""
    for path, sha in _segments(repo, meta_sha):
        data = repo.read_blob(sha, limit=SEGMENT_MAX_BYTES, path=path)
        if data:
            yield data if data.endswith(b"\n") else data + b"\n"


def read_events(repo: GitRepo, meta_sha: str) -> bytes:
    """Every durable event line of the snapshot `meta_sha`, in order, newline-terminated,
    as one buffer (`iter_segments` gives them a segment at a time)."""
    return b"".join(iter_segments(repo, meta_sha))


# -- commit messages -------------------------------------------------------------------

TRAILER_RUN = "Fabro-Run"
TRAILER_COMPLETED = "Fabro-Completed"
TRAILER_CHECKPOINT = "Fabro-Checkpoint"
TRAILER_BRANCH = "Fabro-Branch"
# On the meta snapshot `rewind` adds to the run it replaced: the id of the run that carries on.
TRAILER_SUPERSEDED_BY = "Fabro-Superseded-By"
# On the merge commit `resume --rebase REV` adds to a run branch: the commit merged.
TRAILER_REBASED_ONTO = "Fabro-Rebased-Onto"
_SNAPSHOT_SUBJECT_RE = re.compile(r"^checkpoint (?P<node>.+)@(?P<visit>\d+)$")


def run_commit_message(
    run_id: str, node_id: str, status: str, completed: int, meta_sha: str
) -> str:
    """The message of a stage's commit on the run branch."""
    return (
        f"fabro({run_id}): {node_id} ({status})\n\n"
        f"{TRAILER_RUN}: {run_id}\n"
        f"{TRAILER_COMPLETED}: {completed}\n"
        f"{TRAILER_CHECKPOINT}: {meta_sha}\n"
    )


def branch_commit_message(run_id: str, node_id: str, status: str, branch: str) -> str:
    """The message of a parallel branch stage's commit on its branch ref."""
    return f"fabro({run_id}): {node_id} ({status})\n\n{TRAILER_RUN}: {run_id}\n{TRAILER_BRANCH}: {branch}\n"


def fan_out_base_message(run_id: str, node_id: str) -> str:
    """The message of the commit a fan-out makes of the worktree its branches start from."""
    return f"fabro({run_id}): {node_id} fan-out base\n\n{TRAILER_RUN}: {run_id}\n"


def child_progress_message(run_id: str, node_id: str, state: str) -> str:
    """A child workflow's progress commit: its stage, then the walk's state as JSON."""
    return f"fabro({run_id}): {node_id} child progress\n\n{state}\n"


def is_run_commit_for(trailers: Mapping[str, str], run_id: str, completed: int) -> bool:
    """True when a commit's trailers mark it as `run_id`'s commit after `completed` stages."""
    return trailers.get(TRAILER_RUN) == run_id and trailers.get(TRAILER_COMPLETED) == str(completed)


def snapshot_subject_checkpoint(node_id: str, visit: int) -> str:
    """The subject of the meta snapshot taken after a stage: `checkpoint <node>@<visit>`."""
    return f"checkpoint {node_id}@{visit}"


def snapshot_subject_finalize(status: str) -> str:
    return f"finalize {status}"


SNAPSHOT_SUBJECT_INIT = "init"


class SnapshotSubject(msgspec.Struct, frozen=True):
    """What a meta snapshot's subject says happened."""

    kind: str  # "init", "checkpoint", "finalize" or "other"
    node_id: str | None = None
    visit: int | None = None
    status: str | None = None


def parse_snapshot_subject(subject: str) -> SnapshotSubject:
    """The inverse of the `snapshot_subject_*` functions, for readers of the meta history."""
    subject = subject.strip()
    if subject == SNAPSHOT_SUBJECT_INIT:
        return SnapshotSubject("init")
    match = _SNAPSHOT_SUBJECT_RE.match(subject)
    if match:
        return SnapshotSubject("checkpoint", node_id=match["node"], visit=int(match["visit"]))
    if subject.startswith("finalize "):
        return SnapshotSubject("finalize", status=subject[len("finalize ") :])
    return SnapshotSubject("other")


class MetaSummary(msgspec.Struct):
    """What `ps` reads from a meta commit's trailers without opening any blob."""

    status: str
    workflow: str
    node: str | None
    next_node: str | None
    started: str
    updated: str
    active_ms: int | None
    cost: float | None = None
    # Input and output tokens of the run's model calls so far.
    tokens: tuple[int, int] = (0, 0)

    def trailers(self, run_id: str) -> str:
        lines = [
            f"{TRAILER_RUN}: {run_id}",
            f"Fabro-Status: {self.status}",
            f"Fabro-Workflow: {self.workflow}",
        ]
        if self.node:
            lines.append(f"Fabro-Node: {self.node}")
        if self.next_node:
            lines.append(f"Fabro-Next: {self.next_node}")
        lines += [
            f"Fabro-Started: {self.started}",
            f"Fabro-Updated: {self.updated}",
            f"Fabro-Active-Ms: {self.active_ms if self.active_ms is not None else 0}",
        ]
        if self.cost:
            lines.append(f"Fabro-Cost: {self.cost:.6f}")
        if any(self.tokens):
            lines.append(f"Fabro-Tokens: {self.tokens[0]} {self.tokens[1]}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_trailers(cls, trailers: Mapping[str, str]) -> MetaSummary:
        """Read back what `trailers` wrote; a missing field reads as unknown."""
        try:
            active: int | None = int(trailers.get("Fabro-Active-Ms", ""))
        except ValueError:
            active = None
        try:
            cost: float | None = float(trailers.get("Fabro-Cost", ""))
        except ValueError:
            cost = None
        try:
            given, made = (int(part) for part in trailers.get("Fabro-Tokens", "").split())
        except ValueError:
            given, made = 0, 0
        return cls(
            status=trailers.get("Fabro-Status", "unknown"),
            workflow=trailers.get("Fabro-Workflow", "?"),
            node=trailers.get("Fabro-Node"),
            next_node=trailers.get("Fabro-Next"),
            started=trailers.get("Fabro-Started", ""),
            updated=trailers.get("Fabro-Updated", ""),
            active_ms=active,
            cost=cost,
            tokens=(given, made),
        )


def check_names_free(repo: GitRepo, run_id: str, *, with_branch: bool) -> None:
    """Refuse, before anything is written, when an existing ref (a user's branch named
    `fabro`, say) sits where one of the run's refs needs a directory."""
    names = [meta_ref(run_id)] + ([run_branch_ref(run_id)] if with_branch else [])
    for name in names:
        conflict = repo.conflicting_ref(name)
        if conflict is not None:
            raise ref_conflict_error(name, conflict)


def run_refs(repo: GitRepo, run_id: str) -> dict[str, str]:
    """Every ref the run owns here, {name: sha}: its parallel branches' heads, then its
    branch, then its meta ref. Deleting in this order keeps the run listed (by its meta
    ref) until nothing else of it is left, so a deletion cut short can be done again."""
    refs = dict(repo.list_refs(f"{PARALLEL_PREFIX}{run_id}"))
    for name in (run_branch_ref(run_id), meta_ref(run_id)):
        sha = repo.read_ref(name)
        if sha is not None:
            refs[name] = sha
    return refs


def list_run_ids(repo: GitRepo) -> list[str]:
    """Ids of the runs this repository has metadata for, oldest first."""
    return sorted(
        name[len(META_PREFIX) :]
        for name in repo.list_refs(META_PREFIX)
        if is_run_id(name[len(META_PREFIX) :])
    )


def list_batch_ids(repo: GitRepo) -> list[str]:
    """Ids of the batches this repository has a record of, oldest first."""
    return sorted(
        name[len(BATCH_PREFIX) :]
        for name in repo.list_refs(BATCH_PREFIX)
        if is_run_id(name[len(BATCH_PREFIX) :])
    )


def is_allocated_id(name: str) -> bool:
    """Whether `name` is a whole run id as `new_ulid` makes them (a batch's ids)."""
    return len(name) == _ULID_LEN and all(c in _CROCKFORD for c in name)


def resolve_run_id(repo: GitRepo, prefix: str, *, remote: str | None = "origin") -> str:
    """The one run whose id starts with `prefix` (case-insensitive).

    Local runs first. If none matches and `remote` is configured, the remote's run
    refs are listed; a single match there is fetched (meta ref, run branch and
    parallel refs) and its id returned.
    """
    wanted = _normalise(prefix)
    if not wanted:
        raise RunNotFound("no run id given", hint="pass a run id or a prefix of one (git fabro ps)")
    local = [rid for rid in list_run_ids(repo) if rid.upper().startswith(wanted)]
    exact = [rid for rid in local if rid.upper() == wanted]
    if exact:
        return exact[0]
    if len(local) == 1:
        return local[0]
    if len(local) > 1:
        raise _ambiguous(prefix, local)
    has_remote = remote is not None and repo.origin_url(remote) is not None
    if remote is not None and has_remote:
        found = _resolve_remote(repo, remote, prefix, wanted)
        if found is not None:
            return found
    where = f"here or on {remote}" if has_remote else "here"
    raise RunNotFound(
        f"no run matches {prefix!r} {where}",
        hint="list runs with git fabro ps; fetch runs from a remote with git fabro fetch",
    )


def _resolve_remote(repo: GitRepo, remote: str, prefix: str, wanted: str) -> str | None:
    try:
        matches, refs = _remote_matches(repo, remote, wanted)
    except StoreError as err:
        raise RunNotFound(
            f"no local run matches {prefix!r}, and {remote} could not be listed: {err.message}",
            hint=f"check that {remote} is reachable, then retry or run git fabro fetch",
        ) from err
    if not matches:
        return None
    if len(matches) > 1:
        raise _ambiguous(prefix, matches, where=f" on {remote}")
    run_id = matches[0]
    _fetch_listed(repo, remote, run_id, refs)
    return run_id


def fetch_run(
    repo: GitRepo, remote: str, prefix: str, *, skip: Collection[str] = ()
) -> tuple[str, _remote.FetchReport]:
    """Fetch the refs of the one run on `remote` whose id starts with `prefix`, whether or
    not this repository has it already, except the refs named in `skip`; returns its id
    and what moved."""
    wanted = _normalise(prefix)
    if not wanted:
        raise RunNotFound("no run id given", hint="pass a run id or a prefix of one")
    matches, refs = _remote_matches(repo, remote, wanted)
    exact = [rid for rid in matches if rid.upper() == wanted]
    if exact:
        matches = exact
    if not matches:
        raise RunNotFound(
            f"no run on {remote} matches {prefix!r}",
            hint=f"list what {remote} has with git ls-remote {remote} 'refs/fabro/meta/*'",
        )
    if len(matches) > 1:
        raise _ambiguous(prefix, matches, where=f" on {remote}")
    return matches[0], _fetch_listed(repo, remote, matches[0], refs, skip=skip)


def _remote_matches(repo: GitRepo, remote: str, wanted: str) -> tuple[list[str], dict[str, str]]:
    """Ids of the runs on `remote` starting with the normalised `wanted`, and the
    remote's run refs as listed."""
    refs = _remote.ls_remote(
        repo, remote, [f"{META_PREFIX}*", f"{RUN_BRANCH_PREFIX}*", f"{PARALLEL_PREFIX}*"]
    )
    matches = sorted(
        name[len(META_PREFIX) :]
        for name in refs
        if name.startswith(META_PREFIX)
        and is_run_id(name[len(META_PREFIX) :])
        and name[len(META_PREFIX) :].upper().startswith(wanted)
    )
    return matches, refs


def _fetch_listed(
    repo: GitRepo, remote: str, run_id: str, refs: dict[str, str], *, skip: Collection[str] = ()
) -> _remote.FetchReport:
    """Fetch the run's meta ref, branch and parallel refs, as `refs` lists them, taking
    none of them if one would not fast-forward."""
    specs = [f"{meta_ref(run_id)}:{meta_ref(run_id)}"]
    if run_branch_ref(run_id) in refs:
        specs.append(f"{run_branch_ref(run_id)}:{run_branch_ref(run_id)}")
    parallel = f"{PARALLEL_PREFIX}{run_id}/"
    if any(name.startswith(parallel) for name in refs):
        specs.append(f"{parallel}*:{parallel}*")
    return _remote.fetch(repo, remote, specs, skip=skip, group=run_of_ref)


def run_of_ref(name: str) -> str:
    """The id of the run a ref belongs to (its meta ref, branch or a parallel branch's
    head); any other ref is a group of its own, named by itself."""
    for prefix in (META_PREFIX, RUN_BRANCH_PREFIX, PARALLEL_PREFIX):
        if name.startswith(prefix):
            return name[len(prefix) :].split("/", 1)[0]
    return name


def _ambiguous(prefix: str, candidates: list[str], *, where: str = "") -> AmbiguousRunId:
    shown = "\n".join(f"  {c}" for c in candidates[:20])
    more = f"\n  … and {len(candidates) - 20} more" if len(candidates) > 20 else ""
    return AmbiguousRunId(
        f"{prefix!r} matches {len(candidates)} runs{where}:\n{shown}{more}",
        hint="give more characters of the run id",
    )


def _normalise(prefix: str) -> str:
    text = prefix.strip()
    for lead in (META_PREFIX, RUN_BRANCH_PREFIX, "fabro/meta/", "fabro/run/"):
        if text.startswith(lead):
            text = text[len(lead) :]
            break
    return text.upper().translate(_ALIASES)


# -- ULIDs ---------------------------------------------------------------------------

_lock = threading.Lock()
_last_ms = -1
_last_rand = 0


def new_ulid() -> str:
    """A 26-character ULID; ids made later in this process always sort after earlier ones."""
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            rand = _last_rand + 1
            if rand >= 1 << 80:  # randomness exhausted within one millisecond
                ms, rand = ms + 1, int.from_bytes(os.urandom(10), "big") >> 1
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _last_ms, _last_rand = ms, rand
    value = (ms << 80) | rand
    chars = []
    for _ in range(_ULID_LEN):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))
