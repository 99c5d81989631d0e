"""Live replication: a run that names a `push_remote` pushes its refs after every
checkpoint, so a teammate can follow it with `fetch`/`logs` and take it over with
`resume` if this machine dies.

The push runs beside the stages, never in front of them: a checkpoint only asks for a
push, and one task pushes whatever the refs hold when it gets to it. Asks that arrive
while a push is in flight coalesce into the next one, and since each push reads the
refs when it starts, a later checkpoint can never be overtaken by an earlier one. The
pushes are never forced: a remote that moved on (someone resumed the run elsewhere)
rejects them, which is a warning, as any other failure to push is; replication never
fails a run. The final push, after the run's last snapshot, is waited for, within a
bound the caller sets.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import AsyncIterable
from typing import Unpack

import trio

from fabro_git.engine.emit import Emit, EnvelopeFields
from fabro_git.errors import FabroError
from fabro_git.events.catalogue import CheckpointCompleted, GitPush, RunNotice
from fabro_git.events.envelope import EventProps
from fabro_git.store import runs as runrefs
from fabro_git.store.remote import PushReport, local_refs, push
from fabro_git.store.repo import GitRepo

# How long a run's end waits for its final push.
FINAL_PUSH_SECONDS = 60.0
# A remote asking for a password would wait forever on nobody: a live push never prompts.
_NO_PROMPT = {"GIT_TERMINAL_PROMPT": "0"}


class LivePush:
    """Pushes one run's refs to `remote` whenever asked, one push at a time."""

    def __init__(self, repo: GitRepo, run_id: str, remote: str, emit: Emit) -> None:
        self.repo = repo
        self.run_id = run_id
        self.remote = remote
        self.emit = emit
        self._asked = 0  # pushes asked for
        self._wake = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._failing = False  # the last push failed: say so once, not at every checkpoint
        # Set while no push is in flight. A push cut off by the run's end goes on in its
        # thread; the final push waits for it, as two pushes of one ref collide.
        self._idle = trio.Event()
        self._idle.set()
        self._patterns = [
            runrefs.run_branch_ref(run_id),
            runrefs.meta_ref(run_id),
            f"{runrefs.PARALLEL_PREFIX}{run_id}",
        ]

    # -- asking (any thread) ---------------------------------------------------------

    def watching(self, emit: Emit) -> Emit:
        """`emit`, which also asks for a push after every checkpoint. Checkpoints are
        taken on a worker thread, so the ask reaches the trio loop through its token."""

        def emit_and_ask(event: EventProps, /, **kwargs: Unpack[EnvelopeFields]) -> None:
            emit(event, **kwargs)
            name = event if isinstance(event, str) else event.NAME
            if name == CheckpointCompleted.NAME and self._token is not None:
                self._token.run_sync_soon(self._ask)

        return emit_and_ask

    def _ask(self) -> None:
        self._asked += 1
        self._wake.set()

    # -- pushing (the trio loop) -----------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Push at once (the run as it starts), then after each ask until cancelled;
        asks made during a push coalesce into the next."""
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        self._ask()
        done = 0
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._asked == done:
                continue
            done = self._asked
            await self.push_now()

    async def finish(
        self, interrupts: AsyncIterable[object] | None = None, seconds: float = FINAL_PUSH_SECONDS
    ) -> None:
        """The push after the run's last snapshot, waited for up to `seconds`, or until
        the next of `interrupts` (Ctrl-C): the run's record is safe in git by then."""
        pushed = False
        async with trio.open_nursery() as nursery:

            async def stop_at_interrupt() -> None:
                assert interrupts is not None
                async for _ in interrupts:
                    nursery.cancel_scope.cancel()
                    return

            if interrupts is not None:
                nursery.start_soon(stop_at_interrupt)
            with trio.move_on_after(seconds):
                await self._idle.wait()
                await self.push_now()
                pushed = True
            nursery.cancel_scope.cancel()
        if not pushed:
            self.emit(
                RunNotice(
                    level="warn",
                    code="push_failed",
                    message=f"the final push to {self.remote} did not finish; push the run"
                    f" with `{shlex.join(['git', 'fabro', 'push', self.remote, self.run_id])}`",
                )
            )

    async def push_now(self) -> bool:
        """Push the run's refs as they are now; report the outcome as events."""
        self._idle = idle = trio.Event()
        token = trio.lowlevel.current_trio_token()
        refs: list[str] = []
        # "waiting" until the thread starts; a cancel before that means it never will.
        state = ["waiting"]
        guard = threading.Lock()

        def push_now() -> PushReport | None:
            with guard:
                if state[0] == "cancelled":
                    return None
                state[0] = "running"
            try:
                # Listed here, on the worker thread and by git itself: the refs as they
                # are when this push starts, read beside the checkpoints' writes.
                refs.extend(local_refs(self.repo, self._patterns))
                return push(self.repo, self.remote, refs, env=_NO_PROMPT)
            finally:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(idle.set)

        try:
            report = await trio.to_thread.run_sync(push_now, abandon_on_cancel=True)
        except trio.Cancelled:
            with guard:
                if state[0] == "waiting":
                    state[0] = "cancelled"
                    idle.set()
            raise
        except FabroError as exc:
            problem = str(exc)
        else:
            if report is None:
                return False
            rejected = [(ref, why) for ref, ok, why in report.refs if not ok]
            problem = "; ".join(f"{ref} rejected ({why})" for ref, why in rejected)
        branch = (
            runrefs.run_branch_name(self.run_id)
            if runrefs.run_branch_ref(self.run_id) in refs
            else runrefs.meta_ref(self.run_id)
        )
        self.emit(GitPush(branch=branch, success=not problem))
        if problem and not self._failing:
            self.emit(
                RunNotice(
                    level="warn",
                    code="push_failed",
                    message=f"could not push the run to {self.remote} (the run goes on): {problem}",
                )
            )
        elif not problem and self._failing:
            self.emit(
                RunNotice(
                    level="info", code="push_recovered", message=f"pushing to {self.remote} again"
                )
            )
        self._failing = bool(problem)
        return not problem
