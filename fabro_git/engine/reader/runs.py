"""The runs of a repository, as `ps` lists them, read from the meta refs' trailers.

A meta ref's tip commit says almost everything about its run (status, workflow, node,
times, cost, tokens) in its trailers; labels are in the manifest, one blob more, read
only when asked. Listing a thousand runs stays well under a second.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import msgspec

from fabro_git.engine.reader.events import tail_path
from fabro_git.errors import BlobTooLarge, FabroError, MissingObject, RunNotFound, StoreError
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as layout
from fabro_git.store.repo import GitRepo


class RunSummary(msgspec.Struct):
    """One run as `ps` shows it."""

    run_id: str
    workflow: str
    status: str  # as it stands: a `running` run nobody holds reads `interrupted`
    node: str | None  # the node it is at (running, interrupted, failed) or ended on
    started: str
    duration_ms: int | None
    live: bool
    meta_sha: str = ""
    cost: float | None = None
    # Input and output tokens of the run's model calls.
    tokens: tuple[int, int] = (0, 0)
    # Read from the manifest only when asked (`list_runs(labels=True)`).
    labels: dict[str, str] = {}
    updated: str = ""  # when its last snapshot was written

    def to_json(self) -> JsonObject:
        """The record `ps --json` prints (without its labels)."""
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "status": self.status,
            "current_node": self.node,
            "started": self.started,
            "duration_ms": self.duration_ms,
            "total_cost": self.cost,
            "usage": {
                "input_tokens": self.tokens[0],
                "output_tokens": self.tokens[1],
                "total_tokens": sum(self.tokens),
            },
        }


# Every status a run shows as (`effective_status`), in the order of its life.
RUN_STATUSES = (
    "running",
    "succeeded",
    "partially_succeeded",
    "failed",
    "interrupted",
    "superseded",
)


def effective_status(recorded: str, live: bool, *, superseded: bool = False) -> str:
    """A run whose snapshot says running but whose lock nobody holds was cut short; one
    that `git fabro rewind` replaced is superseded, whatever it recorded."""
    if superseded:
        return "superseded"
    if recorded == "running" and not live:
        return "interrupted"
    return recorded


def is_live(repo: GitRepo, run_id: str) -> bool:
    """Whether a process here is running the run right now."""
    from fabro_git.engine.lock import is_live as locked

    return locked(Path(repo.git_dir), run_id)


def parse_ts(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def run_summary(repo: GitRepo, run_id: str, meta_sha: str | None = None) -> RunSummary:
    """The run as its meta commit's trailers (at `meta_sha`, else its ref's tip) say."""
    if meta_sha is None:
        meta_sha = repo.read_ref(layout.meta_ref(run_id))
        if meta_sha is None:
            raise RunNotFound(f"run {run_id} has no metadata ref {layout.meta_ref(run_id)}")
    trailers = repo.commit_info(meta_sha).trailers
    summary = layout.MetaSummary.from_trailers(trailers)
    live = is_live(repo, run_id)
    status = effective_status(
        summary.status, live, superseded=bool(trailers.get(layout.TRAILER_SUPERSEDED_BY))
    )
    node = summary.next_node if status in ("running", "interrupted", "failed") else summary.node
    if status == "running" or status == "interrupted":
        node = summary.next_node or summary.node
    duration = summary.active_ms
    if live:
        begin = parse_ts(summary.started)
        if begin is not None:
            duration = int((datetime.now(begin.tzinfo) - begin).total_seconds() * 1000)
    elif summary.status == "running":
        duration = _killed_run_duration(repo, run_id, summary)
    return RunSummary(
        run_id,
        summary.workflow,
        status,
        node,
        summary.started,
        duration,
        live,
        meta_sha,
        summary.cost,
        summary.tokens,
        updated=summary.updated,
    )


class _Labels(msgspec.Struct):
    labels: dict[str, str] = {}


def run_labels(repo: GitRepo, meta_sha: str) -> dict[str, str]:
    """The labels in a run's manifest ({} when it has none or cannot be read)."""
    try:
        data = repo.read_file(meta_sha, layout.MANIFEST)
        return msgspec.json.decode(data, type=_Labels).labels if data else {}
    except (FabroError, msgspec.DecodeError):
        return {}


def list_runs(
    repo: GitRepo,
    *,
    labels: bool = False,
    on_skip: Callable[[str, FabroError], object] | None = None,
) -> list[RunSummary]:
    """Every run of the repository, newest first, with its labels when `labels`. A meta
    ref that is not a snapshot is skipped (told to `on_skip` with the ref's name and
    what is wrong), so it cannot hide the others."""
    prefix = layout.META_PREFIX
    rows = []
    for name, sha in repo.list_refs(prefix).items():
        run_id = name[len(prefix) :]
        if not layout.is_run_id(run_id):
            continue
        try:
            row = run_summary(repo, run_id, sha)
        except StoreError as exc:
            if on_skip is not None:
                from fabro_git.engine.session import unreadable_meta

                on_skip(name, unreadable_meta(run_id, sha, exc))
            continue
        if labels:
            row.labels = run_labels(repo, sha)
        rows.append(row)
    rows.sort(key=lambda r: r.run_id, reverse=True)
    return rows


def resolve_run(repo: GitRepo, arg: str, *, note: Callable[[str], object] | None = None) -> str:
    """The run `arg` names: a run id or a unique prefix of one, or else a workflow's
    name, which means that workflow's latest run (said to `note`, so nobody is misled).
    A run only a remote has is fetched."""
    try:
        return layout.resolve_run_id(repo, arg, remote=None)
    except RunNotFound:
        pass
    latest = next((r for r in list_runs(repo) if r.workflow == arg), None)
    if latest is not None:
        if note is not None:
            note(f"{arg} is a workflow: using its latest run, {latest.run_id}")
        return latest.run_id
    return layout.resolve_run_id(repo, arg)


@contextlib.contextmanager
def objects_of(run_id: str) -> Iterator[None]:
    """Reading run `run_id`: an object of it that git no longer has, or a file too big to
    read (`BlobTooLarge`), is an error that names the run and the object and says the
    ways back, never a crash."""
    try:
        yield
    except MissingObject as exc:
        raise missing_in_run(run_id, exc.message) from exc
    except BlobTooLarge as exc:
        raise exc.for_run(run_id) from None


def missing_in_run(run_id: str, detail: str) -> FabroError:
    return MissingObject(
        f"run {run_id}: {detail}; something removed it (a `git gc --prune=now` while the "
        "run was writing can)",
        hint=f"fetch the run from a remote that has it (`git fabro fetch`), or go back to "
        f"an earlier checkpoint that is whole (`git fabro rewind {run_id} --list`, "
        f"then `git fabro resume {run_id}`)",
    )


def _killed_run_duration(repo: GitRepo, run_id: str, summary: layout.MetaSummary) -> int | None:
    """A run killed outright recorded no end: it ran on after its last checkpoint until
    its last event, which this repository's live tail holds (if it ran here)."""
    counted = summary.active_ms
    checkpoint = parse_ts(summary.updated or summary.started)
    last = _last_event_time(tail_path(repo, run_id))
    if counted is None or checkpoint is None or last is None or last.tzinfo != checkpoint.tzinfo:
        return counted
    return counted + max(0, int((last - checkpoint).total_seconds() * 1000))


def _last_event_time(tail: Path) -> datetime | None:
    """The time of the last whole event in a live tail, read from its end."""
    try:
        with tail.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 65536))
            end = fh.read()
    except OSError:
        return None
    for line in reversed(end.split(b"\n")):
        with contextlib.suppress(msgspec.DecodeError, AttributeError):
            when = parse_ts(str(msgspec.json.decode(line).get("ts", "")))
            if when is not None:
                return when
    return None
