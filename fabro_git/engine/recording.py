"""What each kind of scope records after a stage: the one place the three scopes differ.

- The run itself (`MainRecording`) checkpoints: the context and the stage's files go to
  the meta ref as a snapshot, and the worktree's tree to the run branch as a commit
  (the cycle and its crash safety are `Recorder`'s).
- A parallel branch (`BranchRecording`) commits its worktree on its own ref after each
  stage; the fan-in adopts the head it chooses.
- A child workflow (`ChildRecording`) runs inside its parent's stage and makes no
  commit: the tree after each stage is the base of the next stage's files_touched, and
  its progress ref (`child_progress`) lets a resume go on where it stood.

Each is told, before stage.completed, to find the paths the stage touched: the tree it
computes for that is the one it records, so it is computed once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from fabro_git.engine import child_progress, clean_start
from fabro_git.engine.checkpoint import now_iso
from fabro_git.engine.clean_start import CleanStart
from fabro_git.engine.ledger import Ledger, PendingFile, both
from fabro_git.engine.outcome import event_status
from fabro_git.engine.recorder import CheckpointNotWritten, StageCheckpoint
from fabro_git.engine.scope import (
    Decision,
    FinishedStage,
    RunFailed,
    Scope,
    SpendingCapReached,
)
from fabro_git.errors import DiskFull, FabroError
from fabro_git.events.catalogue import CheckpointCompleted, CheckpointFailed, GitCommit
from fabro_git.outputs.artifacts import referenced_names
from fabro_git.store import runs as runrefs
from fabro_git.store import worktree as worktrees

# Stages that run no user code: the worktree cannot have changed.
NO_WORKTREE_CHANGES = frozenset({"start", "exit", "conditional", "human", "wait"})
# Paths listed at most in one stage's files_touched.
FILES_TOUCHED_LIMIT = 1000


class MainRecording:
    """The run's own scope: a checkpoint after every stage."""

    walk_name = "the run"
    workflow_name = "the workflow"

    def __init__(self, ledger: Ledger, *, max_cost: float | None) -> None:
        self.ledger = ledger
        self.max_cost = max_cost

    async def files_touched(self, scope: Scope, stage_id: str) -> list[str]:
        """The stage's tree against the run tip's. The tree is computed here, before
        stage.completed, and the checkpoint reuses it: computing it writes objects
        only, so it is as safe to do early as late. Found already on the guard's look
        after the stage (`tree_after_stage`), it costs no trip of its own."""
        ledger = self.ledger
        found = ledger.stage_files.pop(stage_id, None)
        if found is not None:
            return found
        recorder = ledger.recorder
        before = recorder.run_tip
        if before is None or recorder.worktree is None:
            return []
        ledger.scan_hooks[stage_id] = ledger.hooks_seen()
        tree, files, error = await ledger.call(self._tree_and_files, stage_id, before)
        ledger.stage_trees[stage_id] = tree
        if error is not None:
            raise error
        return files

    def tree_after_stage(self, scope: Scope, stage_id: str) -> Callable[[], None] | None:
        """Blocking work for the repository guard's trip after the stage: its tree and
        files_touched, kept for `files_touched` and the checkpoint. Not when the stage
        moved or deleted the run branch: the guard puts a deleted one back after that
        trip, and the tree is taken once it has."""
        ledger = self.ledger
        recorder = ledger.recorder
        before = recorder.run_tip
        if before is None or recorder.worktree is None:
            return None

        def find() -> None:
            if ledger.repo.read_ref(recorder.run_ref) != before:
                return
            scanned = ledger.hooks_seen()
            tree, files, error = self._tree_and_files(stage_id, before)
            if error is None:
                ledger.scan_hooks[stage_id] = scanned
                ledger.stage_trees[stage_id] = tree
                ledger.stage_files[stage_id] = files

        return find

    def _tree_and_files(
        self, stage_id: str, before: str
    ) -> tuple[str | FabroError | None, list[str], Exception | None]:
        """Blocking: the stage's tree (or the error recording it, for the checkpoint to
        report), the paths it changed since `before`, and what failed reading the tip's
        tree, to raise once the tree is kept. The three steps share one trip."""
        recorder = self.ledger.recorder
        try:
            tree = recorder.stage_tree(stage_id.rpartition("@")[0])
        except FabroError as err:
            return err, [], None  # the checkpoint reports it
        if tree is None:
            return None, [], None
        try:
            old = recorder.tip_tree(before)
        except Exception as err:  # raised by the caller, once the tree is kept
            return tree, [], err
        try:
            return tree, self.ledger.repo.changed_paths(old, tree, limit=FILES_TOUCHED_LIMIT), None
        except FabroError:
            return tree, [], None

    def clean_start(self, scope: Scope) -> CleanStart | None:
        return clean_start.take(self.ledger, scope.worktree)

    async def record(
        self,
        scope: Scope,
        stage: FinishedStage,
        decision: Decision,
        then: Callable[[], object] | None = None,
    ) -> None:
        """Checkpoint the stage, then `then` on the same trip; then the
        `checkpoint_saved` hooks, and the spending cap."""
        # A failed walk names its last stage as next, so a run cut off before the
        # finish resumes there rather than looking finished.
        next_node = stage.node.id if decision.error is not None else decision.next_node
        ledger = self.ledger
        await ledger.call(both(partial(self._checkpoint, scope, stage, next_node), then))
        if ledger.hooks.wants("checkpoint_saved"):
            said = await ledger.hooks.fire(
                "checkpoint_saved",
                node_id=stage.node.id,
                node_label=stage.node.label,
                status=stage.result.status,
                git_commit_sha=ledger.recorder.run_tip,
            )
            if said.action == "block":
                raise RunFailed(said.describe("checkpoint_saved"))
        cost, cap = ledger.checkpoint.total_cost, self.max_cost
        if cap is not None and decision.next_node is not None and cost > cap:
            raise SpendingCapReached(cost, cap)

    def _checkpoint(self, scope: Scope, stage: FinishedStage, next_node: str | None) -> None:
        """The checkpoint itself, on a worker thread: the walk's state into the
        checkpoint, the stage's tree, then the recorder's cycle."""
        ledger, node = self.ledger, stage.node
        cp, recorder = ledger.checkpoint, ledger.recorder
        ledger.resumed_attempts.clear()
        cp.current_node = node.id
        cp.next_node_id = next_node
        cp.context_values = ledger.context_copy.of(scope.context, cp.context_values)
        cp.timestamp = now_iso()
        cp.active_ms = ledger.active_ms()
        files, ledger.pending_files = ledger.pending_files, {}
        _prune_artifacts(ledger, files)
        tree, scanned = self._tree(scope, stage)
        before = recorder.run_tip
        checkpoint = StageCheckpoint(
            node.id, node.label, stage.stage_id, stage.visit, stage.result.status
        )
        try:
            sha = recorder.checkpoint(cp, checkpoint, tree, scope.merge_parents, files)
        except CheckpointNotWritten as err:
            if not err.snapshot_written:
                ledger.pending_files = {**files, **ledger.pending_files}
                _forget_unrecorded_stage(ledger, scope)
            raise RunFailed(str(err)) from None
        finally:
            scope.merge_parents.clear()
        scope.tip = recorder.run_tip
        clean_start.after_checkpoint(
            ledger, node.handler_type, scanned=scanned, tree=tree, sha=sha, parent=before
        )
        ledger.emit(
            CheckpointCompleted(
                status=event_status(stage.result.status),
                git_commit_sha=sha or recorder.run_tip,
                diff=recorder.stage_diff(before, sha, tree),
            ),
            node_id=node.id,
            node_label=node.label,
        )

    def _tree(self, scope: Scope, stage: FinishedStage) -> tuple[str | None, int | None]:
        """The stage's tree, and the hooks seen when its scan began (None: no scan)."""
        ledger, node = self.ledger, stage.node
        recorder = ledger.recorder
        scanned = ledger.scan_hooks.pop(stage.stage_id, None)
        if (
            node.handler_type in NO_WORKTREE_CHANGES
            and not scope.merge_parents
            and recorder.run_tip
        ):
            # These stages run no user code, so the tree cannot have changed: skip the scan.
            return recorder.tip_tree(recorder.run_tip), None
        try:
            tree = self._stage_tree(stage)
        except DiskFull:
            _forget_unrecorded_stage(ledger, scope)
            raise  # the run stops resumable, as for every other full-disk write
        except FabroError as err:
            _forget_unrecorded_stage(ledger, scope)
            raise RunFailed(str(err)) from err
        return tree, ledger.scan_hooks.pop(stage.stage_id, scanned)

    def _stage_tree(self, stage: FinishedStage) -> str | None:
        """The stage's tree: the one `files_touched` computed, else a fresh scan."""
        ledger = self.ledger
        ledger.stage_files.pop(stage.stage_id, None)  # the stage gave its own
        if stage.stage_id not in ledger.stage_trees:
            ledger.scan_hooks[stage.stage_id] = ledger.hooks_seen()
            return ledger.recorder.stage_tree(stage.node.id)
        early = ledger.stage_trees.pop(stage.stage_id)
        if isinstance(early, FabroError):
            raise early
        return early


class _NestedRecording:
    """What the walks nested in the run's share, a parallel branch's and a child
    workflow's: files_touched against the scope's own tree, and no clean start (that is
    the run's own)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def files_touched(self, scope: Scope, stage_id: str) -> list[str]:
        return await _scope_files_touched(self.ledger, scope, stage_id)

    def tree_after_stage(self, scope: Scope, stage_id: str) -> Callable[[], None] | None:
        return None

    def clean_start(self, scope: Scope) -> CleanStart | None:
        self.ledger.clean_mark = None  # used at most once, and only by the run's stages
        return None


class BranchRecording(_NestedRecording):
    """A parallel branch: its worktree committed on its own ref after every stage."""

    walk_name = "its parallel branch"
    workflow_name = "the branch's workflow"

    async def record(
        self,
        scope: Scope,
        stage: FinishedStage,
        decision: Decision,
        then: Callable[[], object] | None = None,
    ) -> None:
        # `then` is for the run's own scope: a branch's stages share their look before.
        await self.ledger.call(self._commit, scope, stage)

    def _commit(self, scope: Scope, stage: FinishedStage) -> None:
        """Commit the stage's worktree on the branch's ref (on a worker thread), with
        the tree its files_touched came from when there is one.

        RunFailed when git cannot, which fails the branch: its work must not go missing
        from the fan-in. A full disk stops the whole run at its last checkpoint instead.
        """
        ledger = self.ledger
        recorder, repo = ledger.recorder, ledger.repo
        early = scope.stage_trees.pop(stage.stage_id, None)
        if scope.ref is None or scope.tip is None:
            return
        node_id = stage.node.id
        qid = scope.qualified(node_id)
        try:
            tree = early or worktrees.snapshot_tree(
                scope.worktree, exclude_globs=recorder.exclude_globs
            )
            message = recorder.redactor.mask_text(
                runrefs.branch_commit_message(
                    ledger.run_id, qid, stage.result.status, scope.prefix.rstrip("/") or node_id
                )
            )
            sha = repo.write_commit(
                tree=tree, parents=[scope.tip, *scope.merge_parents], message=message
            )
            repo.update_ref(scope.ref, sha, old=scope.tip, message=f"fabro: branch stage {qid}")
        except DiskFull:
            raise
        except FabroError as err:
            error = f"could not record the files of {qid}: {err}"
            ledger.emit(CheckpointFailed(error=error), node_id=qid)
            raise RunFailed(error) from err
        scope.merge_parents.clear()
        scope.tip = sha
        ledger.emit(GitCommit(sha=sha), node_id=qid)


class ChildRecording(_NestedRecording):
    """A child workflow: its tree after each stage, and where it stands, for a resume."""

    walk_name = "its child workflow"
    workflow_name = "the child workflow"

    async def record(
        self,
        scope: Scope,
        stage: FinishedStage,
        decision: Decision,
        then: Callable[[], object] | None = None,
    ) -> None:
        # `then` is for the run's own scope: a child's stages share their look before.
        ledger = self.ledger
        if stage.node.handler_type not in NO_WORKTREE_CHANGES:
            await self._advance_tree(scope, stage.stage_id)
        if decision.next_node is not None and scope.progress_ref is not None:
            await ledger.call(child_progress.save, ledger, scope, decision.next_node)

    async def _advance_tree(self, scope: Scope, stage_id: str) -> None:
        """The stage is done: its tree becomes the base of the next stage's
        files_touched (computed now if the stage did not need it itself)."""
        tree = scope.stage_trees.pop(stage_id, None)
        if tree is None and scope.tip is not None:
            with contextlib.suppress(FabroError):
                qid = stage_id.rpartition("@")[0]
                tree = await self.ledger.call(
                    self.ledger.recorder.worktree_tree, scope.worktree, qid
                )
        if tree is not None:
            scope.base_tree = tree


async def _scope_files_touched(ledger: Ledger, scope: Scope, stage_id: str) -> list[str]:
    """files_touched in a parallel branch or a child workflow: the worktree's tree
    against the branch's last commit, or the tree after the child's previous stage."""
    tip = scope.tip
    if tip is None:
        return []
    recorder = ledger.recorder
    qid = stage_id.rpartition("@")[0]
    try:
        tree = await ledger.call(recorder.worktree_tree, scope.worktree, qid)
    except FabroError:
        return []  # a branch's commit meets the same error and fails the branch
    if tree is None:
        return []
    scope.stage_trees[stage_id] = tree
    old = scope.base_tree
    if old is None:
        old = await ledger.call(recorder.tip_tree, tip)
    with contextlib.suppress(FabroError):
        return await ledger.call(
            partial(ledger.repo.changed_paths, old, tree, limit=FILES_TOUCHED_LIMIT)
        )
    return []


def _prune_artifacts(ledger: Ledger, files: dict[str, PendingFile]) -> None:
    """Drop the current-value artifacts the checkpoint no longer points to, here and
    on the meta ref; count the values offloaded over the run."""
    cp, artifacts = ledger.checkpoint, ledger.artifacts
    if not artifacts.names():
        # Nothing offloaded, so nothing to prune: skip the scan of the whole history.
        cp.artifact_count = 0
        return
    keep = referenced_names(cp.context_values, cp.node_outcomes.values())
    for name in artifacts.prune(keep):
        files[runrefs.artifact_path(name)] = files[runrefs.artifact_path(name, text=True)] = None
    cp.artifact_count = sum("/" in name for name in artifacts.names())


def _forget_unrecorded_stage(ledger: Ledger, scope: Scope) -> None:
    """The stage's checkpoint never reached git: put the walk back to the last one
    that did, so the failure snapshot, and the resume after it, hold the stage once
    (as the one to run again), not as done and then again as done."""
    try:
        durable = ledger.recorder.durable_checkpoint()
    except FabroError:
        durable = None  # git cannot even read it back; the failure says why
    if durable is None:
        return
    cp = ledger.checkpoint
    cp.current_node = durable.current_node
    cp.completed_nodes[:] = durable.completed_nodes
    # The scope holds these very objects: change them in place.
    _replace(cp.node_visits, durable.node_visits)
    _replace(cp.node_retries, durable.node_retries)
    _replace(cp.node_outcomes, durable.node_outcomes)
    _replace(cp.loop_failure_signatures, durable.loop_failure_signatures)
    _replace(cp.restart_failure_signatures, durable.restart_failure_signatures)
    current = scope.context.get("current_node")
    for key in list(scope.context):
        scope.context.remove(key)
    scope.context.update(durable.context_values)
    if current is not None:
        scope.context.set("current_node", current)


_V = TypeVar("_V")


def _replace(mine: dict[str, _V], theirs: dict[str, _V]) -> None:
    mine.clear()
    mine.update(theirs)
