"""The checkpoint cycle: how a finished stage becomes durable.

Order matters for crash safety. Objects are always written before refs move, and refs
move by compare-and-swap:

1. The worktree is turned into a tree object (nothing visible changes yet).
2. A meta snapshot is committed: the refreshed `checkpoint.json` (which names that tree
   and its parent as `pending_commit`), a new event segment and the stage's files.
   The meta ref moves. From here on the stage counts as done.
3. The run-branch commit is made from the pending tree, with a `Fabro-Checkpoint`
   trailer naming the snapshot, and the run branch moves.

A kill between 2 and 3 leaves a checkpoint whose pending commit was not made yet;
`reconcile()` makes it on resume, byte-for-byte the commit the cycle would have made.
Git failures are reported as `run.notice` and `checkpoint.failed`, never swallowed.

Secrets are masked here, where run data becomes git objects: every file of a snapshot,
the checkpoint and the commit messages go through the run's redactor. Event segments
come from the bus, which masked them when they were emitted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypedDict

import msgspec

from fabro_git import redact
from fabro_git.engine.checkpoint import (
    Checkpoint,
    DeltaWriter,
    PendingCommit,
    encode,
    read_checkpoint,
)
from fabro_git.engine.emit import Emit
from fabro_git.errors import DiskFull, FabroError, RefRaceError, StoreError
from fabro_git.events.bus import last_event_id
from fabro_git.events.catalogue import (
    CheckpointFailed,
    GitCommit,
    MetadataSnapshotCompleted,
    MetadataSnapshotFailed,
    MetadataSnapshotStarted,
    RunNotice,
    SnapshotPhase,
)
from fabro_git.store import runs as runrefs
from fabro_git.store import statcheck
from fabro_git.store.repo import GitRepo
from fabro_git.store.runs import MetaSummary, run_commit_message, segment_path
from fabro_git.store.snapshot import MetaSnapshotter, StoredBlob
from fabro_git.store.staging import PendingIndex, Stager, Stamp
from fabro_git.store.worktree import attach_head, diff_text, head_branch, snapshot_tree

# The layout lives in `store.runs`; these names stay importable from here.
__all__ = ["MetaSummary", "Recorder", "run_commit_message", "segment_path"]


class CheckpointNotWritten(Exception):
    """A stage's checkpoint did not reach git (the error was reported). `snapshot_written`
    says whether the meta snapshot did, and only the run-branch commit is missing."""

    def __init__(self, message: str, *, snapshot_written: bool) -> None:
        super().__init__(message)
        self.snapshot_written = snapshot_written


class StageCheckpoint(msgspec.Struct, frozen=True):
    """The stage a checkpoint records, as its snapshot and commit name it."""

    node_id: str
    node_label: str
    stage_id: str
    visit: int
    status: str


class Recorder:
    def __init__(
        self,
        repo: GitRepo,
        run_id: str,
        *,
        workflow_slug: str,
        emit: Emit,
        take_segment: Callable[[], bytes],
        worktree: Path | None,
        exclude_globs: list[str],
        meta_tip: str | None,
        run_tip: str | None,
        requeue: Callable[[bytes], object] | None = None,
    ) -> None:
        self.repo = repo
        # Puts back a segment that no snapshot took, ahead of anything new.
        self.requeue = requeue
        self.run_id = run_id
        self.workflow_slug = workflow_slug
        self.emit = emit
        self.take_segment = take_segment
        self.worktree = worktree
        self.exclude_globs = exclude_globs
        self.meta_ref = runrefs.meta_ref(run_id)
        self.run_ref = runrefs.run_branch_ref(run_id)
        self.meta = MetaSnapshotter(repo, self.meta_ref)
        self.meta_tip = meta_tip
        self.run_tip = run_tip
        self.degraded = False
        # Why the last snapshot git refused was refused (reported as an event too).
        self.last_error: FabroError | None = None
        self.redactor = redact.for_process()
        # The tree git last wrote from the worktree, and the index file's stamp then.
        self._last_scan: tuple[str, Stamp | PendingIndex | None] | None = None
        self._staging: Stager | None = None
        # Stage checkpoints go to git as deltas on the last complete one.
        self._deltas = DeltaWriter()
        # Big files already scanned for the next snapshot, by id: the file, and what
        # the snapshot writes for it (its masked bytes, or the blob they are already).
        self._premasked: dict[int, tuple[bytes, bytes | StoredBlob]] = {}
        # The tree of each commit looked up or made, by commit.
        self._trees: dict[str, str] = {}

    def tip_tree(self, commit: str) -> str:
        """The tree of `commit` (asked of git once)."""
        tree = self._trees.get(commit)
        if tree is None:
            tree = self._trees[commit] = self.repo.commit_info(commit).tree
        return tree

    def worktree_tree(self, worktree: Path, qid: str) -> str | None:
        """A scope's worktree as it is now, as a tree: the run's own worktree as its
        checkpoint takes it (adopting commits a stage made there), another (a parallel
        branch's) by a scan of its own index."""
        if self.worktree is not None and Path(worktree) == Path(self.worktree):
            return self.stage_tree(qid)
        return snapshot_tree(worktree, exclude_globs=self.exclude_globs)

    # -- the checkpoint of a stage ------------------------------------------------------

    def checkpoint(
        self,
        cp: Checkpoint,
        stage: StageCheckpoint,
        tree: str | None,
        merge_parents: list[str],
        files: Mapping[str, bytes | Path | None],
    ) -> str | None:
        """Steps 2 and 3 for a stage of the main run whose worktree is `tree` (None: the
        run has no branch of its own): the meta snapshot, then the run-branch commit
        (with `merge_parents` as further parents). Returns the commit made, if any;
        CheckpointNotWritten when git refused either (reported already). The caller
        announces `checkpoint.completed` (with `stage_diff`): live replication hears
        the walk's events."""
        self.plan_commit(cp, stage.node_id, stage.status, tree, merge_parents)
        subject = f"checkpoint {stage.node_id}@{stage.visit}"
        made: list[str] = []

        def run_commit(meta_sha: str) -> None:
            # The run branch's commit names the snapshot: made as soon as its id is
            # known, it goes into the snapshot's pack.
            if cp.pending_commit is not None:
                made.append(self._run_commit(cp.pending_commit, meta_sha))

        if self.snapshot("checkpoint", subject, cp, files, stage=stage, then=run_commit) is None:
            cp.pending_commit = None
            # Going on would pile stages onto a record git does not hold (and end with
            # a success nothing backs); stop, so resume redoes this stage from the last
            # checkpoint git does hold.
            raise CheckpointNotWritten(
                f"the checkpoint after {stage.node_id} could not be written to git "
                "(see the error above)",
                snapshot_written=False,
            )
        sha = self.commit_pending(cp, node_label=stage.node_label, made=made[0] if made else None)
        if sha is None and cp.pending_commit is not None:
            raise CheckpointNotWritten(
                f"the run-branch commit for {stage.node_id} could not be made (see the error above)",
                snapshot_written=True,
            )
        if sha is not None and tree is not None:
            self._trees[sha] = tree
        return sha

    def stage_diff(self, before: str | None, sha: str | None, tree: str | None) -> str | None:
        """The stage's change as a patch of 20 kB at most, for `checkpoint.completed`."""
        if sha is None or before is None or tree is None or tree == self.tip_tree(before):
            return None
        diff = None
        with contextlib.suppress(FabroError):
            diff = self.repo.small_tree_diff(self.tip_tree(before), tree, max_bytes=20_000)
            if diff is None and self.worktree is not None:
                diff = diff_text(self.worktree, before, sha, max_bytes=20_000)
        return diff or None

    # -- snapshots -----------------------------------------------------------------

    def snapshot(
        self,
        phase: SnapshotPhase,
        subject: str,
        cp: Checkpoint,
        files: Mapping[str, bytes | Path | None],
        *,
        stage: StageCheckpoint | None = None,
        trailers: Mapping[str, str] | None = None,
        then: Callable[[str], object] | None = None,
    ) -> str | None:
        """Write one meta snapshot (of `stage`'s checkpoint, if given). Returns its sha,
        or None when git refused (reported).

        A file given as a Path (a command's whole output) is streamed into git, masked
        on the way, rather than read into memory. `trailers` go after the summary's;
        `then` is `MetaSnapshotter.write`'s."""
        stamp = _stamp(stage)
        self.emit(MetadataSnapshotStarted(phase=phase, branch=self.meta_ref), **stamp)
        started = time.monotonic()
        segment = self.take_segment()
        all_files, whole = self._snapshot_files(phase, cp, files, segment)
        summary = MetaSummary(
            status=cp.status,
            workflow=self.workflow_slug,
            node=cp.current_node,
            next_node=cp.next_node_id,
            started=cp.started_at,
            updated=cp.timestamp or cp.started_at,
            active_ms=cp.active_ms,
            cost=cp.total_cost or None,
            tokens=(cp.tokens.input_tokens, cp.tokens.output_tokens),
        )
        extra = "".join(f"{key}: {value}\n" for key, value in (trailers or {}).items())
        message = self.redactor.mask_text(f"{subject}\n\n{summary.trailers(self.run_id)}{extra}")
        try:
            # A long reply is its response.md and its offloaded value's two entries:
            # one file, masked and stored once.
            stored: dict[Path, StoredBlob] = {}
            for path, data in files.items():
                if isinstance(data, Path):
                    if data not in stored:
                        stored[data] = StoredBlob(
                            *self.repo.store_file(data, self.redactor.stream_bytes())
                        )
                    all_files[path] = stored[data]
            result = self.meta.write(all_files, message, expected_tip=self.meta_tip, then=then)
        except DiskFull:
            raise  # nothing more can be recorded: the run stops at its last checkpoint
        except FabroError as err:
            if segment:
                # Not durable: keep the lines for the next snapshot.
                cp.event_segments -= 1
                self._requeue(segment)
            self._snapshot_failed(phase, started, err, stamp)
            return None
        self.meta_tip = result.commit_sha
        self._deltas.written(cp, result.commit_sha, whole=whole)
        self.emit(
            MetadataSnapshotCompleted(
                phase=phase,
                branch=self.meta_ref,
                duration_ms=_ms(started),
                entry_count=result.entry_count,
                bytes=result.bytes,
                commit_sha=result.commit_sha,
            ),
            **stamp,
        )
        return result.commit_sha

    def _snapshot_files(
        self,
        phase: SnapshotPhase,
        cp: Checkpoint,
        files: Mapping[str, bytes | Path | None],
        segment: bytes,
    ) -> tuple[dict[str, bytes | StoredBlob | None], bool]:
        """The snapshot's in-memory files, masked: the stage's, the event segment, and
        `checkpoint.json` (a delta for a stage checkpoint, where one will do); and
        whether that checkpoint is whole."""
        mask = self.redactor.mask_bytes
        premasked, self._premasked = self._premasked, {}
        all_files: dict[str, bytes | StoredBlob | None] = _masked_once(mask, files, premasked)
        if segment:
            cp.event_segments += 1
            all_files[segment_path(cp.event_segments)] = segment
            cp.last_event_id = last_event_id(segment) or cp.last_event_id
        delta = self._deltas.delta(cp) if phase == "checkpoint" else None
        all_files[runrefs.CHECKPOINT] = mask(encode(cp if delta is None else delta))
        return all_files, delta is None

    def _snapshot_failed(
        self, phase: SnapshotPhase, started: float, err: FabroError, stamp: _Stamp
    ) -> None:
        self.degraded = True
        self.last_error = err
        self.emit(
            MetadataSnapshotFailed(
                phase=phase,
                branch=self.meta_ref,
                duration_ms=_ms(started),
                failure_kind="write",
                error=str(err),
            ),
            **stamp,
        )
        self.emit(
            RunNotice(
                level="error",
                code="checkpoint_metadata_write_failed",
                message=f"could not write the metadata snapshot to {self.meta_ref}: {err}",
            )
        )

    def premask(self, values: Iterable[tuple[object, bytes]], files: Iterable[bytes]) -> None:
        """Scan a stage's big files for secrets and write their masked bytes as blobs,
        ahead of the snapshot that will name them (while the artifact store writes its
        copy): that snapshot takes the results. The file objects are kept with them, so
        an id is never taken for another file's. Writing objects early is safe, as for
        the stage's tree: nothing names them until the snapshot.

        `values` are offloaded values with their JSON form. A reply is both a value and
        the stage's `response.md`: when the JSON form of a text value is found clean,
        so is a file holding that text's UTF-8 bytes (`Redactor.clean_with_text`), which
        is then compared, not scanned."""
        from concurrent.futures import Future, ThreadPoolExecutor

        redactor = self.redactor
        clean_texts: list[str] = []
        masked: dict[int, tuple[bytes, bytes]] = {}
        stored: dict[int, Future[str]] = {}  # by the masked bytes' id

        def new(data: bytes) -> bool:
            key = id(data)
            return (
                len(data) >= _SHARED_MASK_MIN and key not in self._premasked and key not in masked
            )

        with ThreadPoolExecutor(max_workers=2) as pool:

            def take(data: bytes, done: bytes) -> None:
                # Stored as soon as it is masked, while the next file is looked at.
                masked[id(data)] = (data, done)
                if id(done) not in stored:
                    stored[id(done)] = pool.submit(self.repo.store_blob, done)

            for value, data in values:
                if not new(data):
                    continue
                if isinstance(value, str) and redactor.clean_with_text(data):
                    take(data, data)
                    clean_texts.append(value)
                else:
                    take(data, redactor.mask_bytes(data))
            for data in files:
                if new(data):
                    clean = any(_is_utf8_of(data, text) for text in clean_texts)
                    take(data, data if clean else redactor.mask_bytes(data))
        for key, (data, done) in masked.items():
            try:
                sha = stored[id(done)].result()
            except (FabroError, OSError):
                # The snapshot writes it, and reports what goes wrong.
                self._premasked[key] = (data, done)
                continue
            self._premasked[key] = (data, StoredBlob(sha, len(done)))

    def pending_events(self) -> bytes:
        """The event lines no snapshot holds yet; they stay queued for the next one."""
        segment = self.take_segment()
        if segment:
            self._requeue(segment)
        return segment

    def durable_checkpoint(self) -> Checkpoint | None:
        """The checkpoint of the last snapshot git holds."""
        if self.meta_tip is None:
            return None
        return read_checkpoint(self.repo.read_file, self.meta_tip)

    def _requeue(self, segment: bytes) -> None:
        if self.requeue is not None:
            self.requeue(segment)

    # -- the stage cycle --------------------------------------------------------------

    def stage_tree(self, node_id: str, changed_paths: list[str] | None = None) -> str | None:
        """Step 1: the worktree as a tree object; None when the run has no worktree.

        Commits the stage made itself on the run branch are adopted first. StoreError,
        with git's message, when the tree cannot be recorded: the stage's work must
        not go missing behind a success. A small change is staged in process
        (`Stager`), except in a run with `exclude_globs`, which only git's scan applies.
        """
        if self.worktree is None or self.run_tip is None:
            return None
        try:
            self._adopt_stage_commits(node_id)
            if self._last_scan is not None and not self.exclude_globs:
                staged = self._stager().stage(*self._last_scan)
                if staged is not None:
                    self._last_scan = staged
                    return staged[0]
            tree = snapshot_tree(
                self.worktree, exclude_globs=self.exclude_globs, changed_paths=changed_paths
            )
        except DiskFull:
            raise
        except FabroError as err:
            message = f"could not record the files of {node_id}: {err}"
            self._commit_failed(node_id, message)
            raise StoreError(message) from err
        self._last_scan = (tree, statcheck.index_stamp(self.worktree))
        self.repo.note_written(tree)  # git wrote it: checked present at the run's end
        return tree

    def checked_out(self, tree: str) -> None:
        """The run's worktree was just checked out from the run tip, whose tree is
        `tree`, and nothing has run in it: its index is git's record of that tree, so
        the first stage's tree is staged in process from it like every later one's
        (`Stager`), instead of by `git add -A` and `git write-tree`. Not with
        `exclude_globs`, which only git's scan applies."""
        if self.worktree is None or self.exclude_globs or self._last_scan is not None:
            return
        stamp = statcheck.index_stamp(self.worktree)
        if stamp is not None:
            self._last_scan = (tree, stamp)

    def missing_objects(self) -> list[str]:
        """The objects this run wrote, and its two tips, that git no longer has, once
        those still held in memory are written again (see `GitRepo.missing_written`)."""
        return self.repo.missing_written([self.run_tip or "", self.meta_tip or ""])

    def _stager(self) -> Stager:
        assert self.worktree is not None
        if self._staging is None or self._staging.worktree != self.worktree:
            self._staging = Stager(self.repo, self.worktree)
        return self._staging

    def _adopt_stage_commits(self, node_id: str) -> None:
        """Agent CLIs commit in their worktree, which moves the run branch: commits that
        build on the expected tip are kept, and the checkpoint commit goes on top. Any
        other move (rewound, rewritten, replaced, HEAD taken elsewhere) is refused."""
        assert self.worktree is not None and self.run_tip is not None
        branch = runrefs.run_branch_name(self.run_id)
        head = head_branch(self.worktree)
        if head != self.run_ref:
            where = (
                f"on branch {head.removeprefix('refs/heads/')}" if head else "on a detached HEAD"
            )
            raise StoreError(
                f"{node_id} left the run's worktree {where}; a stage may commit on {branch} "
                "but must not switch branches",
                hint=f"`git fabro resume {self.run_id}` puts the worktree back on {branch} "
                "and runs the stage again; other branches are left as they are",
            )
        tip = self.repo.read_ref(self.run_ref)
        if tip == self.run_tip:
            return
        if tip is None or not self.repo.is_ancestor(self.run_tip, tip):
            raise self._moved(f"during {node_id}", expected=self.run_tip, found=tip)
        self.emit(
            RunNotice(
                level="info",
                code="stage_commits_adopted",
                message=f"{node_id} committed on {branch} itself "
                f"({self.run_tip[:12]}..{tip[:12]}); "
                "its commits are kept and the checkpoint commit goes on top",
            )
        )
        self.run_tip = tip

    def _moved(self, when: str, *, expected: str, found: str | None) -> RefRaceError:
        now = f"to {found[:12]}" if found else "away (it was deleted)"
        return RefRaceError(
            f"{self.run_ref} was moved {when} from {expected[:12]} {now}, which does not "
            "build on it; a stage may add commits on top of the run branch, but not rewind, "
            "rewrite or replace it",
            hint=f"put it back with `git update-ref {self.run_ref} {expected}`, "
            f"then `git fabro resume {self.run_id}`",
        )

    def _run_commit(self, pending: PendingCommit, meta_sha: str) -> str:
        """Write the run-branch commit of `pending`, which names snapshot `meta_sha`."""
        message = self.redactor.mask_text(
            run_commit_message(
                self.run_id, pending.node_id, pending.status, pending.completed, meta_sha
            )
        )
        parents = [pending.parent, *pending.extra_parents]
        return self.repo.write_commit(tree=pending.tree, parents=parents, message=message)

    def commit_pending(
        self, cp: Checkpoint, *, node_label: str | None = None, made: str | None = None
    ) -> str | None:
        """Step 3: make the run-branch commit named by `cp.pending_commit` (`made`: it
        was written already, with the snapshot) and move the branch to it."""
        pending = cp.pending_commit
        if pending is None or self.meta_tip is None:
            return None
        try:
            sha = made if made is not None else self._run_commit(pending, self.meta_tip)
            self.repo.update_ref(
                self.run_ref,
                sha,
                old=pending.parent,
                message=f"fabro: checkpoint {pending.node_id} ({pending.status})",
            )
        except DiskFull:
            raise
        except FabroError as err:
            self._commit_failed(pending.node_id, f"could not commit to {self.run_ref}: {err}")
            return None
        self.run_tip = sha
        cp.git_commit_sha = sha
        cp.pending_commit = None
        self.emit(GitCommit(sha=sha), node_id=pending.node_id, node_label=node_label)
        return sha

    def _commit_failed(self, node_id: str, message: str) -> None:
        self.degraded = True
        self.emit(CheckpointFailed(error=message), node_id=node_id)
        self.emit(RunNotice(level="error", code="checkpoint_git_failed", message=message))

    def plan_commit(
        self,
        cp: Checkpoint,
        node_id: str,
        status: str,
        tree: str | None,
        extra_parents: list[str] | None = None,
    ) -> None:
        if tree is None or self.run_tip is None:
            cp.pending_commit = None
            return
        cp.pending_commit = PendingCommit(
            tree=tree,
            parent=self.run_tip,
            node_id=node_id,
            status=status,
            completed=len(cp.completed_nodes),
            extra_parents=list(extra_parents or []),
        )

    # -- resume ----------------------------------------------------------------------

    def reconcile(self, cp: Checkpoint, *, base_sha: str) -> None:
        """Bring the run branch in line with the last checkpoint git holds, on resume.

        A crash between the meta snapshot and the run commit leaves a pending commit:
        it is made now, or found if it was made. Commits a stage made itself before it
        was cut off are set aside (the branch goes back to its checkpoint, and the
        stage runs again from there); they stay in the branch's reflog. Any other move
        of the branch is refused.
        """
        if self.run_tip is None:
            return
        self.repo.commit_info(self.run_tip)  # MissingObject when gc took it
        if self.worktree is not None and (self.worktree / ".git").exists():
            with contextlib.suppress(FabroError):
                if head_branch(self.worktree) != self.run_ref:
                    attach_head(self.worktree, self.run_ref)
        pending = cp.pending_commit
        expected = cp.git_commit_sha or base_sha
        if pending is not None:
            expected = pending.parent
            made = self._find_pending_commit(pending)
            if made is not None:
                cp.git_commit_sha = expected = made
                cp.pending_commit = pending = None
        if self.run_tip != expected and self._merged_fixes(expected):
            # `resume --rebase` merged a fix on top of the checkpoint: part of the run.
            cp.git_commit_sha = expected = self.run_tip
        if self.run_tip != expected:
            if not self.repo.is_ancestor(expected, self.run_tip):
                raise self._moved(
                    "while the run was stopped", expected=expected, found=self.run_tip
                )
            self.repo.update_ref(
                self.run_ref,
                expected,
                old=self.run_tip,
                message=f"fabro: resume sets aside commits of a cut-off stage ({self.run_tip[:12]})",
            )
            self.emit(
                RunNotice(
                    level="warn",
                    code="stage_commits_set_aside",
                    message=f"{runrefs.run_branch_name(self.run_id)} held commits of a stage "
                    f"that was cut off ({expected[:12]}..{self.run_tip[:12]}); the stage runs "
                    f"again from its checkpoint, and `git reflog show "
                    f"{runrefs.run_branch_name(self.run_id)}` still finds them",
                )
            )
            self.run_tip = expected
        if pending is not None:
            self.commit_pending(cp)

    def _merged_fixes(self, checkpoint_sha: str) -> bool:
        """Whether the branch's tip is `checkpoint_sha` with only `resume --rebase`
        merges of this run on top (a resume cut off before its next snapshot)."""
        assert self.run_tip is not None
        for count, info in enumerate(self.repo.iter_log(self.run_tip)):
            if info.sha == checkpoint_sha:
                return count > 0
            if (
                count > _RECONCILE_WALK_LIMIT
                or info.trailers.get(runrefs.TRAILER_RUN) != self.run_id
                or runrefs.TRAILER_REBASED_ONTO not in info.trailers
            ):
                return False
        return False

    def _find_pending_commit(self, pending: PendingCommit) -> str | None:
        """The run commit for `pending`, if the cycle made it before it was cut off: on
        the branch's first-parent line, between its tip and the pending parent."""
        assert self.run_tip is not None
        for count, info in enumerate(self.repo.iter_log(self.run_tip)):
            if info.sha == pending.parent or count > _RECONCILE_WALK_LIMIT:
                return None
            if info.parents[:1] == (pending.parent,) and runrefs.is_run_commit_for(
                info.trailers, self.run_id, pending.completed
            ):
                return info.sha
        return None


_RECONCILE_WALK_LIMIT = 10_000


class _Stamp(TypedDict, total=False):
    """The envelope fields of a stage checkpoint's snapshot events."""

    node_id: str
    node_label: str
    stage_id: str


def _stamp(stage: StageCheckpoint | None) -> _Stamp:
    if stage is None:
        return {}
    return {"node_id": stage.node_id, "node_label": stage.node_label, "stage_id": stage.stage_id}


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# Files at least this big are compared with the others of a snapshot before masking.
_SHARED_MASK_MIN = 64 * 1024


def _is_utf8_of(data: bytes, text: str) -> bool:
    """Whether `data` is `text` in UTF-8 (a length test first, then the bytes)."""
    if len(data) < len(text) or (text.isascii() and len(data) != len(text)):
        return False
    try:
        return data == text.encode()
    except UnicodeEncodeError:
        return False


def _masked_once(
    mask: Callable[[bytes], bytes],
    files: Mapping[str, bytes | Path | None],
    premasked: Mapping[int, tuple[bytes, bytes | StoredBlob]] | None = None,
) -> dict[str, bytes | StoredBlob | None]:
    """Each in-memory file of a snapshot, masked (Paths are left to be streamed).

    An offloaded value is two files with the same bytes (the visit's and the key's
    current one): a big file equal to one already masked takes that result, the very
    same object, so a 50 MB value is scanned for secrets once and hashed into a blob once.
    A file in `premasked` (by id, with the very object it was made from) was scanned,
    and maybe stored, already (`Recorder.premask`).
    """
    masked: dict[str, bytes | StoredBlob | None] = {}
    seen: dict[int, list[tuple[bytes, bytes]]] = {}  # by length: (original, masked)
    for path, data in files.items():
        if isinstance(data, Path):
            continue
        if data is None or len(data) < _SHARED_MASK_MIN:
            masked[path] = None if data is None else mask(data)
            continue
        known = premasked.get(id(data)) if premasked else None
        if known is not None and known[0] is data:
            masked[path] = known[1]
            continue
        same_length = seen.setdefault(len(data), [])
        earlier = next((done for original, done in same_length if original == data), None)
        if earlier is None:
            earlier = mask(data)
            same_length.append((data, earlier))
        masked[path] = earlier
    return masked
