"""A run's checkpoint timeline as `fork`, `rewind` and `dump` print and pick from it;
the reading is the run reader's (`fabro_git.engine.reader.timeline`)."""

from __future__ import annotations

from fabro_git.engine.reader import CheckpointEntry, run_commits_by_checkpoint, timeline
from fabro_git.engine.reader import select_checkpoint as select
from fabro_git.store.repo import GitRepo

__all__ = ["CheckpointEntry", "print_timeline", "run_commits_by_checkpoint", "select", "timeline"]


def print_timeline(repo: GitRepo, entries: list[CheckpointEntry], run_id: str) -> None:
    import sys

    if not entries:
        print(f"run {run_id} has no checkpoints yet", file=sys.stderr)
        return
    rows: list[tuple[str, ...]] = [("#", "CHECKPOINT", "STATUS", "TIME", "COMMIT")]
    for entry in entries:
        rows.append(
            (
                f"@{entry.ordinal}",
                entry.label,
                entry.stage_status(repo),
                entry.updated or "-",
                entry.run_commit[:12] if entry.run_commit else "-",
            )
        )
    from fabro_git.terminal import printable

    # Node names and statuses come from the run: each cell through the one sanitiser.
    rows = [tuple(printable(cell, one_line=True) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            + "\n"
        )
