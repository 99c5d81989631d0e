"""files_touched of an agent CLI stage from the checkpoint's own scan, when it can be.

A CLI stage tells what its agent touched by diffing the worktree before and after the
agent runs (`fabro_git.store.touched`): two `git status` scans. Yet each checkpoint of
the main run scans the worktree anyway, to record it as the stage's tree, and right
after that scan the worktree IS the run tip's tree: every path the checkpoint records
is clean. So when nothing can have run in the worktree since the last checkpoint
scanned it, the "before" is known without a scan (the tip's tree), and the "after" is
the next checkpoint's scan: the stage tree, diffed against the tip's tree, as command
stages get theirs. The stage then pays a tree diff on top of its checkpoint.

The checkpoint leaves a `CleanMark` after it scanned; so does a new run whose worktree
was just checked out from its tip (when it has no setup commands), and a start or
conditional node, which runs nothing, passes the mark before it on. The stage takes
the mark (once) and uses it only when it is sure nothing came in between, else takes
today's snapshots:
- the mark is of the checkpoint just before this stage (the stage index is the next
  one; a human gate or a `wait` node passes none on), of the main run (a branch or a
  child workflow has no checkpoint of its own), and the run tip has not moved since;
- no lifecycle hook has started since the scan, and none was running during it (a
  hook may run any command, in the worktree or elsewhere);
- the worktree's index file is the one the checkpoint left (a git command in between
  rewrites it);
- the run has no `exclude_globs`: paths the checkpoint leaves out may be dirty, and
  only a scan can say which;
- it is the stage's first attempt (the mark is taken once; a retry scans, so that only
  the last attempt's changes count, as before).
Ignored files are in neither the tree nor `git status`, so they never count either way.
Commits the agent made count as before: the checkpoint adopts them, and the tree diff
from the old tip covers them; the paths of the commits themselves are added too, as
the two-snapshot diff did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from fabro_git.errors import FabroError
from fabro_git.store import statcheck

if TYPE_CHECKING:
    from pathlib import Path

    from fabro_git.engine.ledger import Ledger


class CleanMark(msgspec.Struct, frozen=True):
    """What a checkpoint's scan left: the worktree is `tree`, committed as `tip`."""

    stage_index: int
    tip: str
    tree: str
    index_stamp: tuple[int, int]
    hooks_started: int


class CleanStart(msgspec.Struct, frozen=True):
    """The worktree before a stage, known without a scan: the tree of the run tip."""

    tip: str
    tree: str


async def after_fresh_checkout(ledger: Ledger) -> None:
    """Leave a mark when the run's worktree was just checked out from its tip and
    nothing has run in it yet: the first stages need no snapshot either, and the first
    checkpoint stages the tree in process (`Recorder.checked_out`)."""
    ledger.clean_mark = None
    recorder = ledger.recorder
    if recorder.worktree is None or recorder.run_tip is None:
        return
    seen = ledger.hooks_seen()
    tree = await ledger.call(recorder.tip_tree, recorder.run_tip)
    recorder.checked_out(tree)
    _leave(ledger, seen, tree, recorder.run_tip)


def after_checkpoint(
    ledger: Ledger,
    handler_type: str,
    *,
    scanned: int | None,
    tree: str | None,
    sha: str | None,
    parent: str | None,
) -> None:
    """Leave a mark after a main-run checkpoint whose tree came from a scan of the
    worktree begun when `scanned` hooks had started (None: no scan, or a hook ran),
    and committed as `sha` on `parent`.

    A start or conditional node runs nothing and its checkpoint scans nothing: the
    mark before it still holds after it, for the same tree, if nothing else ran."""
    previous, ledger.clean_mark = ledger.clean_mark, None
    if (
        scanned is None
        and handler_type in RUN_NOTHING
        and previous is not None
        and tree == previous.tree
        and _holds(ledger, previous, tip=parent)
    ):
        scanned = previous.hooks_started
    if scanned is None or tree is None or sha is None:
        return
    _leave(ledger, scanned, tree, sha)


# Nodes that run no code and wait for nobody (a human or a `wait` node may see the
# worktree edited in the meantime).
RUN_NOTHING = frozenset({"start", "conditional"})


def _leave(ledger: Ledger, scanned: int | None, tree: str, tip: str) -> None:
    recorder = ledger.recorder
    if (
        scanned is None
        or recorder.worktree is None
        or recorder.exclude_globs
        or recorder.run_tip != tip
    ):
        return
    stamp = statcheck.index_stamp(recorder.worktree)
    if stamp is None:
        return
    ledger.clean_mark = CleanMark(ledger.checkpoint.stage_index, tip, tree, stamp, scanned)


def _holds(ledger: Ledger, mark: CleanMark, *, tip: str | None) -> bool:
    """Whether `mark` still says what the run's worktree is, for the current stage,
    which started on `tip`."""
    recorder = ledger.recorder
    return (
        recorder.worktree is not None
        and not recorder.exclude_globs
        and ledger.checkpoint.stage_index == mark.stage_index + 1
        and tip == mark.tip
        and ledger.hooks_seen() == mark.hooks_started
        and statcheck.index_stamp(recorder.worktree) == mark.index_stamp
    )


def take(ledger: Ledger, worktree: Path) -> CleanStart | None:
    """The worktree before the current stage of the main run (in `worktree`), if the
    last checkpoint's scan still says it; None when the stage must take a snapshot.
    The mark is used at most once."""
    mark, ledger.clean_mark = ledger.clean_mark, None
    recorder = ledger.recorder
    if (
        mark is None
        or worktree != recorder.worktree
        or not _holds(ledger, mark, tip=recorder.run_tip)
    ):
        return None
    return CleanStart(mark.tip, mark.tree)


async def touched_since(
    ledger: Ledger, touched: list[str], start: CleanStart, *, limit: int
) -> list[str]:
    """The stage's files_touched: `touched`, from its own stage tree (which its
    checkpoint then reuses) against the tree it started from, plus the files of
    commits it made."""
    recorder = ledger.recorder
    found = set(touched)
    tip = recorder.run_tip
    if tip is not None and tip != start.tip:
        try:
            new = await ledger.call(recorder.tip_tree, tip)
            found.update(
                await ledger.call(lambda: ledger.repo.changed_paths(start.tree, new, limit=limit))
            )
        except FabroError:
            pass  # the commits' files are in the tree diff too, unless put back since
    return sorted(found)[:limit]
