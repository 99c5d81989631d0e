"""`git fabro ps`: every run in this repository, read from the meta refs' trailers.

Only one object per run is read (the meta ref's tip commit), so listing a thousand runs
stays well under a second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fabro_git.cli._runs import format_ms, read_row


def run(*, json_output: bool) -> int:
    from fabro_git.errors import StoreError
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    prefix = "refs/fabro/meta/"
    refs = repo.list_refs(prefix)
    rows = []
    for name, sha in refs.items():
        try:
            rows.append(read_row(repo, name[len(prefix):], sha))
        except StoreError as exc:
            # One broken ref must not hide every other run.
            from fabro_git.engine.session import unreadable_meta

            problem = unreadable_meta(name[len(prefix) :], sha, exc)
            print(f"warning: skipped {name}: {problem.message}", file=sys.stderr)
            print(f"hint: {problem.hint}", file=sys.stderr)
    rows.sort(key=lambda r: r.run_id, reverse=True)
    out = sys.stdout
    if json_output:
        for row in rows:
            out.write(json.dumps(row.to_json()) + "\n")
        return 0
    if not rows:
        print("no runs in this repository; start one with `git fabro run WORKFLOW`", file=sys.stderr)
        return 0
    header: tuple[str, ...] = ("RUN ID", "WORKFLOW", "STATUS", "NODE", "STARTED", "DURATION")
    table: list[tuple[str, ...]] = [header] + [
        (r.run_id, r.workflow, r.status, r.node or "-", r.started[:19].replace("T", " "), format_ms(r.duration_ms))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() + "\n")
    return 0
