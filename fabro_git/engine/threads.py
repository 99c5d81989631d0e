"""Shared conversations: the message history of a `thread_id`, kept on the meta ref.

Stages whose node sets `thread_id` with `fidelity="full"` carry one conversation on:
each reads the thread as the last stage of that thread left it, and writes it back when
it ends. The write joins the stage's checkpoint (`threads/<id>.json` on the meta ref),
so the conversation survives a crash, an interrupt and a resume in another clone; a
stage cut off before its checkpoint leaves the thread as it was before that stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabro_git.store.runs import thread_path

if TYPE_CHECKING:
    from fabro_git.engine.ledger import Ledger


async def load(ledger: Ledger, thread_id: str) -> bytes | None:
    """The thread's saved conversation: one written since the last checkpoint, else the
    one the meta ref holds, else None (a new thread)."""
    path = thread_path(thread_id)
    pending = ledger.pending_files.get(path)
    if isinstance(pending, bytes):
        return pending
    tip = ledger.recorder.meta_tip
    if tip is None:
        return None
    return await ledger.call(ledger.repo.read_file, tip, path)


def save(ledger: Ledger, thread_id: str, data: bytes) -> None:
    """Keep the thread's conversation; the next checkpoint writes it to the meta ref."""
    ledger.pending_files[thread_path(thread_id)] = data
