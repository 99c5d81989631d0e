"""A run's checkpoint timeline and its stages' commits, read back from git.

Every stage a run finishes leaves one meta commit whose subject is `checkpoint
NODE@VISIT`, and the run-branch commit made for it names that meta commit in its
`Fabro-Checkpoint` trailer. Walking both first-parent chains once gives each checkpoint
with the state it recorded and the code it committed, without any index of our own.
A stage's change is measured from the previous checkpoint commit, not from its commit's
parent: an agent that commits by itself leaves its own commits under the checkpoint
commit, and they are part of its stage.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from fabro_git.errors import FabroError
from fabro_git.store import runs as layout
from fabro_git.store.repo import GitRepo


class CheckpointEntry(msgspec.Struct, frozen=True):
    ordinal: int  # 1-based, in the order the stages finished
    node: str
    visit: int
    meta_sha: str  # the meta commit holding the checkpoint as of this stage
    updated: str  # when it was written (the Fabro-Updated trailer)
    run_commit: str | None  # the run-branch commit made for it; None if none was made

    @property
    def label(self) -> str:
        return f"{self.node}@{self.visit}"

    def stage_status(self, repo: GitRepo) -> str:
        """How the stage ended, as its own checkpoint recorded it."""
        from fabro_git.engine.checkpoint import read_checkpoint

        checkpoint = read_checkpoint(repo.read_file, self.meta_sha)
        if checkpoint is None:
            return "?"
        outcome = checkpoint.node_outcomes.get(self.node)
        return str(outcome.get("status", "?")) if outcome else "?"


def timeline(repo: GitRepo, run_id: str, *, base_sha: str | None) -> list[CheckpointEntry]:
    """The run's checkpoints, oldest first. A fork's list starts after the checkpoint it
    was made from: what came before belongs to the run it came from."""
    meta = repo.read_ref(layout.meta_ref(run_id))
    if meta is None:
        return []
    found = []
    for info in repo.iter_log(meta):
        subject = layout.parse_snapshot_subject(info.subject)
        if subject.kind == "checkpoint" and subject.node_id and " " not in subject.node_id:
            found.append((info, subject.node_id, subject.visit or 0))
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


def run_commits_by_checkpoint(
    repo: GitRepo, run_id: str, *, base_sha: str | None
) -> dict[str, str]:
    """meta commit -> the run-branch commit whose `Fabro-Checkpoint` trailer names it."""
    tip = repo.read_ref(layout.run_branch_ref(run_id))
    out: dict[str, str] = {}
    if tip is None:
        return out
    for info in repo.iter_log(tip):
        if info.sha == base_sha:
            break
        checkpoint = info.trailers.get(layout.TRAILER_CHECKPOINT)
        if checkpoint:
            out.setdefault(checkpoint, info.sha)
    return out


def select_checkpoint(
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


def stage_range(
    repo: GitRepo,
    run_id: str,
    base: str,
    tip: str,
    target: str,
    *,
    note: Callable[[str], object] | None = None,
) -> tuple[str, str]:
    """(previous checkpoint commit, this stage's checkpoint commit) for NODE or NODE@VISIT.

    NODE alone means its latest visit (said to `note` when it ran more than once).
    Visits are read from the meta history, which a fork lacks for the stages it
    inherited; for those the Nth commit of NODE is visit N.
    """
    chain = []  # checkpoint commits from the base up, each with its node
    for info in repo.iter_log(tip):
        if info.sha == base:
            break
        if info.trailers.get(layout.TRAILER_CHECKPOINT):
            chain.append((info.sha, _node_of(info.subject)))
    chain.reverse()
    node, _, visit_text = target.rpartition("@") if "@" in target else (target, "", "")
    commits = [sha for sha, name in chain if name == node]
    if not commits:
        stages = ", ".join(dict.fromkeys(name for _, name in chain if name)) or "none yet"
        raise FabroError(
            f"run {run_id} has no commit for a stage {node!r}; its stages are: {stages}",
            hint=f"list its checkpoints with `git fabro fork {run_id} --list`",
        )
    if visit_text:
        if not visit_text.isdigit():
            raise FabroError(f"{target!r} is not NODE or NODE@VISIT", hint="for example: plan@2")
        visit = int(visit_text)
        by_visit = {
            e.visit: e.run_commit for e in timeline(repo, run_id, base_sha=base) if e.node == node
        }
        commit = by_visit.get(visit) or (commits[visit - 1] if 0 < visit <= len(commits) else None)
        if commit is None:
            raise FabroError(
                f"stage {node} of run {run_id} has no visit {visit}",
                hint=f"it ran {len(commits)} time(s): name one as {node}@1 to {node}@{len(commits)}",
            )
    else:
        commit = commits[-1]
        if len(commits) > 1 and note is not None:
            from fabro_git.terminal import printable

            name = printable(node, one_line=True)
            note(f"{name} ran {len(commits)} times; showing its last visit (name one as {name}@N)")
    index = [sha for sha, _ in chain].index(commit)
    return (chain[index - 1][0] if index else base), commit


def _node_of(subject: str) -> str | None:
    """The node of a checkpoint commit's subject `fabro(<run>): NODE (status)`, as
    `store.runs.run_commit_message` writes it."""
    _, sep, rest = subject.partition("): ")
    if not sep:
        return None
    return rest.rsplit(" (", 1)[0]
