"""What a handler is given: the node, a read-only view of the context, where to work,
and a handle on the run for the few handlers that need more than that."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fabro_git.engine.runner import Runtime, Scope
    from fabro_git.workflow import Graph, Node


@dataclass
class StageRequest:
    runtime: Runtime
    scope: Scope
    graph: Graph
    node: Node
    context: Mapping[str, Any]
    visit: int
    attempt: int
    stage_id: str
    worktree: Path
    stage_dir: Path
    node_dir: str
    # Files for the stage's `nodes/<dir>/` entry on the meta ref, beyond status.json.
    files: dict[str, bytes] = field(default_factory=dict)
