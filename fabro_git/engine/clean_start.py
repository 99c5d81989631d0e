"""files_touched of an agent CLI stage from the checkpoint's own scan, when it can be.

A CLI stage tells what its agent touched by diffing the worktree before and after the
agent runs (`fabro_git.store.touched`): two `git status` scans. Yet each checkpoint of
the main run scans the worktree anyway, to record it as the stage's tree, and right
after that scan the worktree IS the run tip's tree: every path the checkpoint records
is clean. So when nothing can have run in the worktree since the last checkpoint
scanned it, the "before" is known without a scan (the tip's tree), and the "after" is
the next checkpoint's scan: the stage tree, diffed against the tip's tree, as command
stages get theirs. The stage then pays a tree diff on top of its checkpoint.

The checkpoint leaves a `CleanMark` after it scanned; the stage takes it (once) and
uses it only when it is sure nothing came in between, else takes today's snapshots:
- the mark is of the checkpoint just before this stage (the stage index is the next
  one), of the main run (a branch or a child workflow has no checkpoint of its own),
  and the run tip has not moved since;
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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabro_git.store import statcheck

if TYPE_CHECKING:
    from fabro_git.engine.runner import Runtime, Scope


@dataclass(frozen=True)
class CleanMark:
    """What a checkpoint's scan left: the worktree is `tree`, committed as `tip`."""

    stage_index: int
    tip: str
    tree: str
    index_stamp: tuple[int, int]
    hooks_started: int


@dataclass(frozen=True)
class CleanStart:
    """The worktree before a stage, known without a scan: the tree of the run tip."""

    tip: str
    tree: str


def hooks_seen(runtime: Runtime) -> int | None:
    """Taken just before a scan: how many hooks had started, or None while one runs."""
    hooks = runtime.hooks
    return None if hooks.busy else hooks.started


def after_checkpoint(
    runtime: Runtime, *, scanned: int | None, tree: str | None, sha: str | None
) -> None:
    """Leave a mark after a main-run checkpoint whose tree came from a scan of the
    worktree begun when `scanned` hooks had started (None: no scan, or a hook ran)."""
    runtime.clean_mark = None
    recorder = runtime.recorder
    if (
        scanned is None
        or tree is None
        or sha is None
        or recorder is None
        or recorder.worktree is None
        or recorder.exclude_globs
        or recorder.run_tip != sha
    ):
        return
    stamp = statcheck.index_stamp(recorder.worktree)
    if stamp is None:
        return
    runtime.clean_mark = CleanMark(runtime.cp.stage_index, sha, tree, stamp, scanned)


def take(runtime: Runtime, scope: Scope) -> CleanStart | None:
    """The worktree before the current stage, if the last checkpoint's scan still says
    it; None when the stage must take a snapshot. The mark is used at most once."""
    mark, runtime.clean_mark = runtime.clean_mark, None
    recorder = runtime.recorder
    if (
        mark is None
        or scope.kind != "main"
        or recorder is None
        or recorder.worktree is None
        or recorder.exclude_globs
        or scope.worktree != recorder.worktree
        or runtime.cp.stage_index != mark.stage_index + 1
        or recorder.run_tip != mark.tip
        or hooks_seen(runtime) != mark.hooks_started
        or statcheck.index_stamp(recorder.worktree) != mark.index_stamp
    ):
        return None
    return CleanStart(mark.tip, mark.tree)


async def touched_since(
    runtime: Runtime, scope: Scope, stage_id: str, start: CleanStart, *, limit: int
) -> list[str]:
    """The stage's files_touched from its own stage tree (which its checkpoint then
    reuses) against the tree it started from, plus the files of commits it made."""
    recorder = runtime.recorder
    assert recorder is not None
    found = set(await runtime._files_touched(scope, stage_id))
    tip = recorder.run_tip
    if tip is not None and tip != start.tip:
        from fabro_git.errors import FabroError

        try:
            new = await runtime.store_call(runtime._tip_tree, tip)
            found.update(
                await runtime.store_call(
                    lambda: runtime.repo.changed_paths(start.tree, new, limit=limit)
                )
            )
        except FabroError:
            pass  # the commits' files are in the tree diff too, unless put back since
    return sorted(found)[:limit]
