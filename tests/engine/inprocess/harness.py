"""Walks run in this process: a Runtime over a parsed graph, in a real temporary git
repository with a real recorder (a run in place: its checkpoints go to the meta ref, it
has no run branch of its own), its events collected from a real EventBus. Fast enough
to run on trio's MockClock."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio.testing
from virtual_clock import IDLE, still_while_threads_run

from fabro_git.engine import process_groups
from fabro_git.engine.checkpoint import Checkpoint, Manifest
from fabro_git.engine.gates import AttendedRun, GateDesk, SharedInterviewer
from fabro_git.engine.interviewer import Interviewer, Question, make_interviewer
from fabro_git.engine.recorder import Recorder
from fabro_git.engine.runner import Options, RunFailed, Runtime
from fabro_git.engine.session import make_emitter
from fabro_git.engine.stage import Handler
from fabro_git.engine.templating import render_goal, render_graph
from fabro_git.engine.watchdog import watch_for_stall
from fabro_git.events.bus import EventBus
from fabro_git.events.envelope import Envelope
from fabro_git.handlers import handler_for
from fabro_git.store.repo import GitRepo
from fabro_git.workflow import parse


class Collect:
    """Keeps every event, and the trio clock's time when it came from the trio thread
    (None from a worker thread, where a checkpoint runs)."""

    def __init__(self) -> None:
        self.events: list[Envelope] = []
        self.times: list[float | None] = []

    def handle(self, env: Envelope, line: bytes) -> None:
        self.events.append(env)
        try:
            self.times.append(trio.current_time())
        except RuntimeError:
            self.times.append(None)

    def close(self) -> None:
        pass


class NeverAnswers:
    """A person who never answers: the gate waits until something cancels it."""

    async def ask(self, question: Question) -> str | None:
        await trio.sleep_forever()
        return None  # pragma: no cover


@dataclass
class Walked:
    status: str | None
    error: str | None
    events: list[Envelope]
    runtime: Runtime
    seconds: float  # on the clock the walk ran on
    worktree: Path
    times: list[float | None]

    def time_of(self, name: str, node_id: str) -> float | None:
        """When the first `name` event of `node_id` came, on the walk's clock."""
        for env, at in zip(self.events, self.times, strict=True):
            if env.event == name and env.node_id == node_id:
                return at
        return None

    def named(self, name: str) -> list[Envelope]:
        return [e for e in self.events if e.event == name]

    def props(self, name: str) -> list[Any]:
        return [e.properties for e in self.named(name)]


def walk(
    source: str,
    tmp_path: Path,
    *,
    interviewer: Interviewer | None = None,
    handlers: Callable[[str], Handler | None] = handler_for,
    dry_run: bool = False,
    stall: float | None = None,
    mock_clock: bool = True,
    clock: trio.testing.MockClock | None = None,
    alongside: Callable[[], Awaitable[None]] | None = None,
    detached: bool = False,
    render: bool = False,
    run_branch: bool = False,
) -> Walked:
    """Run the graph's main walk to its end, on a MockClock that jumps over every sleep
    unless `mock_clock` is off (a real process must get the time to stop when told).
    A test that moves the time itself passes its own `clock` (one that never jumps on
    its own) and runs `alongside` the walk what moves it when the moment comes. As in
    a real run, the gates are put on a desk `git fabro attach` would see, and a gate
    waiting there is no stall; `detached` is a run with no terminal, whose gates wait
    for an attached answer. `render` renders the workflow's templates first, with no
    inputs and the graph's goal, as `git fabro run` does before a run starts. With
    `run_branch` the run records each stage's tree on a run branch checked out in the
    worktree, as a run in a worktree of its own does; else it runs in place, with none."""
    graph = parse(textwrap.dedent(source))
    goal = ""
    if render:
        goal = render_goal(graph, inputs={})
        render_graph(graph, goal=goal, inputs={})
    worktree = tmp_path / "worktree"
    worktree.mkdir(parents=True, exist_ok=True)
    base_sha = _init_repository(worktree)
    if run_branch:
        subprocess.run(["git", "checkout", "-q", "-b", "fabro/run/RUN"], cwd=worktree, check=True)
    repo = GitRepo.discover(worktree)
    manifest = Manifest(
        run_id="RUN",
        workflow_name=graph.name,
        workflow_slug="wf",
        workflow_path=None,
        goal=goal,
        inputs={},
        labels={},
        base_sha=base_sha,
        base_branch=None,
        run_branch=None,
        meta_ref="refs/fabro/meta/RUN",
        created_at="2026-01-01T00:00:00.000Z",
        source_directory=str(worktree),
        origin_url=None,
        in_place=True,
        settings={},
        tool_version="test",
    )
    sink = Collect()
    bus = EventBus("RUN", [sink])
    emit = make_emitter(bus)
    recorder = Recorder(
        repo,
        "RUN",
        workflow_slug="wf",
        emit=emit,
        take_segment=bus.take_segment,
        # In place, the run has no worktree or branch of its own.
        worktree=worktree if run_branch else None,
        exclude_globs=[],
        meta_tip=None,
        run_tip=base_sha if run_branch else None,
        requeue=bus.restore_pending,
    )
    desk = GateDesk()
    runtime = Runtime(
        run_id="RUN",
        repo=repo,
        graph=graph,
        manifest=manifest,
        checkpoint=Checkpoint(status="running", started_at="", timestamp=""),
        emit_event=emit,
        recorder=recorder,
        scratch=tmp_path / "scratch",
        worktree=worktree,
        interviewer=SharedInterviewer(
            interviewer or make_interviewer(auto_approve=False, answers=[], interactive=False),
            desk,
            detached=detached,
        ),
        options=Options(dry_run=dry_run, in_place=True),
        handlers=handlers,
    )
    # The clock jumps once the walk has been idle for 20 ms of real time, not at once:
    # a stage's real work (a command's process, a worker thread) is idle to trio, and a
    # clock that jumped at every such wait would race a child's manager through its
    # polls (45 s each, 1,000 at most) while `exit 3` ran. It never jumps while a
    # worker thread runs (git work: a checkpoint, the repository guard's look around
    # a stage), however long a loaded machine makes it.
    if clock is None and mock_clock:
        clock = trio.testing.MockClock(autojump_threshold=IDLE)
    status: str | None = None
    error: str | None = None

    async def walk_main() -> None:
        nonlocal status, error
        try:
            status = await runtime.run_main(runtime.main_scope())
        except RunFailed as exc:
            status, error = "failed", str(exc)

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            def stalled(idle: float) -> None:
                nonlocal status, error
                status, error = "failed", f"stalled after {idle:g}s"
                nursery.cancel_scope.cancel()

            if stall is not None:
                nursery.start_soon(watch_for_stall, AttendedRun(runtime, desk), stall, stalled)
            if alongside is not None:
                nursery.start_soon(alongside)
            await walk_main()
            nursery.cancel_scope.cancel()

    try:
        with still_while_threads_run(clock):
            trio.run(main, clock=clock)
    finally:
        # The run's end, as `git fabro run`'s: what its stages left is killed, and the
        # watcher of their records goes.
        process_groups.end_run(process_groups.records_dir(runtime.scratch), grace=2.0)
        repo.close()
    seconds = clock.current_time() if clock else 0.0
    return Walked(status, error, sink.events, runtime, seconds, worktree, sink.times)


def _init_repository(path: Path) -> str:
    """A fresh repository in `path` with one commit; its sha."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=path, check=True, capture_output=True, text=True)
        return done.stdout.strip()

    git("init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    git("add", "README.md")
    git("commit", "-q", "-m", "initial")
    return git("rev-parse", "HEAD")
