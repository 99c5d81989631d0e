"""Driving an open run to its end under trio: everything around the walk itself.

`execute_run` drives a run that `engine.runs` created or opened: the event sinks, the
crash reconciliation, the fixes a resume brings in, the worktree, the control socket,
Ctrl-C and the stall watchdog, and the `finalize` snapshot (`engine.finish`). `_drive`
is that sequence of steps, each named; the walk itself is `Runtime.run_main`.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import msgspec
import trio

from fabro_git.engine import control, cutoff, process_groups, retros
from fabro_git.engine import outcome as outcomes
from fabro_git.engine.emit import Emit
from fabro_git.engine.event_sinks import close as close_event_sinks
from fabro_git.engine.finish import INTERRUPTED, RunResult, finish
from fabro_git.engine.fixes import Fixes, apply_fixes
from fabro_git.engine.gates import AttendedRun, GateDesk, SharedInterviewer
from fabro_git.engine.interviewer import make_interviewer
from fabro_git.engine.lifecycle import AgentReply, LifecycleHooks
from fabro_git.engine.preflight import check_in_place_home, check_options, check_resumable
from fabro_git.engine.replication import LivePush
from fabro_git.engine.run_worktree import ensure_worktree
from fabro_git.engine.runner import (
    Options,
    RunFailed,
    Runtime,
    Scope,
    SpendingCapReached,
    walk_finished,
)
from fabro_git.engine.runs import OpenRun, RunSpec, create_run, make_emitter, open_run
from fabro_git.engine.setup import SetupFailed, run_setup
from fabro_git.engine.stage import Handler
from fabro_git.engine.stored_run import (
    StoredRun,
    load_run,
    missing_object_error,
    read_run_dir,
    restore_artifacts,
    unreadable_meta,
)
from fabro_git.engine.watchdog import watch_for_stall
from fabro_git.errors import FabroError, MissingObject
from fabro_git.events.bus import Sink, tail_after
from fabro_git.events.catalogue import (
    RunInterrupt,
    RunNotice,
    RunStarted,
    RunSteer,
    SandboxFailed,
    SandboxInitialized,
    SandboxInitializing,
    SandboxReady,
    WatchdogTimeout,
)
from fabro_git.events.envelope import EventProps
from fabro_git.store import worktree as git_worktree
from fabro_git.store.repo import GitRepo

# The run lifecycle lives in `engine.runs` and `engine.stored_run`; these names stay
# importable from here.
__all__ = [
    "OpenRun",
    "RunResult",
    "RunSpec",
    "StoredRun",
    "check_in_place_home",
    "check_options",
    "check_resumable",
    "create_run",
    "execute_run",
    "load_run",
    "make_emitter",
    "missing_object_error",
    "unreadable_meta",
    "write_json_result",
]

TERMINAL = ("succeeded", "partially_succeeded", "failed")


class DriveRequest(msgspec.Struct):
    """What one drive of an open run is asked for: how to run it, whether it is a
    resume, the stage handlers, and what a resume brings in first."""

    options: Options
    resuming: bool
    handlers: Callable[[str], Handler | None]
    fixes: Fixes


def execute_run(
    repo: GitRepo,
    run_id: str,
    *,
    options: Options,
    renderer: Sink | None,
    resuming: bool,
    handlers: Callable[[str], Handler | None],
    prepared: OpenRun | None = None,
    before: Sequence[EventProps] = (),
    fixes: Fixes | None = None,
    agent_hooks: AgentReply | None = None,
) -> RunResult:
    """Drive the run to its end: `prepared` if `create_run` made it just now, else the
    stored run, opened here. `before` are events about how the run got here (resume
    fetched it from a remote), emitted first; `fixes` what resume brings in first."""
    fixes = fixes or Fixes()
    run = prepared
    if run is None:
        workflow = fixes.workflow.graph if fixes.workflow is not None else None
        run = open_run(repo, run_id, workflow=workflow)
    if options.carried_goal is not None or options.carried_inputs:
        # The goal and inputs as given, which the stored run holds masked: for this
        # process's stages alone, never written back (the manifest it writes is masked).
        run.manifest = msgspec.structs.replace(
            run.manifest,
            goal=options.carried_goal or run.manifest.goal,
            inputs={**run.manifest.inputs, **options.carried_inputs},
        )
    emit = run.emit
    for event in before:
        emit(event)
    if renderer is not None:
        run.bus.add_sink(renderer)
    manifest = run.manifest
    for problem in (*manifest.recorded_config.unreadable, *manifest.options.unreadable):
        # A manifest of another version, or a hostile one: the run goes on without it.
        message = f"the run's recorded configuration: {problem}; this version leaves it out"
        emit(RunNotice(level="warn", code="config_unreadable", message=message))
    hooks = LifecycleHooks.from_manifest(
        run.manifest,
        run_id=run_id,
        workflow=run.graph.name,
        host_dir=repo.root,
        scratch=run.scratch,
        emit=emit,
    )
    hooks.agent_reply = agent_hooks
    request = DriveRequest(options, resuming, handlers, fixes)
    try:
        return trio.run(_drive_hooked, run, request, hooks)
    finally:
        close_event_sinks(run.bus)  # before the kill: a sink's program reads to the end first
        process_groups.end_run(process_groups.records_dir(run.scratch), grace=2.0)
        run.bus.close()
        run.lock.release()


async def _drive_hooked(run: OpenRun, request: DriveRequest, hooks: LifecycleHooks) -> RunResult:
    """The drive, with its non-blocking lifecycle hooks allowed to finish after it."""
    async with hooks.running():
        return await _drive(run, request, hooks)


async def _drive(run: OpenRun, request: DriveRequest, hooks: LifecycleHooks) -> RunResult:
    resuming = request.resuming
    hooks.on_usage = run.checkpoint.spend  # what a prompt or agent hook's model spends is the run's
    cut_off = await _find_cut_off(run) if resuming else cutoff.CutOff()
    if resuming:
        await _reconcile(run)
    fixed = await _apply_fixes(run, request.fixes)
    # A process killed after the exit checkpoint may have announced run.completed in the
    # tail (now queued for the next segment); the finish must not announce it twice.
    announced = (
        resuming
        and walk_finished(run.checkpoint, run.graph)
        and await trio.to_thread.run_sync(_tail_has, run, "run.completed")
    )
    if resuming and run.checkpoint.status in TERMINAL and run.checkpoint.status != outcomes.FAILED:
        return _result_as_stored(run)
    worktree, fresh = await _prepare_worktree(run, new=not resuming)
    hooks.worktree = worktree
    await _announce_start(run, resuming, worktree, cut_off)
    pusher = None
    if request.options.push_remote:
        pusher = LivePush(run.repo, run.run_id, request.options.push_remote, run.emit)
    desk = GateDesk()  # the gates `git fabro attach` sees and answers
    runtime = _make_runtime(run, request, hooks, worktree, desk, pusher)
    runtime.resumed_attempts = cut_off.attempts
    runtime.pending_files.update(fixed)
    # Signals are taken for the whole drive, the final snapshot included: the first
    # Ctrl-C (or SIGTERM) cancels the stage in flight, later ones only wait for the
    # checkpoint, and none can cut the finish short with a KeyboardInterrupt.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        walk = _Walk(runtime, desk, run.emit, first_start=fresh and not resuming, resuming=resuming)
        await walk.run(signals, pusher)
        # What stages left running in the background goes before the worktree does (the
        # non-blocking hooks still running are awaited at the very end).
        await _stop_stage_processes(run)
        return await _end(runtime, walk, signals, pusher, announce=not announced)


# -- the steps before the walk ------------------------------------------------------------


async def _find_cut_off(run: OpenRun) -> cutoff.CutOff:
    """What the crash (if any) cut off since the last checkpoint."""
    meta = run.recorder.meta_tip if run.recorder else None
    tail = run.scratch / "events.jsonl"
    since = await trio.to_thread.run_sync(
        cutoff.since_checkpoint, run.repo, meta, run.checkpoint, tail
    )
    return cutoff.find_cut_off(since)


async def _reconcile(run: OpenRun) -> None:
    """Make what a crash left half made (`Recorder.reconcile`). The start-up's git calls
    run on a worker thread, as every git call from the trio loop does: nothing else runs
    yet, but the loop is never the one that blocks."""
    recorder = run.recorder
    try:
        await trio.to_thread.run_sync(
            partial(recorder.reconcile, run.checkpoint, base_sha=run.manifest.base_sha)
        )
    except MissingObject as exc:
        raise missing_object_error(
            run.run_id, recorder.run_ref, recorder.run_tip or "", exc
        ) from exc


async def _apply_fixes(run: OpenRun, fixes: Fixes) -> dict[str, bytes | None]:
    """What resume brings in (`--rebase`, `--workflow`): the next snapshot records it."""
    recorder = run.recorder
    if fixes.rebase is None and fixes.workflow is None:
        return {}
    meta_tip = recorder.meta_tip
    assert meta_tip is not None
    return await trio.to_thread.run_sync(
        partial(
            apply_fixes,
            run.repo,
            run.run_id,
            run.manifest,
            run.checkpoint,
            recorder,
            fixes,
            run.emit,
            partial(read_run_dir, run.repo, meta_tip, run_id=run.run_id),
        )
    )


def _result_as_stored(run: OpenRun) -> RunResult:
    """A resume of a run that had already ended: it ends as it did."""
    manifest = run.manifest
    return RunResult(
        run.run_id,
        run.checkpoint.status,
        manifest.run_branch,
        manifest.meta_ref,
        run.recorder.run_tip if run.recorder else None,
        tokens=run.checkpoint.tokens,
        total_cost=run.checkpoint.total_cost,
    )


async def _prepare_worktree(run: OpenRun, *, new: bool) -> tuple[Path, bool]:
    """The directory the stages run in, and whether it was checked out afresh."""
    emit = run.emit
    emit(SandboxInitializing(provider="local"))
    started = time.monotonic()
    fresh = False
    if run.manifest.in_place:
        check_in_place_home(run.repo, run.run_id, run.manifest)
        worktree = Path(run.repo.root)
    else:
        worktree, fresh = await _checkout(run, new=new, started=started)
    emit(SandboxReady(provider="local", duration_ms=_ms_since(started), name=str(worktree)))
    emit(
        SandboxInitialized(
            working_directory=str(worktree),
            provider="local",
            identifier=run.run_id,
            repo_cloned=False,
        )
    )
    run.checkpoint.context_values["internal.work_dir"] = str(worktree)
    return worktree, fresh


async def _checkout(run: OpenRun, *, new: bool, started: float) -> tuple[Path, bool]:
    recorder = run.recorder
    assert recorder.run_tip is not None
    try:
        worktree, fresh = await trio.to_thread.run_sync(
            partial(
                ensure_worktree,
                run.repo,
                run.run_id,
                run.scratch,
                recorder.run_tip,
                run.emit,
                new=new,
                base_branch=run.manifest.base_branch,
            )
        )
    except FabroError as exc:
        run.emit(SandboxFailed(provider="local", error=str(exc), duration_ms=_ms_since(started)))
        raise
    if not fresh:
        # What a cut-off stage left untracked must not leak into its rerun.
        await trio.to_thread.run_sync(
            partial(git_worktree.remove_untracked, worktree, exclude_globs=recorder.exclude_globs)
        )
    recorder.worktree = worktree
    return worktree, fresh


async def _announce_start(
    run: OpenRun, resuming: bool, worktree: Path, cut_off: cutoff.CutOff
) -> None:
    checkpoint, emit, recorder = run.checkpoint, run.emit, run.recorder
    if resuming and recorder.meta_tip is not None:
        await trio.to_thread.run_sync(
            restore_artifacts, run.repo, run.run_id, recorder.meta_tip, checkpoint, run.scratch
        )
    if resuming and await trio.to_thread.run_sync(_has_begun, run):
        emit(
            RunNotice(
                level="info",
                code="resumed",
                message=f"resuming from checkpoint after {checkpoint.current_node or 'start'}; next: {checkpoint.next_node_id or 'start'}",
            )
        )
    cutoff.count_serials_on(cut_off, checkpoint.stage_serials)
    cutoff.close_cut_off(cut_off, emit)
    checkpoint.status = "running"
    checkpoint.error = None
    manifest = run.manifest
    emit(
        RunStarted(
            name=run.graph.name,
            base_branch=manifest.base_branch,
            base_sha=manifest.base_sha,
            run_branch=manifest.run_branch,
            worktree_dir=str(worktree),
            goal=manifest.goal or None,
        )
    )


def _make_runtime(
    run: OpenRun,
    request: DriveRequest,
    hooks: LifecycleHooks,
    worktree: Path,
    desk: GateDesk,
    pusher: LivePush | None,
) -> Runtime:
    options = request.options
    emit = run.emit
    return Runtime(
        run_id=run.run_id,
        repo=run.repo,
        graph=run.graph,
        manifest=run.manifest,
        checkpoint=run.checkpoint,
        emit_event=pusher.watching(emit) if pusher else emit,
        recorder=run.recorder,
        scratch=run.scratch,
        worktree=worktree,
        interviewer=SharedInterviewer(
            make_interviewer(
                auto_approve=options.auto_approve,
                answers=options.answers,
                interactive=options.interactive,
            ),
            desk,
            detached=options.detached,
        ),
        options=options,
        handlers=request.handlers,
        hooks=hooks,
    )


def _has_begun(run: OpenRun) -> bool:
    """Whether an earlier process started this run: `run -d` has its detached child load
    the run it just created the way a resume does, and that first start is no resume."""
    checkpoint = run.checkpoint
    return (
        checkpoint.status != "running"
        or checkpoint.stage_index > 0
        or bool(checkpoint.node_visits)
        or _tail_has(run, "run.started")
    )


def _tail_has(run: OpenRun, event: str) -> bool:
    """Whether the live tail holds `event` after the last snapshotted event."""
    tail = run.scratch / "events.jsonl"
    if not tail.exists():
        return False
    for line in tail_after(tail.read_bytes(), run.checkpoint.last_event_id).splitlines():
        with contextlib.suppress(msgspec.DecodeError):
            if msgspec.json.decode(line).get("event") == event:
                return True
    return False


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# -- the walk, under its watchers ---------------------------------------------------------


ADOPTED_NOTE_INTERVAL = 1.0


async def _note_adopted(records: Path) -> None:
    """Note, every second, what this process has adopted (a stage's orphan: see
    `fabro_git.engine.reaper`), so the watcher finds it should this process be killed
    with -9. A stage's own end notes it too; this covers a process whose parent died
    mid-stage, which after a kill -9 no ancestry leads to."""
    while True:
        await trio.sleep(ADOPTED_NOTE_INTERVAL)
        await trio.to_thread.run_sync(process_groups.record_adopted, records)


class _Walk:
    """The walk with what watches it: signals, the control socket, the live push and the
    stall watchdog. It records how the walk ended (`status`, `error`), whether the user
    interrupted it, and the spending cap that stopped it, if one did."""

    def __init__(
        self,
        runtime: Runtime,
        desk: GateDesk,
        emit: Emit,
        *,
        first_start: bool,
        resuming: bool,
    ) -> None:
        self.runtime = runtime
        self.emit = emit
        self.scope: Scope = runtime.main_scope()
        self.desk = desk
        self.first_start = first_start
        self.resuming = resuming
        self.status = "running"
        self.error: str | None = None
        self.interrupted = False
        self.spent: SpendingCapReached | None = None
        self.cancel_scope = trio.CancelScope()
        self.stall = runtime.graph.get_duration("stall_timeout", 1800.0) or 0.0

    async def run(self, signals: AsyncIterator[int], pusher: LivePush | None) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_signals, signals)
            nursery.start_soon(_note_adopted, process_groups.records_dir(self.runtime.scratch))
            await nursery.start(control.serve, self.runtime.scratch, self._control_request)
            if pusher is not None:
                await nursery.start(pusher.serve)
            if self.stall > 0:
                attended = AttendedRun(self.runtime, self.desk)
                nursery.start_soon(watch_for_stall, attended, self.stall, self._stalled)
            with self.cancel_scope:
                await self._walk()
            if self.cancel_scope.cancelled_caught:
                if self.interrupted:
                    self.status = INTERRUPTED
                else:
                    self.status = outcomes.FAILED
                    self.error = self.error or "run cancelled"
            nursery.cancel_scope.cancel()

    async def _walk(self) -> None:
        try:
            await self._start()
            self.status = await self.runtime.run_main(self.scope)
        except (RunFailed, SetupFailed) as exc:
            self.status, self.error = outcomes.FAILED, str(exc)
        except SpendingCapReached as exc:
            self.status, self.spent = INTERRUPTED, exc
            run_id, checkpoint = self.runtime.run_id, self.runtime.cp
            self.emit(
                RunNotice(
                    level="warn",
                    code="max_cost_reached",
                    message=f"{exc}; stopped at the checkpoint after "
                    f"{checkpoint.current_node}. Continue with a higher cap: "
                    f"`git fabro resume {run_id} --max-cost USD`",
                )
            )

    async def _start(self) -> None:
        """Setup commands (once per run), the clean start, then the start hooks."""
        runtime, checkpoint = self.runtime, self.runtime.cp
        manifest = runtime.manifest
        if (
            not checkpoint.completed_nodes
            and not checkpoint.node_visits
            and not checkpoint.context_values.get("internal.setup_done")
        ):
            await run_setup(runtime, manifest, runtime.worktree)
            self.scope.context.set("internal.setup_done", True)
        if self.first_start and not manifest.options.setup_commands:
            # The checkout is the tip's tree: a CLI stage needs no snapshot.
            from fabro_git.engine import clean_start

            await clean_start.after_fresh_checkout(runtime.ledger)
        await _start_hooks(runtime.hooks, resuming=self.resuming)

    def _interrupt(self) -> None:
        # The user asked to stop: nothing of the run may hold the exit, the hooks
        # running beside it included.
        if not self.interrupted:
            self.interrupted = True
            self.cancel_scope.cancel()
            self.runtime.hooks.stop()

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            self._interrupt()

    def _stalled(self, idle: float) -> None:
        self.emit(
            WatchdogTimeout(idle_seconds=int(idle)),
            node_id=self.scope.context.text("current_node"),
        )
        self.error = f"stall watchdog: no activity for {int(idle)}s (stall_timeout={self.stall:g}s)"
        self.cancel_scope.cancel()

    async def _control_request(self, request: control.Request) -> control.Reply | control.Stream:
        actor = request.actor.as_actor()
        match request:
            case control.Interrupt():
                self.emit(RunInterrupt(), actor=actor)
                self._interrupt()
                return control.Reply(ok=True)
            case control.Steer(text=text):
                self.emit(RunSteer(text=text), actor=actor)
                return control.Reply(ok=True, delivered=self.runtime.steer(text))
            case control.Attach():
                return control.Stream(self.desk.follow)
            case control.Answer(id=gate, text=text):
                return control.Reply(ok=True, accepted=self.desk.answer(gate, text))


async def _start_hooks(hooks: LifecycleHooks, *, resuming: bool) -> None:
    """`sandbox_ready`, then `run_start`: a block from either fails the run before its
    first stage (a skip has no stage to skip, and proceeds)."""
    for event in ("sandbox_ready", "run_start"):
        decision = await hooks.fire(event, resumed=resuming or None)
        if decision.action == "block":
            raise RunFailed(decision.describe(event))


async def _stop_stage_processes(run: OpenRun) -> None:
    """Kill what stages left running, on a worker thread: it waits out a grace period."""
    records = process_groups.records_dir(run.scratch)
    await trio.to_thread.run_sync(
        partial(process_groups.kill_recorded, records, grace=2.0, kind="stage")
    )


# -- the end -------------------------------------------------------------------------------


async def _end(
    runtime: Runtime,
    walk: _Walk,
    signals: AsyncIterator[int],
    pusher: LivePush | None,
    *,
    announce: bool,
) -> RunResult:
    narrative = None
    if runtime.options.retro and runtime.options.retro_narrative and walk.status != INTERRUPTED:
        narrative = await retros.narrative_for(runtime, walk.status, walk.error)
    ending = finish(
        runtime, walk.scope, walk.status, walk.error, announce=announce, narrative=narrative
    )
    result = await _finish_heeding(signals, runtime.hooks, ending)
    if pusher is not None:
        await pusher.finish(signals)
    if walk.spent is not None:
        result.error = str(walk.spent)  # why it stopped, for the command's last words
    return result


async def _finish_heeding(
    signals: AsyncIterator[int], hooks: LifecycleHooks, ending: Awaitable[RunResult]
) -> RunResult:
    """Await `ending`; asked again meanwhile (Ctrl-C, SIGTERM), the hooks of the finish
    give way (`LifecycleHooks.cut_short`) and the final snapshot is still written. What
    `ending` raises comes out as it was raised."""

    async def cut_hooks_short() -> None:
        async for _ in signals:
            hooks.cut_short()

    try:
        async with trio.open_nursery() as finishing:
            finishing.start_soon(cut_hooks_short)
            try:
                return await ending
            finally:
                finishing.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The watcher raises nothing of its own: the error is the finish's.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def write_json_result(result: RunResult) -> None:
    from fabro_git.terminal import json_printable

    sys.stdout.write(json_printable(msgspec.json.encode(result.to_json()).decode()) + "\n")
    sys.stdout.flush()
