"""Where a child workflow stands, kept after each of its stages, so a resume goes on
from there instead of running the child's finished stages again.

A child workflow runs inside its parent's stage and makes no checkpoint of its own: a run
killed in a child resumes at the parent stage. After each child stage, the worktree's
tree and the child walk's state (next node, visits, outcomes, context) are committed on
a ref of the parent stage's own (`refs/fabro/parallel/<run>/_child/<stage_id>`). The
parent stage's rerun after a crash has the same stage_id; it finds the ref, takes the
tree into the worktree and walks on from the next node. The ref goes when the child's
walk ends, so a retry of the parent stage starts its child afresh.

Every call here blocks on git: callers go through `Runtime.store_call`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from fabro_git.engine.checkpoint import StageRecords
from fabro_git.engine.context import plain_object
from fabro_git.errors import FabroError
from fabro_git.jsondata import JsonObject
from fabro_git.store import runs as runrefs

if TYPE_CHECKING:
    from fabro_git.engine.ledger import Ledger
    from fabro_git.engine.scope import Scope


class ChildProgress(msgspec.Struct, kw_only=True):
    next_node: str
    visits: dict[str, int]
    outcomes: StageRecords
    completed: list[str]
    loop_signatures: dict[str, int]
    restart_signatures: dict[str, int]
    context: JsonObject
    steps: int


def save(ledger: Ledger, scope: Scope, next_node: str) -> None:
    """Commit where the child stands after a stage that leads on to `next_node`."""
    ref, tree = scope.progress_ref, scope.base_tree
    if ref is None or tree is None or scope.tip is None:
        return
    state = ChildProgress(
        next_node=next_node,
        visits=dict(scope.visits),
        outcomes=dict(scope.outcomes),
        completed=list(scope.completed),
        loop_signatures=dict(scope.loop_signatures),
        restart_signatures=dict(scope.restart_signatures),
        context=plain_object(scope.context),
        steps=scope.steps,
    )
    message = ledger.recorder.redactor.mask_text(
        runrefs.child_progress_message(
            ledger.run_id, scope.prefix.rstrip("/"), msgspec.json.encode(state).decode()
        )
    )
    repo = ledger.repo
    sha = repo.write_commit(tree=tree, parents=[scope.tip], message=message)
    old = repo.read_ref(ref)
    repo.update_ref(ref, sha, old=old, message=f"fabro: child progress {next_node}")


def load(ledger: Ledger, ref: str) -> tuple[str, ChildProgress] | None:
    """The progress commit on `ref` and the state it holds, if any (a state git cannot
    read back counts as none: the child starts afresh)."""
    sha = ledger.repo.read_ref(ref)
    if sha is None:
        return None
    try:
        info = ledger.repo.commit_info(sha)
        body = info.message.split("\n\n", 1)[1]
        return sha, msgspec.json.decode(body.strip(), type=ChildProgress)
    except (FabroError, IndexError, msgspec.DecodeError):
        return None


def drop(ledger: Ledger, ref: str) -> None:
    sha = ledger.repo.read_ref(ref)
    if sha is not None:
        ledger.repo.delete_ref(ref, old=sha, message="fabro: child workflow ended")
