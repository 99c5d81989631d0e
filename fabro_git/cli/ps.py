"""`git fabro ps`: every run in this repository, read from the meta refs' trailers.

Only one object per run is read (the meta ref's tip commit), so listing a thousand runs
stays well under a second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fabro_git.cli import _colour as colour
from fabro_git.cli._runs import all_rows, format_ms


def run(*, json_output: bool) -> int:
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    rows = all_rows(repo)
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
    on = colour.wanted(out)
    for number, line in enumerate(table):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(line)]
        if number == 0:
            cells = [colour.paint(cell, "bold", on) for cell in cells]
        else:
            cells[2] = colour.status(line[2], on, width=widths[2])
        out.write("  ".join(cells).rstrip() + "\n")
    return 0
