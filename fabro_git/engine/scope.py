"""Scopes: one walk over a graph with its own context and worktree, and what it records.

A scope is the run itself, a parallel branch (own worktree and ref, stops at the
fan-in), or a child workflow (runs inside its parent's stage). The walk is the same for
all three (`engine.runner`); only what a scope keeps of each finished stage differs,
and that is its `ScopeRecording` (`engine.recording`): the run checkpoints to the meta
ref and the run branch, a branch commits on its own ref, a child leaves its tree to its
parent's stage. The walk asks the recording, never the kind of scope.

The records here are shared by the walk and its satellites (branches, child workflows,
the recordings), so none of them imports the walk itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
import trio

from fabro_git.engine.context import Context
from fabro_git.engine.outcome import FAILED, PARTIAL, SUCCEEDED, Outcome, StageRecord
from fabro_git.jsondata import JsonObject
from fabro_git.workflow import Graph, Node

if TYPE_CHECKING:
    from collections.abc import Callable

    from fabro_git.engine.clean_start import CleanStart


class RunFailed(Exception):
    """Ends the walk: the run cannot go on (visit limit, circuit breaker, no route...)."""


class SpendingCapReached(Exception):
    """The run's model cost passed its cap (`--max-cost`, `[run] max_cost`) at the
    checkpoint just saved: the run stops there, resumable as after an interrupt."""

    def __init__(self, cost: float, cap: float) -> None:
        from fabro_git.events.render import format_cost

        self.cost, self.cap = cost, cap
        super().__init__(
            f"the run has spent about {format_cost(cost)}, past its cap of {format_cost(cap)}"
        )


class Decision(msgspec.Struct):
    """Where a walk goes after a stage: a next node, an error that ends it failed, or
    neither, which ends it where it stands (an exit, or a stage with no edge to take).
    `edge` is the edge routing chose (from, to, label), for the `edge_selected` hooks."""

    next_node: str | None
    error: str | None = None
    edge: tuple[str, str, str | None] | None = None

    @property
    def ends_walk(self) -> bool:
        return self.next_node is None and self.error is None


class WalkEnd(msgspec.Struct):
    """How a walk ended: its final status, and the node it stopped in front of (a
    branch's fan-in or exit), if any."""

    status: str
    stopped_at: str | None = None


class Supervision(msgspec.Struct, frozen=True):
    """A manager loop's controls over its child workflow: every `poll_interval` seconds
    a cycle checks `stop_condition` on the child's context (true: the child stops, the
    stage succeeds); after `max_cycles` cycles the child stops and the stage fails. A
    child that ends on its own ends the stage at once, between polls."""

    poll_interval: float = 45.0
    max_cycles: int = 1000
    stop_condition: str | None = None


class ChildResult(msgspec.Struct):
    """A child workflow's end: its status (failed with `error`), the stages it ran, and
    the context keys it set."""

    status: str
    steps: int
    context_updates: JsonObject
    error: str | None = None
    notes: str | None = None


class FinishedStage(msgspec.Struct, frozen=True):
    """A stage the walk has run, as its scope records it."""

    node: Node
    visit: int
    stage_id: str
    result: Outcome


class ScopeRecording(Protocol):
    """What a scope keeps of each stage it runs: the one place the three scopes differ."""

    # How messages name the walk ("the run") and its graph ("the workflow").
    walk_name: str
    workflow_name: str

    async def files_touched(self, scope: Scope, stage_id: str) -> list[str]:
        """The paths the stage changed, against the scope's last recorded tree."""
        ...

    def tree_after_stage(self, scope: Scope, stage_id: str) -> Callable[[], None] | None:
        """Blocking work to do on the repository guard's trip after the stage, which
        finds what `files_touched` then returns without a trip of its own; None when
        there is none."""
        ...

    def clean_start(self, scope: Scope) -> CleanStart | None:
        """The worktree before the current stage when the last record still says it
        (see `clean_start`); None when the stage must take a snapshot."""
        ...

    async def record(
        self,
        scope: Scope,
        stage: FinishedStage,
        decision: Decision,
        then: Callable[[], object] | None = None,
    ) -> None:
        """Keep the finished stage (its files, its tree, where the walk goes next); the
        run's own scope does the blocking `then` on the same trip, once it has."""
        ...


class Scope(msgspec.Struct):
    recording: ScopeRecording
    graph: Graph
    context: Context
    worktree: Path
    visits: dict[str, int]
    outcomes: dict[str, StageRecord]
    completed: list[str]
    loop_signatures: dict[str, int]
    restart_signatures: dict[str, int]
    ref: str | None = None
    tip: str | None = None
    prefix: str = ""
    steps: int = 0
    # A parallel branch's name among the run's branches (`<node>-<visit>/<n>`): what
    # it sets and the threads it carries on are its own copies. None elsewhere.
    branch_tag: str | None = None
    # Handler types the walk stops in front of, without running them (a branch: fan-in, exit).
    stop_at: frozenset[str] = frozenset()
    # Nodes the walk stops in front of, whatever their type (a branch: its join node).
    stop_nodes: frozenset[str] = frozenset()
    # Heads merged into the scope's next commit (the fan-in's chosen branch).
    merge_parents: list[str] = msgspec.field(default_factory=list)
    # Trees of the worktree computed for a stage's files_touched, by stage id: a
    # branch's commit of the stage reuses its own.
    stage_trees: dict[str, str] = msgspec.field(default_factory=dict)
    # A child workflow makes no commits: the tree after its last stage, which the next
    # stage's files_touched is diffed against (None: its tip's tree).
    base_tree: str | None = None
    # A child workflow's progress ref (see `child_progress`), None where nothing keeps it.
    progress_ref: str | None = None
    # Why a child's manager stopped it (see `Supervision`): the stage in flight is cut
    # off through `halt_scope` and the walk goes no further.
    halted: str | None = None
    halt_scope: trio.CancelScope | None = None
    # Where the walk's command stages stream their output (`Ledger.output_dir`); None
    # until one runs, unless set (the run's own walk: `output/`).
    output_dir: Path | None = None

    def halt(self, reason: str) -> None:
        self.halted = reason
        if self.halt_scope is not None:
            self.halt_scope.cancel()

    def qualified(self, node_id: str) -> str:
        return f"{self.prefix}{node_id}"


def final_status(scope: Scope) -> str:
    """How a walk that reached its end went: failed when its last stage failed (a failure
    a condition routed to the end, say into a fan-in), else partially succeeded if any
    of its stages did, else succeeded."""
    if scope.completed:
        last = scope.outcomes.get(scope.completed[-1])
        if last is not None and last["status"] == FAILED:
            return FAILED
    statuses = {record["status"] for record in scope.outcomes.values()}
    return PARTIAL if PARTIAL in statuses else SUCCEEDED
