"""`git fabro attach`: follow a live run from another terminal and answer its gates.

Progress comes from the run's events (what git holds, then the live tail), drawn by the
same renderer `run` uses. Questions come over the run's control socket: the run lists
its open gates to an attached client as they open and close, and takes the first answer
given, here or at its own terminal. A run that has ended prints its result instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from fabro_git.engine.control import GateUpdate
from fabro_git.engine.interviewer import Question, ask_again, takes
from fabro_git.engine.reader import RunEvent

if TYPE_CHECKING:
    from fabro_git.events.render import ProgressRenderer
    from fabro_git.store.repo import GitRepo

EXIT_BY_STATUS = {"succeeded": 0, "partially_succeeded": 0, "failed": 1, "interrupted": 130}


def run(run_id: str, *, output: str = "tail") -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.cli._streams import outlive_readers
    from fabro_git.engine.lock import is_live
    from fabro_git.store.repo import GitRepo

    outlive_readers()
    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    if is_live(Path(repo.git_dir), full_id):
        print(f"attached to run {full_id} (Ctrl-C detaches; the run goes on)", file=sys.stderr)
        try:
            trio.run(_attached, repo, full_id, output)
        except KeyboardInterrupt:
            print(f"\ndetached from run {full_id}; it goes on", file=sys.stderr)
            return 130
    return _result(repo, full_id)


def _result(repo: GitRepo, run_id: str) -> int:
    """Say how the run ended (or stands) and exit as it did."""
    from fabro_git.cli._running import model_use, where_the_result_is
    from fabro_git.cli._runs import read_row
    from fabro_git.engine.session import load_run
    from fabro_git.store import runs as runrefs

    manifest, checkpoint, meta, _source = load_run(repo, run_id)
    from fabro_git.terminal import printable

    status = read_row(repo, run_id, meta).status
    print(f"run {run_id} {printable(status.replace('_', ' '), one_line=True)}", file=sys.stderr)
    if status == "failed" and checkpoint.error:
        from fabro_git import redact

        error = printable(redact.for_process().mask_text(checkpoint.error))
        print(f"error: {error}", file=sys.stderr)
    if status in ("failed", "interrupted"):
        print(
            f"hint: see what happened with `git fabro logs {run_id} --pretty`;"
            f" continue it with `git fabro resume {run_id}`",
            file=sys.stderr,
        )
    tip = repo.read_ref(runrefs.run_branch_ref(run_id))
    if status in EXIT_BY_STATUS and EXIT_BY_STATUS[status] == 0 and manifest.run_branch and tip:
        spent = model_use(checkpoint.tokens, checkpoint.total_cost)
        where_the_result_is(repo, run_id, manifest.run_branch, manifest.base_sha, tip, spent)
    return EXIT_BY_STATUS.get(status, 1)


async def _attached(repo: GitRepo, run_id: str, output: str) -> None:
    events = _RunEvents(repo, run_id, output)
    async with trio.open_nursery() as nursery:
        gates = _Gates(repo, run_id, before_asking=events.catch_up)
        nursery.start_soon(gates.follow)
        await events.follow()
        nursery.cancel_scope.cancel()


class _RunEvents:
    """The run's events drawn as they come: what git holds, then the live tail. A gate
    catches up on them before it asks, so the stage that led to it is shown ended and the
    spinner has stepped aside (the run writes its `interview.started` to the tail before
    it opens the gate)."""

    def __init__(self, repo: GitRepo, run_id: str, output: str) -> None:
        from fabro_git.engine.reader import EventCursor
        from fabro_git.events.render import ProgressRenderer

        self.renderer = ProgressRenderer(stream=sys.stderr, output=output)
        self.cursor = EventCursor(repo, run_id)
        # Held from each read of the cursor until its events are drawn: what the
        # follower has read, the gate finds drawn.
        self._drawing = trio.Lock()

    async def catch_up(self) -> None:
        """Draw what the run recorded beyond what was drawn."""
        async with self._drawing:
            _render(self.renderer, await trio.to_thread.run_sync(self.cursor.read))

    async def follow(self) -> None:
        """Render the run's events until it ends and its last lines are drawn."""
        try:
            async for batch in self.cursor.follow_async(interval=0.1, holding=self._drawing):
                _render(self.renderer, batch)
        finally:
            self.renderer.close()


def _render(renderer: ProgressRenderer, events: list[RunEvent]) -> None:
    from fabro_git.events.render import _QUIET_PREFIXES

    for event in events:
        if not event.name.startswith(_QUIET_PREFIXES):
            renderer.handle_dict(event.envelope)


class _Gates:
    """The run's open gates, shown as they open; a line typed here answers the first."""

    def __init__(
        self, repo: GitRepo, run_id: str, *, before_asking: Callable[[], Awaitable[None]]
    ) -> None:
        from fabro_git.cli._running import stdin_answers
        from fabro_git.config.locations import run_scratch_dir
        from fabro_git.engine.lock import is_live

        self.run_id = run_id
        self.scratch = run_scratch_dir(Path(repo.git_dir), run_id)
        self.live: Callable[[], bool] = lambda: is_live(Path(repo.git_dir), run_id)
        self.can_answer = stdin_answers()
        self.open: dict[int, Question] = {}
        self._before_asking = before_asking
        self._opened = trio.Event()  # set while a question is open

    async def follow(self) -> None:
        from fabro_git.engine import control

        async with trio.open_nursery() as nursery:
            if self.can_answer:
                nursery.start_soon(self._read_answers)
            # A run just started with `run -d` may not listen yet: try until it does.
            while self.live():
                async for message in control.subscribe(self.scratch, control.Attach()):
                    await self._take(message)
                await trio.sleep(0.2)
            nursery.cancel_scope.cancel()

    async def _take(self, message: GateUpdate) -> None:
        if message.question is not None and message.id is not None:
            # Shown before it counts as open, so a line typed ahead answers it only
            # once it is on the screen.
            if not self.open:
                await self._show(message.question)
            self.open[message.id] = message.question
            self._opened.set()
        elif message.closed is not None:
            gate_id = message.closed
            was_first = bool(self.open) and next(iter(self.open)) == gate_id
            self.open.pop(gate_id, None)
            if message.by == "terminal":
                from fabro_git.terminal import printable

                await self._before_asking()
                answer = printable(str(message.answer), one_line=True)
                print(f"\n(answered at the run's terminal: {answer})", file=sys.stderr)
            if was_first and self.open:
                await self._show(next(iter(self.open.values())))
            if not self.open:
                self._opened = trio.Event()

    async def _show(self, question: Question) -> None:
        from fabro_git.engine.interviewer import format_question

        await self._before_asking()
        text = format_question(question)
        if not self.can_answer:
            text += "(this terminal cannot answer: attach from one whose stdin is a terminal)\n"
        else:
            text += "> "
        sys.stderr.write(text)
        sys.stderr.flush()

    async def _read_answers(self) -> None:
        from fabro_git.engine import control

        # A line typed (or piped) ahead answers the next question, as at the run's own
        # terminal.
        async for line in _stdin_lines():
            while not self.open:
                await self._opened.wait()
            gate_id = next(iter(self.open))
            question = self.open[gate_id]
            answer = line.strip()
            if not answer and question.default is not None:
                answer = question.default.label
            if not answer or not takes(question, answer):
                # Checked here, so a typo is asked again instead of failing the gate.
                sys.stderr.write(ask_again(question, answer) + "> ")
                sys.stderr.flush()
                continue
            reply = await trio.to_thread.run_sync(
                control.request, self.scratch, control.Answer(id=gate_id, text=answer)
            )
            if not reply or not reply.accepted:
                print("(that question was already answered)", file=sys.stderr)


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines of stdin as they come. One read in flight at a time, never abandoned
    between questions, so no line typed is lost to a read nobody waits for."""
    fd = sys.stdin.fileno()
    pending = b""
    while True:
        chunk = await trio.to_thread.run_sync(os.read, fd, 4096, abandon_on_cancel=True)
        if not chunk:
            if pending:
                yield pending.decode("utf-8", "replace")
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace")
