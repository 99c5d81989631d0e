"""`git fabro logs`: a run's events, from the meta ref's segments plus the live tail.

The segments are the durable log; the tail in the scratch dir adds whatever happened
since the last snapshot. Either may be missing (a clone has no tail; a brand-new run has
one segment), and the two never repeat an event: the tail is read after the last event
a snapshot holds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from fabro_git.cli._runs import tail_path


def durable_events(repo: Any, meta_sha: str) -> bytes:
    """Every event the snapshot holds, in order (sharded and old flat layouts alike)."""
    from fabro_git.store import runs as runrefs

    return runrefs.read_events(repo, meta_sha)


# Events that record how the run was kept, not what it did: `--pretty` shows them only
# with -v. The JSON output always has every event.
BOOKKEEPING = ("metadata.snapshot.", "sandbox.", "git.commit", "git.reset")


class Filter:
    """Which events to print: `--pretty`'s noise rule, `--since` and `-n/--tail`."""

    def __init__(self, *, pretty: bool, verbose: bool, since_ts: str | None) -> None:
        from fabro_git.events.render import SessionDepth

        self.pretty = pretty
        self.verbose = verbose
        self.since_ts = since_ts
        # Learnt from every event read, shown or not, so a sub-agent's lines are indented
        # under its parent's even when the parent's start was filtered out.
        self.sessions = SessionDepth()

    def keep(self, event: dict[str, Any]) -> bool:
        self.sessions.of(event)
        if self.pretty and not self.verbose and str(event.get("event", "")).startswith(BOOKKEEPING):
            return False
        return self.since_ts is None or str(event.get("ts", "")) >= self.since_ts


def _select(data: bytes, keep: Filter) -> list[tuple[bytes, dict[str, Any]]]:
    import json

    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if keep.keep(event):
            out.append((line, event))
    return out


def _emit(selected: list[tuple[bytes, dict[str, Any]]], keep: Filter) -> None:
    from fabro_git.cli import _colour as colour
    from fabro_git.events.render import format_pretty

    out = sys.stdout
    pretty = keep.pretty
    on = pretty and colour.wanted(out)
    for line, event in selected:
        if pretty:
            text = format_pretty(event, keep.sessions.of(event))
            props = event.get("properties") or {}
            style = colour.STATUS_STYLE.get(str(props.get("status", "")))
            if str(event.get("event", "")).endswith((".failed", ".timeout")):
                style = "red"
            out.write(colour.paint(text, style, on) + "\n")
        else:
            out.write(line.decode("utf-8", "replace") + "\n")
    out.flush()


def since_timestamp(value: str | None) -> str | None:
    """`--since 10m` as the RFC 3339 time it names, in the events' own format."""
    if value is None:
        return None
    from datetime import UTC, datetime, timedelta

    from fabro_git.durations import option_seconds

    moment = datetime.now(UTC) - timedelta(seconds=option_seconds(value, "--since"))
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def run(
    run_id: str,
    *,
    pretty: bool,
    follow: bool,
    verbose: bool = False,
    tail: int | None = None,
    since: str | None = None,
) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.lock import is_live
    from fabro_git.errors import StoreError
    from fabro_git.events.bus import last_event_id, tail_after
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    keep = Filter(pretty=pretty, verbose=verbose, since_ts=since_timestamp(since))
    if tail is not None and tail < 0:
        from fabro_git.errors import ConfigError

        raise ConfigError(f"-n/--tail expects a number of events, not {tail}")
    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    meta = repo.read_ref(runrefs.meta_ref(full_id))
    try:
        durable = durable_events(repo, meta) if meta else b""
    except StoreError as exc:
        from fabro_git.engine.session import unreadable_meta

        raise unreadable_meta(full_id, meta or "", exc) from exc
    last = last_event_id(durable)
    live_tail = tail_path(repo, full_id)
    offset = 0
    extra = b""
    if live_tail.exists():
        data = live_tail.read_bytes()
        offset = len(data)
        extra = tail_after(data, last)
    selected = _select(durable, keep) + _select(extra, keep)
    _emit(selected[-tail:] if tail else [] if tail == 0 else selected, keep)
    if not follow:
        return 0
    git_dir = Path(repo.git_dir)
    pending = b""
    idle_checks = 0
    while True:
        if live_tail.exists():
            with live_tail.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            if chunk:
                offset += len(chunk)
                pending += chunk
                complete, _, pending = pending.rpartition(b"\n")
                if complete:
                    _emit(_select(complete + b"\n", keep), keep)
                idle_checks = 0
                continue
        if not is_live(git_dir, full_id):
            idle_checks += 1
            if idle_checks >= 3:  # let the final lines land before stopping
                return 0
        time.sleep(0.2)
