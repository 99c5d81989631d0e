"""One run read from git, pinned to one snapshot of its meta ref.

`open_run` reads the manifest and checkpoint once; every other read (stages, their
files, transcripts, diffs, artifacts, the timeline, events) goes through the object it
returns, so a command or a web page sees one consistent state of the run. Everything
here blocks on git: a trio task calls it through `trio.to_thread.run_sync`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cached_property
from typing import BinaryIO

from fabro_git.engine.checkpoint import Checkpoint, Manifest
from fabro_git.engine.reader import events as _events
from fabro_git.engine.reader import stages as _stages
from fabro_git.engine.reader import timeline as _timeline
from fabro_git.engine.reader.runs import RunSummary, effective_status, is_live, run_summary
from fabro_git.errors import FabroError
from fabro_git.store import runs as layout
from fabro_git.store.blobs import STREAM_AT
from fabro_git.store.repo import GitRepo

# How much of one stage's diff is read for a page.
DIFF_LIMIT = 200_000


class RunReader:
    """A run as its meta ref's tip stood when it was opened."""

    def __init__(
        self,
        repo: GitRepo,
        run_id: str,
        manifest: Manifest,
        checkpoint: Checkpoint,
        meta_sha: str,
        source: str,
    ) -> None:
        self.repo = repo
        self.run_id = run_id
        self.manifest = manifest
        self.checkpoint = checkpoint
        self.meta_sha = meta_sha
        self.source = source  # the workflow's DOT source as it ran

    # -- the run as a whole ------------------------------------------------------------

    @property
    def live(self) -> bool:
        """Whether a process here runs it right now (asked afresh each time)."""
        return is_live(self.repo, self.run_id)

    @property
    def status(self) -> str:
        return effective_status(
            self.checkpoint.status, self.live, superseded=bool(self.manifest.superseded_by)
        )

    def summary(self) -> RunSummary:
        """The run as `ps` lists it, labels included."""
        row = run_summary(self.repo, self.run_id, self.meta_sha)
        row.labels = dict(self.manifest.labels)
        return row

    @property
    def run_tip(self) -> str | None:
        """The run branch's tip here (None for a run in place or not fetched)."""
        return self.repo.read_ref(layout.run_branch_ref(self.run_id))

    def read_file(self, path: str) -> bytes | None:
        """A file of the metadata tree, by its path there (`store.runs` names them)."""
        return self.repo.read_file(self.meta_sha, path)

    # -- stages ------------------------------------------------------------------------

    @cached_property
    def _stage_list(self) -> list[_stages.Stage]:
        return _stages.list_stages(self.repo, self.meta_sha)

    def stages(self) -> list[_stages.Stage]:
        """Every stage recorded, child workflows' included, in the order they started."""
        return list(self._stage_list)

    def stage(self, wanted: str) -> _stages.Stage:
        """The stage NODE (its latest visit) or NODE@VISIT; a ConfigError naming the
        run's stages when there is none."""
        return _stages.select_stage(self._stage_list, wanted)

    def stage_file(
        self, stage: _stages.Stage, name: str, *, limit: int = _stages.READ_LIMIT
    ) -> bytes | None:
        """One of `STAGE_FILES` of the stage (head and tail when over `limit`)."""
        return _stages.read_stage_file(self.repo, self.meta_sha, stage, name, limit=limit)

    def transcript(self, stage: _stages.Stage) -> list[_stages.TranscriptEntry]:
        """What the stage's agent did: replies, tool calls with arguments and results."""
        return _stages.transcript(self.iter_events(), stage)

    def stage_commits(
        self, target: str, *, note: Callable[[str], object] | None = None
    ) -> tuple[str, str]:
        """(the previous checkpoint commit, the stage's own) for NODE or NODE@VISIT."""
        tip = self.run_tip
        if tip is None:
            raise FabroError(
                f"run {self.run_id} has no branch {layout.run_branch_ref(self.run_id)} here",
                hint="fetch it with `git fabro fetch`",
            )
        return _timeline.stage_range(
            self.repo, self.run_id, self.manifest.base_sha, tip, target, note=note
        )

    def stage_diff(self, stage: _stages.Stage, *, max_bytes: int = DIFF_LIMIT) -> str | None:
        """The unified diff of the files the stage touched, against the checkpoint before
        it; None when it committed nothing (or the run ran in place)."""
        from fabro_git.store import worktree

        if self.manifest.in_place or self.run_tip is None:
            return None
        try:
            old, new = self.stage_commits(stage.label)
        except FabroError:
            return None
        old_tree = self.repo.commit_info(old).tree
        new_tree = self.repo.commit_info(new).tree
        if old_tree == new_tree:
            return None
        diff = self.repo.small_tree_diff(old_tree, new_tree, max_bytes=max_bytes)
        if diff is None:
            diff = worktree.diff_text(self.repo.root, old, new, max_bytes=max_bytes)
        return diff or None

    # -- artifacts, timeline, events ---------------------------------------------------

    def artifacts(self) -> list[_stages.Artifact]:
        """Every captured asset and offloaded value, in the order the stages ran."""
        return _stages.list_artifacts(self.repo, self.meta_sha, self._stage_list)

    def read_artifact(self, item: _stages.Artifact) -> bytes | None:
        """An artifact's bytes, whole (`copy_artifact` streams one of any size)."""
        return self.repo.read_file(self.meta_sha, item.meta_path)

    def copy_artifact(self, item: _stages.Artifact, out: BinaryIO) -> bool:
        """Write an artifact's bytes to the open file `out`: a big one streamed from git,
        however big it is; False when the run has no such file."""
        if item.size > STREAM_AT:
            return self.repo.copy_file(self.meta_sha, item.meta_path, out)
        data = self.read_artifact(item)
        if data is not None:
            out.write(data)
        return data is not None

    def timeline(self) -> list[_timeline.CheckpointEntry]:
        """The run's checkpoints, oldest first."""
        return _timeline.timeline(self.repo, self.run_id, base_sha=self.manifest.base_sha)

    def events(self, *, after: str | None = None) -> list[_events.RunEvent]:
        """Every event recorded so far (git's, then the live tail's), or those after the
        event `after`. Read afresh: a live run's events go beyond its snapshot."""
        return _events.read_events(self.repo, self.run_id, after=after)

    def iter_events(self, *, after: str | None = None) -> Iterator[_events.RunEvent]:
        """`events`, a segment in memory at a time; a run whose events cannot be read
        is refused before this returns."""
        return _events.iter_events(self.repo, self.run_id, after=after)

    def recorded_blocks(self) -> Iterator[bytes]:
        """The run's event log as `logs` reads it (git's segments as of this snapshot,
        then the live tail's lines beyond them), a segment in memory at a time; a run
        whose segments cannot be read is refused before this returns."""
        blocks, _ = _events.recorded_stream_since(self.repo, self.run_id, self.meta_sha)
        return blocks

    def event_cursor(self, *, after: str | None = None) -> _events.EventCursor:
        """A cursor to follow the run's events (`follow`, or `follow_async` from trio)."""
        return _events.EventCursor(self.repo, self.run_id, after=after)


def open_run(repo: GitRepo, run_id: str) -> RunReader:
    """The run `run_id` (a full id: `resolve_run` finds it from what a user typed) at
    its meta ref's tip. A ref that is not a readable snapshot is a FabroError that
    says what to do."""
    from fabro_git.engine.session import load_run

    manifest, checkpoint, meta, source = load_run(repo, run_id)
    return RunReader(repo, run_id, manifest, checkpoint, meta, source)
