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
    names = repo.list_dir(meta_sha, "events") or []
    parts = []
    for name in sorted(names):
        data = repo.read_file(meta_sha, f"events/{name}")
        if data:
            parts.append(data if data.endswith(b"\n") else data + b"\n")
    return b"".join(parts)


def _emit(data: bytes, pretty: bool) -> None:
    import json

    from fabro_git.events.render import format_pretty

    out = sys.stdout
    for line in data.splitlines():
        if not line.strip():
            continue
        if pretty:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            out.write(format_pretty(event) + "\n")
        else:
            out.write(line.decode("utf-8", "replace") + "\n")
    out.flush()


def run(run_id: str, *, pretty: bool, follow: bool) -> int:
    from fabro_git.engine.lock import is_live
    from fabro_git.errors import StoreError
    from fabro_git.events.bus import last_event_id, tail_after
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = runrefs.resolve_run_id(repo, run_id)
    meta = repo.read_ref(runrefs.meta_ref(full_id))
    try:
        durable = durable_events(repo, meta) if meta else b""
    except StoreError as exc:
        from fabro_git.engine.session import unreadable_meta

        raise unreadable_meta(full_id, meta or "", exc) from exc
    _emit(durable, pretty)
    last = last_event_id(durable)
    tail = tail_path(repo, full_id)
    offset = 0
    if tail.exists():
        data = tail.read_bytes()
        offset = len(data)
        extra = tail_after(data, last)
        _emit(extra, pretty)
        last = last_event_id(extra) or last
    if not follow:
        return 0
    git_dir = Path(repo.git_dir)
    pending = b""
    idle_checks = 0
    while True:
        if tail.exists():
            with tail.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            if chunk:
                offset += len(chunk)
                pending += chunk
                complete, _, pending = pending.rpartition(b"\n")
                if complete:
                    _emit(complete + b"\n", pretty)
                idle_checks = 0
                continue
        if not is_live(git_dir, full_id):
            idle_checks += 1
            if idle_checks >= 3:  # let the final lines land before stopping
                return 0
        time.sleep(0.2)
