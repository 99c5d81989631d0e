"""One attempt at a stage: the handler run under the stage's cancel scope, and what
the engine takes from around it.

The node's `timeout` bounds every handler type alike; a manager loop's halt cuts the
stage off the same way. A handler's exception is the stage's failure (with its
traceback kept as a file of the stage), never the run's, except a full disk, which
stops the run at its last checkpoint. In the user's own checkout, a stage that changed
`.fabro/` fails, and the change is put back. A stage that runs commands has the test
reports and `[run.artifacts]` files it wrote captured as assets.
"""

from __future__ import annotations

import os
import traceback
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from fabro_git import redact
from fabro_git.config.protected import ConfigSnapshot, config_change_refused
from fabro_git.engine.ledger import PendingFile
from fabro_git.engine.outcome import CANCELED, DETERMINISTIC, TRANSIENT, Outcome
from fabro_git.engine.scope import Scope
from fabro_git.engine.stage import Handler, StageRequest
from fabro_git.engine.walk_rules import stage_timeout
from fabro_git.errors import FabroError, disk_full_in
from fabro_git.events.catalogue import AssetCaptured

if TYPE_CHECKING:
    from fabro_git.config.run_config import RunSection
    from fabro_git.outputs.assets import Capture, Snapshot

# Stages that run commands in the worktree: their test assets are captured.
RUNS_COMMANDS = frozenset({"command", "tool", "agent", "codergen"})


async def call_handler(
    handler: Handler, request: StageRequest, scope: Scope, *, in_place: bool
) -> Outcome:
    """Run the handler inside the stage's one cancel scope: the node's `timeout`
    bounds every handler type alike. A timeout is a transient failure, unless the
    handler said what it ends with (`StageRequest.on_timeout`)."""
    node = request.node
    timeout = stage_timeout(node)
    # In the user's checkout, `.fabro/` is theirs: a stage that changed it fails, and
    # the change is put back, even when the stage was cut off.
    config, refused = None, None
    if in_place:
        # No `.fabro/` (one lstat): nothing to read, so no trip to a worker thread.
        if os.path.lexists(request.worktree / ".fabro"):
            config = await trio.to_thread.run_sync(ConfigSnapshot, request.worktree)
        else:
            config = ConfigSnapshot(request.worktree)
    try:
        with trio.CancelScope() as halt:
            scope.halt_scope = halt
            try:
                with trio.move_on_after(timeout if timeout else float("inf")) as deadline:
                    request.timed_by(deadline)
                    result = await _guarded(handler, request)
            finally:
                scope.halt_scope = None
                request.timed_by(None)
        if halt.cancelled_caught:
            result = Outcome.failure(f"stopped by its manager: {scope.halted}", CANCELED)
        elif deadline.cancelled_caught:
            assert timeout is not None
            if request.timeout_outcome is not None:
                result = await request.timeout_outcome(timeout)
            else:
                result = Outcome.failure(
                    f"{node.handler_type} stage {node.id} timed out after {timeout:g}s",
                    TRANSIENT,
                )
    finally:
        # Nothing the stage started outlives it, daemons that left its groups too;
        # then nothing is left to change `.fabro/` behind the check.
        request.sweep()
        if config is not None and config.may_have_changed:
            with trio.CancelScope(shield=True):
                refused = await trio.to_thread.run_sync(
                    partial(config_change_refused, config, what=f"stage {node.id}")
                )
    if refused is not None:
        return Outcome.failure(refused, DETERMINISTIC)
    return result


async def _guarded(handler: Handler, request: StageRequest) -> Outcome:
    try:
        return await handler(request)
    except trio.Cancelled:
        raise
    except Exception as exc:
        if disk_full_in(exc) is not None:
            raise  # not the stage's failure: the run stops at its last checkpoint
        if isinstance(exc, FabroError):
            return Outcome.failure(str(exc), DETERMINISTIC)
        # A handler bug must not take the run's state with it.
        request.files["handler-error.txt"] = "".join(traceback.format_exception(exc)).encode()
        return Outcome.failure(
            f"handler error in {request.node.id}: {type(exc).__name__}: {exc}", DETERMINISTIC
        )


def asset_include(run: RunSection) -> tuple[str, ...]:
    """`[run.artifacts] include`: the run's own globs of files to capture as assets,
    beside the known test-report paths."""
    return tuple(run.artifacts.include) if run.artifacts is not None else ()


class AssetWatch:
    """The asset files of one attempt at a stage that runs commands: those there before
    it (`baseline`) and those it wrote (`capture`), both blocking work done on the
    worker-thread trips the repository guard makes before and after the stage
    (`RepoGuard.around`), then kept (`keep`)."""

    def __init__(self, request: StageRequest, include: tuple[str, ...]) -> None:
        self.request = request
        self.include = include
        self._before: Snapshot | None = None
        self._found: Capture | None = None

    @classmethod
    def of(cls, request: StageRequest, include: tuple[str, ...]) -> AssetWatch | None:
        """The watch for `request`'s attempt; None for a stage that runs no commands."""
        if request.node.handler_type not in RUNS_COMMANDS:
            return None
        return cls(request, include)

    @staticmethod
    def snapshot(worktree: Path, include: tuple[str, ...]) -> Snapshot:
        """Blocking: the asset files in `worktree` now."""
        from fabro_git.outputs import assets

        return assets.baseline(worktree, include)

    def baseline(self) -> None:
        """Blocking: the asset files before the attempt."""
        self._before = self.snapshot(self.request.worktree, self.include)

    def use(self, taken: object) -> bool:
        """Take `taken`, a `snapshot` of this worktree made just before the attempt, as
        its baseline; False (and nothing taken) when it is none."""
        if not isinstance(taken, dict):
            return False
        self._before = taken
        return True

    def capture(self) -> None:
        """Blocking: what the attempt wrote among the asset files since `baseline`."""
        from fabro_git.outputs import assets

        if self._before is not None:
            self._found = assets.capture(self.request.worktree, self._before, self.include)

    async def keep(self, *, scratch: Path, pending_files: dict[str, PendingFile]) -> None:
        """Copy what `capture` found to scratch and, at the next checkpoint, the meta
        ref; one `asset.captured` per file."""
        from fabro_git.outputs import assets
        from fabro_git.store.runs import asset_dir, node_slug

        found, request = self._found, self.request
        if found is None or found.empty:
            return
        slug = node_slug(request.node_dir)
        directory = asset_dir(slug, request.attempt)
        kept = await trio.to_thread.run_sync(assets.keep, scratch, directory, found)
        pending_files.update(kept)
        for item in found.files:
            request.emit(
                AssetCaptured(
                    attempt=request.attempt,
                    node_slug=slug,
                    path=item.path,
                    mime=item.mime,
                    content_md5=item.md5,
                    content_sha256=item.sha256,
                    bytes=len(item.data),
                )
            )


def event_response(result: Outcome) -> str | None:
    """The response `stage.completed` carries: a large one is there already as its
    offloaded context value (`response.<node>`), and the event names it by its
    `file://` pointer rather than holding the text once more."""
    from fabro_git.outputs.artifacts import OFFLOAD_THRESHOLD, pointer_name

    response = result.response
    if response is None:
        return response
    for key, value in result.context_updates.items():
        if key.startswith("response.") and pointer_name(value) is not None:
            return str(value)
    if len(response) <= OFFLOAD_THRESHOLD:
        return response
    left = len(response) - OFFLOAD_THRESHOLD
    return (
        f"{redact.clip(response, OFFLOAD_THRESHOLD)}\n[... {left} more characters, in response.md]"
    )
