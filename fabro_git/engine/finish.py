"""How a drive ends: the run's outcome recorded, its worktree released, its last snapshot.

Whatever the walk ended with (succeeded, failed, interrupted), the end is written the
same way: the checkpoint says where to go on from, the end's events and hooks are
emitted, the worktree is removed, and the `finalize` snapshot holds it all. A success
that git cannot back (objects the run wrote are gone) is recorded as a failure.
"""

from __future__ import annotations

import time

import msgspec

from fabro_git.engine import outcome, retros
from fabro_git.engine.checkpoint import Checkpoint, TokenTotals
from fabro_git.engine.runner import Runtime, Scope, now_iso
from fabro_git.engine.stored_run import objects_lost_error
from fabro_git.errors import FabroError, StoreError
from fabro_git.events.catalogue import (
    RunCompleted,
    RunFailed,
    RunNotice,
    SandboxCleanupCompleted,
    SandboxCleanupFailed,
    SandboxCleanupStarted,
    TokenUsage,
)
from fabro_git.jsondata import JsonObject
from fabro_git.store import worktree as git_worktree

# How a drive ends besides the walk's own outcomes.
INTERRUPTED = "interrupted"


class RunResult(msgspec.Struct):
    run_id: str
    status: str
    run_branch: str | None
    meta_ref: str
    final_git_commit_sha: str | None
    error: str | None = None
    # What the run's model calls used, as its checkpoint says (the result line shows it).
    tokens: TokenTotals = msgspec.field(default_factory=TokenTotals)
    total_cost: float = 0.0

    def to_json(self) -> dict[str, str | None]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "run_branch": self.run_branch,
            "meta_ref": self.meta_ref,
            "final_git_commit_sha": self.final_git_commit_sha,
        }

    @property
    def exit_code(self) -> int:
        if self.status in (outcome.SUCCEEDED, outcome.PARTIAL):
            return 0
        if self.status == INTERRUPTED:
            return 130
        return 1


async def finish(
    runtime: Runtime,
    scope: Scope,
    status: str,
    error: str | None,
    *,
    announce: bool = True,
    narrative: JsonObject | None = None,
) -> RunResult:
    """Record how the run ended and write its `finalize` snapshot."""
    checkpoint = runtime.cp
    recorder = runtime.recorder
    checkpoint.context_values = msgspec.json.decode(
        msgspec.json.encode(scope.context.snapshot(), enc_hook=str)
    )
    checkpoint.timestamp = now_iso()
    checkpoint.active_ms = runtime.active_ms()
    final_sha = recorder.run_tip
    if status in (outcome.SUCCEEDED, outcome.PARTIAL):
        # No success that git cannot back: what the run wrote must still be there.
        lost = await runtime.store_call(recorder.missing_objects)
        if lost:
            status = outcome.FAILED
            error = objects_lost_error(runtime.run_id, lost)
    if status == INTERRUPTED:
        _record_interrupted(runtime, scope)
    elif status == outcome.FAILED:
        await _record_failed(runtime, scope, error, final_sha)
    else:
        checkpoint.finished_at = checkpoint.timestamp
        if announce:
            await _announce_completed(runtime, status, final_sha)
    checkpoint.status = status
    # A pending commit left by a failed run commit stays: the stage is recorded, and
    # resume makes (or finds) its commit before going on.
    await _release_worktree(runtime, status)
    # The run's last record holds what its last hooks said (their notices).
    await runtime.hooks.wait_all_done()
    await runtime.store_call(_final_snapshot, runtime, status, error, narrative)
    manifest = runtime.manifest
    return RunResult(
        runtime.run_id,
        status,
        manifest.run_branch,
        manifest.meta_ref,
        final_sha,
        error,
        tokens=checkpoint.tokens,
        total_cost=checkpoint.total_cost,
    )


def _record_interrupted(runtime: Runtime, scope: Scope) -> None:
    """The stage in flight did not finish: resume runs it again from a clean worktree."""
    checkpoint = runtime.cp
    current = scope.context.text("current_node")
    if current and checkpoint.next_node_id != current and checkpoint.current_node != current:
        checkpoint.next_node_id = current
    if current:
        _undo_unfinished_visit(checkpoint, current)
    runtime.emit(
        RunNotice(
            level="warn",
            code="interrupted",
            message=f"run interrupted; continue it with `git fabro resume {runtime.run_id}`",
        )
    )


async def _record_failed(
    runtime: Runtime, scope: Scope, error: str | None, final_sha: str | None
) -> None:
    checkpoint = runtime.cp
    current = scope.context.text("current_node")
    if current and checkpoint.pending_commit is None:
        checkpoint.next_node_id = current
    checkpoint.error = error
    runtime.emit(
        RunFailed(
            error=error or "run failed", duration_ms=checkpoint.active_ms, git_commit_sha=final_sha
        )
    )
    # The run is over: these hooks' decisions have nothing left to decide.
    await runtime.hooks.fire(
        "run_failed", status=outcome.FAILED, failure_reason=error or "run failed"
    )


async def _announce_completed(runtime: Runtime, status: str, final_sha: str | None) -> None:
    checkpoint = runtime.cp
    runtime.emit(
        RunCompleted(
            duration_ms=checkpoint.active_ms,
            artifact_count=checkpoint.artifact_count,
            status=outcome.event_status(status),
            total_cost=round(checkpoint.total_cost, 6) if checkpoint.total_cost else None,
            final_git_commit_sha=final_sha,
            usage=_run_usage(checkpoint),
        )
    )
    await runtime.hooks.fire("run_complete", status=status)


async def _release_worktree(runtime: Runtime, status: str) -> None:
    """Every end releases the worktree, failed and interrupted ones too: the run branch
    is then free for the user's own `git switch`, and resume checks it out again from
    git. Ignored files in it (build caches) go with it; only a killed run keeps them."""
    recorder = runtime.recorder
    if recorder.worktree is None:
        return
    await runtime.hooks.fire("sandbox_cleanup", status=status)
    await runtime.hooks.wait_worktree_free()
    emit = runtime.emit
    emit(SandboxCleanupStarted(provider="local"))
    started = time.monotonic()
    try:
        await runtime.store_call(git_worktree.remove_worktree, runtime.repo, recorder.worktree)
        emit(
            SandboxCleanupCompleted(
                provider="local", duration_ms=int((time.monotonic() - started) * 1000)
            )
        )
    except FabroError as exc:
        emit(SandboxCleanupFailed(provider="local", error=str(exc)))


def _final_snapshot(
    runtime: Runtime, status: str, error: str | None, narrative: JsonObject | None
) -> None:
    """The `finalize` snapshot (on a worker thread: it writes to git)."""
    recorder = runtime.recorder
    files = dict(runtime.pending_files)
    runtime.pending_files = {}
    if runtime.options.retro:
        failure = error if status == outcome.FAILED else None
        files.update(retros.retro_files(runtime, status, failure, narrative))
    if recorder.snapshot("finalize", f"finalize {status}", runtime.cp, files) is None:
        # Reported as run.notice; the exit status must not claim an outcome that git
        # does not hold.
        raise StoreError(
            f"run {runtime.run_id} ended {status}, but its final state could not be written to git",
            hint=f"fix the git error shown above, then `git fabro resume {runtime.run_id}`",
        )
    # The packs the run's checkpoints wrote become one: a run leaves one pack behind.
    runtime.repo.consolidate_packs()


def _run_usage(checkpoint: Checkpoint) -> TokenUsage | None:
    """The run's tokens for `run.completed.usage`; None when no model was called."""
    tokens = checkpoint.tokens
    if not tokens.total_tokens:
        return None
    return TokenUsage(
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        total_tokens=tokens.total_tokens,
        reasoning_tokens=tokens.reasoning_tokens or None,
        cache_read_tokens=tokens.cache_read_tokens or None,
        cache_write_tokens=tokens.cache_write_tokens or None,
    )


def _undo_unfinished_visit(checkpoint: Checkpoint, node_id: str) -> None:
    """A stage stopped before its outcome was recorded was no visit: resume runs the same
    visit again (as after a kill -9), and a node with max_visits=1 can still run."""
    entered = checkpoint.node_visits.get(node_id, 0)
    record = checkpoint.node_outcomes.get(node_id)
    if entered and (record.get("visit") if record else None) != entered:
        if entered == 1:
            del checkpoint.node_visits[node_id]
        else:
            checkpoint.node_visits[node_id] = entered - 1
