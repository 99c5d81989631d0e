"""A run's checkpoint timeline, read back from git, for fork, rewind, dump and diff.

Every stage a run finishes leaves one meta commit whose subject is `checkpoint
NODE@VISIT`, and the run-branch commit made for it names that meta commit in its
`Fabro-Checkpoint` trailer. Walking both first-parent chains once gives each checkpoint
with the state it recorded and the code it committed, without any index of our own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fabro_git.errors import FabroError
from fabro_git.store import runs as runrefs

# The subject the walk gives each stage's meta snapshot (engine/recorder.py `checkpoint`).
_SUBJECT = re.compile(r"checkpoint (\S+)@(\d+)")


@dataclass(frozen=True)
class CheckpointEntry:
    ordinal: int  # 1-based, in the order the stages finished
    node: str
    visit: int
    meta_sha: str  # the meta commit holding the checkpoint as of this stage
    updated: str  # when it was written (the Fabro-Updated trailer)
    run_commit: str | None  # the run-branch commit made for it; None if none was made

    @property
    def label(self) -> str:
        return f"{self.node}@{self.visit}"

    def stage_status(self, repo: Any) -> str:
        """How the stage ended, as its own checkpoint recorded it."""
        from fabro_git.engine.checkpoint import read_checkpoint

        checkpoint = read_checkpoint(repo.read_file, self.meta_sha)
        if checkpoint is None:
            return "?"
        outcome = checkpoint.node_outcomes.get(self.node)
        return str(outcome.get("status", "?")) if outcome else "?"


def timeline(repo: Any, run_id: str, *, base_sha: str | None) -> list[CheckpointEntry]:
    """The run's checkpoints, oldest first. A fork's list starts after the checkpoint it
    was made from: what came before belongs to the run it came from."""
    meta = repo.read_ref(runrefs.meta_ref(run_id))
    if meta is None:
        return []
    found = []
    for info in repo.iter_log(meta):
        match = _SUBJECT.fullmatch(info.subject)
        if match:
            found.append((info, match.group(1), int(match.group(2))))
    found.reverse()
    commits = run_commits_by_checkpoint(repo, run_id, base_sha=base_sha)
    return [
        CheckpointEntry(
            ordinal=index,
            node=node,
            visit=visit,
            meta_sha=info.sha,
            updated=info.trailers.get("Fabro-Updated", ""),
            run_commit=commits.get(info.sha),
        )
        for index, (info, node, visit) in enumerate(found, start=1)
    ]


def run_commits_by_checkpoint(repo: Any, run_id: str, *, base_sha: str | None) -> dict[str, str]:
    """meta commit -> the run-branch commit whose `Fabro-Checkpoint` trailer names it."""
    tip = repo.read_ref(runrefs.run_branch_ref(run_id))
    out: dict[str, str] = {}
    if tip is None:
        return out
    for info in repo.iter_log(tip):
        if info.sha == base_sha:
            break
        checkpoint = info.trailers.get("Fabro-Checkpoint")
        if checkpoint:
            out.setdefault(checkpoint, info.sha)
    return out


def select(
    entries: list[CheckpointEntry], target: str | None, *, run_id: str, command: str
) -> CheckpointEntry:
    """The checkpoint `target` names: NODE (its latest visit), NODE@VISIT, @N (the Nth
    checkpoint), or the latest one when `target` is None."""
    if not entries:
        raise FabroError(
            f"run {run_id} has no checkpoints yet: no stage of it has finished",
            hint=f"list its state with `git fabro inspect {run_id}`",
        )
    if target is None:
        return entries[-1]
    chosen: CheckpointEntry | None = None
    if target.startswith("@") and target[1:].isdigit():
        index = int(target[1:])
        if 1 <= index <= len(entries):
            chosen = entries[index - 1]
    elif "@" in target:
        node, _, visit = target.rpartition("@")
        if visit.isdigit():
            chosen = next(
                (e for e in reversed(entries) if e.node == node and e.visit == int(visit)), None
            )
    else:
        chosen = next((e for e in reversed(entries) if e.node == target), None)
    if chosen is None:
        shown = ", ".join(e.label for e in entries[:12]) + (", …" if len(entries) > 12 else "")
        raise FabroError(
            f"run {run_id} has no checkpoint {target!r}; its checkpoints are {shown}",
            hint=f"list them with `git fabro {command} {run_id} --list`",
        )
    return chosen


def print_timeline(repo: Any, entries: list[CheckpointEntry], run_id: str) -> None:
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
