"""Reading runs back from git for `ps`, `logs` and `inspect`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from fabro_git.config.locations import run_scratch_dir
from fabro_git.errors import FabroError


@dataclass
class RunRow:
    run_id: str
    workflow: str
    status: str
    node: str | None
    started: str
    duration_ms: int | None
    live: bool
    meta_sha: str = ""
    cost: float | None = None
    # Input and output tokens of the run's model calls.
    tokens: tuple[int, int] = (0, 0)

    def to_json(self) -> dict[str, Any]:
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


def effective_status(recorded: str, live: bool, *, superseded: bool = False) -> str:
    """A run whose snapshot says running but whose lock nobody holds was cut short; one
    that `git fabro rewind` replaced is superseded, whatever it recorded."""
    if superseded:
        return "superseded"
    if recorded == "running" and not live:
        return "interrupted"
    return recorded


def _parse_ts(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def read_row(repo: Any, run_id: str, meta_sha: str) -> RunRow:
    from fabro_git.engine.lock import is_live
    from fabro_git.store.runs import TRAILER_SUPERSEDED_BY, MetaSummary

    trailers = repo.commit_info(meta_sha).trailers
    summary = MetaSummary.from_trailers(trailers)
    live = is_live(Path(repo.git_dir), run_id)
    status = effective_status(
        summary.status, live, superseded=bool(trailers.get(TRAILER_SUPERSEDED_BY))
    )
    node = summary.next_node if status in ("running", "interrupted", "failed") else summary.node
    if status == "running" or status == "interrupted":
        node = summary.next_node or summary.node
    duration = summary.active_ms
    if live:
        begin = _parse_ts(summary.started)
        if begin is not None:
            duration = int((datetime.now(begin.tzinfo) - begin).total_seconds() * 1000)
    elif summary.status == "running":
        duration = _killed_run_duration(repo, run_id, summary)
    return RunRow(
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
    )


def run_labels(repo: Any, meta_sha: str) -> dict[str, str]:
    """The labels in a run's manifest ({} when it has none or cannot be read)."""
    import msgspec

    from fabro_git.errors import FabroError
    from fabro_git.store.runs import MANIFEST

    class _Labels(msgspec.Struct):
        labels: dict[str, str] = {}

    try:
        data = repo.read_file(meta_sha, MANIFEST)
        return msgspec.json.decode(data, type=_Labels).labels if data else {}
    except (FabroError, msgspec.DecodeError):
        return {}


def all_rows(repo: Any, *, warn: bool = True) -> list[RunRow]:
    """Every run of the repository, newest first. A meta ref that is not a snapshot is
    skipped (with a warning that says what to do), so it cannot hide the others."""
    import sys

    from fabro_git.errors import StoreError
    from fabro_git.store.runs import META_PREFIX as prefix
    from fabro_git.store.runs import is_run_id

    rows = []
    for name, sha in repo.list_refs(prefix).items():
        if not is_run_id(name[len(prefix) :]):
            continue
        try:
            rows.append(read_row(repo, name[len(prefix) :], sha))
        except StoreError as exc:
            if warn:
                from fabro_git.engine.session import unreadable_meta
                from fabro_git.terminal import printable

                # A fetched ref's name and its error are the remote's words.
                problem = unreadable_meta(name[len(prefix) :], sha, exc)
                print(
                    printable(f"warning: skipped {name}: {problem.message}\nhint: {problem.hint}"),
                    file=sys.stderr,
                )
    rows.sort(key=lambda r: r.run_id, reverse=True)
    return rows


def resolve_run(repo: Any, arg: str) -> str:
    """The run `arg` names: a run id or a unique prefix of one, or else a workflow's
    name, which means that workflow's latest run (said on stderr, so nobody is misled)."""
    import sys

    from fabro_git.errors import RunNotFound
    from fabro_git.store import runs as runrefs

    try:
        return runrefs.resolve_run_id(repo, arg, remote=None)
    except RunNotFound:
        pass
    latest = next((r for r in all_rows(repo, warn=False) if r.workflow == arg), None)
    if latest is not None:
        print(f"{arg} is a workflow: using its latest run, {latest.run_id}", file=sys.stderr)
        return latest.run_id
    return runrefs.resolve_run_id(repo, arg)


@contextlib.contextmanager
def objects_of(run_id: str) -> Iterator[None]:
    """Reading run `run_id`: an object of it that git no longer has is an error that
    names the run and the object and says the ways back, never a crash."""
    from fabro_git.errors import MissingObject

    try:
        yield
    except MissingObject as exc:
        raise missing_in_run(run_id, exc.message) from exc


def missing_in_run(run_id: str, detail: str) -> FabroError:
    from fabro_git.errors import MissingObject

    return MissingObject(
        f"run {run_id}: {detail}; something removed it (a `git gc --prune=now` while the "
        "run was writing can)",
        hint=f"fetch the run from a remote that has it (`git fabro fetch`), or go back to "
        f"an earlier checkpoint that is whole (`git fabro rewind {run_id} --list`, "
        f"then `git fabro resume {run_id}`)",
    )


def _killed_run_duration(repo: Any, run_id: str, summary: Any) -> int | None:
    """A run killed outright recorded no end: it ran on after its last checkpoint until
    its last event, which this repository's live tail holds (if it ran here)."""
    counted = summary.active_ms
    checkpoint = _parse_ts(summary.updated or summary.started)
    last = _last_event_time(tail_path(repo, run_id))
    if counted is None or checkpoint is None or last is None or last.tzinfo != checkpoint.tzinfo:
        return counted
    return counted + max(0, int((last - checkpoint).total_seconds() * 1000))


def _last_event_time(tail: Path) -> datetime | None:
    """The time of the last whole event in a live tail, read from its end."""
    import msgspec

    try:
        with tail.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 65536))
            end = fh.read()
    except OSError:
        return None
    for line in reversed(end.split(b"\n")):
        with contextlib.suppress(msgspec.DecodeError, AttributeError):
            when = _parse_ts(str(msgspec.json.decode(line).get("ts", "")))
            if when is not None:
                return when
    return None


def tail_path(repo: Any, run_id: str) -> Path:
    """The live event tail this repository keeps for the run (it may not exist)."""
    return run_scratch_dir(Path(repo.git_dir), run_id) / "events.jsonl"


def format_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_tokens(count: int) -> str:
    """A token count for a table: 950, 12.3k, 4.1M."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"
