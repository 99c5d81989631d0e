"""The run's ledger: where the run stands between checkpoints, and its one door to git.

Every scope and stage of a run shares it: the checkpoint being built, the files waiting
for the next meta snapshot, the stage trees computed early for a checkpoint to reuse,
and the recorder that writes them. Git calls from the trio loop go through `call`, one
at a time on a worker thread, so other branches, the watchdog and Ctrl-C go on
meanwhile. The walk's satellites (branches, child workflows, threads, the scope
recordings) take the ledger rather than the runtime: it is all of the run they may
touch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import trio

from fabro_git.config.locations import make_private_dir
from fabro_git.engine.checkpoint import Checkpoint
from fabro_git.engine.context import CheckpointCopy
from fabro_git.engine.emit import Emit
from fabro_git.errors import FabroError
from fabro_git.outputs.artifacts import ArtifactStore
from fabro_git.store.repo import GitRepo

if TYPE_CHECKING:
    from fabro_git.engine.clean_start import CleanMark
    from fabro_git.engine.lifecycle import LifecycleHooks
    from fabro_git.engine.recorder import Recorder

T = TypeVar("T")

# A file of the next meta snapshot: its bytes, the path of a file in scratch that the
# snapshot streams into git, or None to delete it there.
PendingFile = bytes | Path | None

# The scratch directory where the run's own walk streams its command stages' output;
# `<it>/<n>/` for each other walk that runs one (a parallel branch, a child workflow).
OUTPUT_DIR = "output"


class Ledger:
    def __init__(
        self,
        *,
        run_id: str,
        repo: GitRepo,
        recorder: Recorder,
        checkpoint: Checkpoint,
        hooks: LifecycleHooks,
        emit: Emit,
        scratch: Path,
    ) -> None:
        self.run_id = run_id
        self.repo = repo
        self.recorder = recorder
        self.checkpoint = checkpoint
        self.hooks = hooks
        self.emit = emit
        self.scratch = scratch
        self.pending_files: dict[str, PendingFile] = {}
        self.artifacts = ArtifactStore(scratch)
        self.context_copy = CheckpointCopy()
        # The stage tree computed for `files_touched` before stage.completed, by stage
        # id, for the main run's checkpoint to reuse (or the error computing it, to
        # raise there).
        self.stage_trees: dict[str, str | FabroError | None] = {}
        # The paths a stage changed, found with its tree on the repository guard's trip
        # after it (`MainRecording.tree_after_stage`), by stage id.
        self.stage_files: dict[str, list[str]] = {}
        # What a scan of the worktree for a stage's tree found running, by stage id, and
        # what the last checkpoint's scan left (see `clean_start`).
        self.scan_hooks: dict[str, int | None] = {}
        self.clean_mark: CleanMark | None = None
        # Attempts a crash cut off, by stage_id: a stage run again after resume counts on
        # from them. Only the stages up to the first checkpoint after resume can use them.
        self.resumed_attempts: dict[str, int] = {}
        self.run_started = time.monotonic()
        self.active_base_ms = checkpoint.active_ms
        # Signs of life for the stall watchdog: git calls done, and in flight.
        self.calls_done = 0
        self.calls_busy = 0
        self._lock = trio.Lock()
        # The output directories made so far (`output_dir`), and how many were numbered.
        self._output_dirs: set[Path] = set()
        self._numbered = 0

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run a blocking git call on a worker thread, one at a time: the trio loop (other
        branches, the watchdog, Ctrl-C) goes on meanwhile."""
        async with self._lock:
            self.calls_busy += 1
            try:
                return await trio.to_thread.run_sync(fn, *args)
            finally:
                self.calls_busy -= 1
                self.calls_done += 1

    def output_dir(self, wanted: Path | None) -> Path:
        """A walk's directory for its command stages' output, made on first use: `wanted`
        (the run's own walk: `output/`), else a new `output/<n>/`. A walk runs one stage
        at a time, so its command stages take turns with the same two files, and only
        the first makes them. A file made costs the file system an inode, which a busy
        disk takes a few tenths of a millisecond to hand out: a directory and two files
        a stage were about a tenth of what a short command stage cost."""
        if wanted is None:
            self._numbered += 1
            wanted = self.scratch / OUTPUT_DIR / str(self._numbered)
        if wanted not in self._output_dirs:
            make_private_dir(wanted)
            self._output_dirs.add(wanted)
        return wanted

    def active_ms(self) -> int:
        return self.active_base_ms + int((time.monotonic() - self.run_started) * 1000)

    def hooks_seen(self) -> int | None:
        """Taken just before a scan: how many hooks had started, or None while one runs."""
        hooks = self.hooks
        return None if hooks.busy else hooks.started


def both(first: Callable[[], object], then: Callable[[], object] | None) -> Callable[[], object]:
    """`first`, then `then` when there is one: two pieces of blocking work on one trip to
    a worker thread (each trip is a hand-off each way, which a loaded machine makes
    dear)."""
    if then is None:
        return first

    def in_turn() -> None:
        first()
        then()

    return in_turn
