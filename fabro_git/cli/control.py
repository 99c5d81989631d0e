"""`git fabro interrupt` and `git fabro steer`: requests to a live run's control socket.

The run answers from its own process, so what it says is what happened: an interrupt
stops the stage in flight and leaves a resumable checkpoint (the run exits 130), and
steering text reaches the agent stages in flight, or the run says that none is.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.errors import FabroError

if TYPE_CHECKING:
    from fabro_git.engine import control


def _send(
    run_id: str, make: Callable[[control.Requester], control.Request]
) -> tuple[str, control.Reply]:
    """Send the request `make` builds (given who asks) to the run's control socket."""
    from fabro_git.cli._runs import resolve_run
    from fabro_git.config.locations import run_scratch_dir
    from fabro_git.engine import control
    from fabro_git.engine.lock import is_live
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    if not is_live(Path(repo.git_dir), full_id):
        raise FabroError(
            f"run {full_id} is not running here",
            hint=f"see where it stands with `git fabro ps`; continue it with `git fabro resume {full_id}`",
        )
    try:
        login = getpass.getuser()
    except (KeyError, OSError):
        login = None
    reply = control.request(
        run_scratch_dir(Path(repo.git_dir), full_id), make(control.Requester(login=login))
    )
    if reply is None:
        raise FabroError(
            f"run {full_id} is running but does not answer on its control socket",
            hint="it may still be starting (try again in a moment), or run by an older git fabro",
        )
    if not reply.ok:
        raise FabroError(f"run {full_id} refused: {reply.error or 'no reason given'}")
    return full_id, reply


def interrupt(run_id: str) -> int:
    from fabro_git.engine import control

    full_id, _ = _send(run_id, lambda actor: control.Interrupt(actor=actor))
    print(
        f"run {full_id} is stopping at a checkpoint; continue it with `git fabro resume {full_id}`",
        file=sys.stderr,
    )
    return 0


def steer(run_id: str, text: str) -> int:
    if not text.strip():
        raise FabroError("steering text is empty", hint='git fabro steer RUN "what to do instead"')
    from fabro_git.engine import control

    full_id, reply = _send(run_id, lambda actor: control.Steer(text=text, actor=actor))
    if reply.delivered:
        print(f"run {full_id}: the agent in flight takes it before its next turn", file=sys.stderr)
        return 0
    print(
        f"run {full_id}: no agent stage is running now, so nothing received it"
        " (it is recorded in the run's events as run.steer)",
        file=sys.stderr,
    )
    return 1
