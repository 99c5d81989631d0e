"""The parsed workflow: nodes, edges and the graph that holds them.

Attribute values stay as the strings the author wrote. Interpretation happens in typed
accessors (`get_int`, `get_duration`, ...) at the point of use, so a malformed value is
reported with the exact file position of the attribute that carries it, and the engine,
the validator and `git fabro graph` all read the same values the same way.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from fabro_git.durations import DURATION_EXPECTED
from fabro_git.durations import parse_duration as parse_duration
from fabro_git.errors import WorkflowError

if TYPE_CHECKING:
    from fabro_git.workflow.paths import Origin

# Handler types, as the engine dispatches on them.
START = "start"
EXIT = "exit"
AGENT = "agent"
PROMPT = "prompt"
COMMAND = "command"
HUMAN = "human"
CONDITIONAL = "conditional"
PARALLEL = "parallel"
FAN_IN = "parallel.fan_in"
WAIT = "wait"
MANAGER_LOOP = "stack.manager_loop"

HANDLER_TYPES: frozenset[str] = frozenset(
    {START, EXIT, AGENT, PROMPT, COMMAND, HUMAN, CONDITIONAL, PARALLEL, FAN_IN, WAIT, MANAGER_LOOP}
)
LLM_TYPES: frozenset[str] = frozenset({AGENT, PROMPT})

SHAPE_TO_TYPE: dict[str, str] = {
    "Mdiamond": START,
    "Msquare": EXIT,
    "box": AGENT,
    "tab": PROMPT,
    "parallelogram": COMMAND,
    "hexagon": HUMAN,
    "diamond": CONDITIONAL,
    "component": PARALLEL,
    "tripleoctagon": FAN_IN,
    "insulator": WAIT,
    "house": MANAGER_LOOP,
}

# Names the Attractor spec uses for the same handlers; `type=` accepts them too.
TYPE_ALIASES: dict[str, str] = {
    "codergen": AGENT,
    "wait.human": HUMAN,
    "tool": COMMAND,
    "fan_in": FAN_IN,
}

START_IDS = frozenset({"start", "Start"})
EXIT_IDS = frozenset({"exit", "Exit", "end", "End"})

DEFAULT_SHAPE = "box"

# A node id becomes a component of ref names (`refs/fabro/parallel/<run>/<id>-<visit>/<n>`),
# of meta tree paths (`nodes/<id>-<visit>/`) and of scratch paths. The character set
# keeps every git ref-format and path rule (no `/`, `\`, `..`, `@{`, `.lock`, control
# characters, leading `-` or `.`); the length cap leaves room in a 255-byte file name
# for a visit suffix and git's `.lock`.
NODE_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
NODE_ID_MAX_LENGTH = 100

_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


def node_id_problem(node_id: str) -> str | None:
    """Why `node_id` cannot name a node, or None if it can."""
    if not NODE_ID_RE.match(node_id):
        return "ids are letters, digits and '_', starting with a letter or '_'"
    if len(node_id) > NODE_ID_MAX_LENGTH:
        return (
            f"it is {len(node_id)} characters long and ids are at most {NODE_ID_MAX_LENGTH}, "
            "since they name refs and directories"
        )
    return None


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector while a graph is built or checked.

    A big workflow is hundreds of thousands of small dicts and lists, none of them in a
    reference cycle; left on, the collector walks all of them again and again as they
    pile up, which costs more than the parse itself at 100k nodes.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_bool(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return None


class _Attributed:
    """Typed reads of string attributes, failing with the attribute's position."""

    __slots__ = ()

    attrs: dict[str, str]
    positions: dict[str, tuple[int, int]]

    def _describe(self) -> str:
        raise NotImplementedError

    def _location(self, key: str) -> tuple[Path | None, int | None, int | None]:
        raise NotImplementedError

    def _bad_value(self, key: str, value: str, expected: str) -> WorkflowError:
        path, line, column = self._location(key)
        return WorkflowError(
            f"{self._describe()}: {key}={value!r} is not {expected}",
            path=path,
            line=line,
            column=column,
        )

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.attrs.get(key, default)

    def get_int(self, key: str, default: int) -> int:
        value = self.attrs.get(key)
        if value is None or value.strip() == "":
            return default
        try:
            return int(value.strip(), 10)
        except ValueError:
            raise self._bad_value(key, value, "an integer") from None

    def get_float(self, key: str, default: float) -> float:
        value = self.attrs.get(key)
        if value is None or value.strip() == "":
            return default
        try:
            result = float(value.strip())
        except ValueError:
            raise self._bad_value(key, value, "a number") from None
        if result != result or result in (float("inf"), float("-inf")):
            raise self._bad_value(key, value, "a finite number")
        return result

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.attrs.get(key)
        if value is None or value.strip() == "":
            return default
        result = parse_bool(value)
        if result is None:
            raise self._bad_value(key, value, "a boolean (true or false)")
        return result

    def get_duration(self, key: str, default: float | None) -> float | None:
        value = self.attrs.get(key)
        if value is None or value.strip() == "":
            return default
        result = parse_duration(value)
        if result is None:
            raise self._bad_value(key, value, DURATION_EXPECTED)
        return result


class Node(_Attributed, msgspec.Struct, eq=False):
    """One step of the workflow, as declared (or as first referenced by an edge)."""

    id: str
    attrs: dict[str, str] = msgspec.field(default_factory=dict)
    line: int = 0
    column: int = 0
    classes: list[str] = msgspec.field(default_factory=list)
    positions: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    # False for a node that only ever appears as an edge endpoint.
    declared: bool = True
    # Attribute keys whose values came from the model stylesheet, not the file.
    styled: set[str] = msgspec.field(default_factory=set)
    path: Path | None = None

    def _describe(self) -> str:
        return f"node {self.id!r}"

    def _location(self, key: str) -> tuple[Path | None, int | None, int | None]:
        line, column = self.positions.get(key, (self.line, self.column))
        return self.path, line, column

    @property
    def shape(self) -> str:
        return self.attrs.get("shape") or DEFAULT_SHAPE

    @property
    def explicit_type(self) -> str | None:
        value = self.attrs.get("type", "").strip()
        return value or None

    @property
    def handler_type(self) -> str:
        """The handler that runs this node.

        An explicit `type=` wins (Attractor's names are accepted as aliases); an
        unknown explicit type is returned as written so the engine can name it. Then
        the shape decides, except that a node called `start` or `exit` (and friends)
        with no shape of its own, or the default `box`, is a start or exit node.
        An unknown shape runs as an agent; the validator warns about it.
        """
        explicit = self.explicit_type
        if explicit is not None:
            return TYPE_ALIASES.get(explicit, explicit)
        shape = self.attrs.get("shape")
        if shape is None or shape == DEFAULT_SHAPE:
            if self.id in START_IDS:
                return START
            if self.id in EXIT_IDS:
                return EXIT
        return SHAPE_TO_TYPE.get(self.shape, AGENT)

    @property
    def label(self) -> str:
        return self.attrs.get("label") or self.id

    @property
    def prompt(self) -> str | None:
        value = self.attrs.get("prompt")
        return value if value else None


class Edge(_Attributed, msgspec.Struct, eq=False):
    """A transition from `source` to `target`; one per pair of a chained statement."""

    source: str
    target: str
    attrs: dict[str, str] = msgspec.field(default_factory=dict)
    line: int = 0
    column: int = 0
    positions: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    path: Path | None = None

    def _describe(self) -> str:
        return f"edge {self.source} -> {self.target}"

    def _location(self, key: str) -> tuple[Path | None, int | None, int | None]:
        line, column = self.positions.get(key, (self.line, self.column))
        return self.path, line, column

    @property
    def label(self) -> str | None:
        value = self.attrs.get("label")
        return value if value else None

    @property
    def condition(self) -> str | None:
        value = self.attrs.get("condition", "").strip()
        return value or None

    @property
    def weight(self) -> int:
        return self.get_int("weight", 0)

    @property
    def loop_restart(self) -> bool:
        return self.get_bool("loop_restart", False)

    @property
    def freeform(self) -> bool:
        return self.get_bool("freeform", False)


class Subgraph(msgspec.Struct, eq=False):
    """A `subgraph { }` block: kept for rendering clusters, flattened for execution."""

    name: str | None
    attrs: dict[str, str]
    node_ids: list[str]
    line: int
    column: int
    children: list[Subgraph] = msgspec.field(default_factory=list)
    positions: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)

    @property
    def label(self) -> str | None:
        return self.attrs.get("label") or None


class _EdgeIndex(msgspec.Struct, frozen=True):
    """Edge positions by source and by target, so a lookup costs what it returns."""

    edges: list[Edge]
    count: int
    by_source: dict[str, list[int]]
    by_target: dict[str, list[int]]

    @classmethod
    def build(cls, edges: list[Edge]) -> _EdgeIndex:
        by_source: dict[str, list[int]] = {}
        by_target: dict[str, list[int]] = {}
        for index, edge in enumerate(edges):
            by_source.setdefault(edge.source, []).append(index)
            by_target.setdefault(edge.target, []).append(index)
        return cls(edges, len(edges), by_source, by_target)


class Graph(_Attributed, msgspec.Struct, eq=False):
    """A whole workflow file."""

    name: str
    attrs: dict[str, str] = msgspec.field(default_factory=dict)
    nodes: dict[str, Node] = msgspec.field(default_factory=dict)
    edges: list[Edge] = msgspec.field(default_factory=list)
    path: Path | None = None
    source: str = ""
    positions: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    line: int = 1
    column: int = 1
    subgraphs: list[Subgraph] = msgspec.field(default_factory=list)
    # Where the files this workflow names come from; None reads them from disk beside
    # `path` (see workflow/paths.py).
    origin: Origin | None = None
    # The edge lookup `_edge_index` builds and keeps; never passed in.
    _index: _EdgeIndex | None = None

    def _describe(self) -> str:
        return f"graph {self.name!r}"

    def _location(self, key: str) -> tuple[Path | None, int | None, int | None]:
        line, column = self.positions.get(key, (self.line, self.column))
        return self.path, line, column

    @property
    def goal(self) -> str:
        return self.attrs.get("goal", "")

    def start_node(self) -> Node | None:
        for node in self.nodes.values():
            if node.handler_type == START:
                return node
        return None

    def exit_nodes(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.handler_type == EXIT]

    def join_node(self, fan_out: str) -> str | None:
        """Where the branches of the fan-out `fan_out` join: the nearest node that every
        branch reaches (a fan-in or any other stage), or None when they meet nowhere
        short of the exit.

        Each outgoing edge's target starts a branch; a branch goes on along every edge
        (whatever its condition) but not past a fan-in, the exit or the fan-out itself.
        Nearest: the fewest edges from the branch that is furthest from it, then the
        fewest in all, then the node declared first. A branch's own target is not a
        candidate: it runs in its branch.
        """
        targets = [edge.target for edge in self.outgoing(fan_out)]
        if not targets:
            return None
        reached: list[dict[str, int]] = []
        for target in targets:
            distance: dict[str, int] = {}
            frontier, steps = [target], 0
            seen = {target}
            while frontier:
                steps += 1
                following = []
                for node_id in frontier:
                    node = self.nodes.get(node_id)
                    if node is None or node.handler_type in (FAN_IN, EXIT):
                        continue  # a branch stops there
                    for edge in self.outgoing(node_id):
                        if edge.target in seen or edge.target == fan_out:
                            continue
                        seen.add(edge.target)
                        distance[edge.target] = steps
                        following.append(edge.target)
                frontier = following
            reached.append(distance)
        order = {node_id: index for index, node_id in enumerate(self.nodes)}
        common = [
            node_id
            for node_id in reached[0]
            if all(node_id in distance for distance in reached[1:])
            and node_id in self.nodes
            and self.nodes[node_id].handler_type != EXIT
        ]
        if not common:
            return None
        return min(
            common,
            key=lambda node_id: (
                max(distance[node_id] for distance in reached),
                sum(distance[node_id] for distance in reached),
                order[node_id],
            ),
        )

    def outgoing(self, node_id: str) -> list[Edge]:
        """Edges leaving `node_id`, in file order."""
        return [self.edges[index] for index in self._edge_index().by_source.get(node_id, ())]

    def incoming(self, node_id: str) -> list[Edge]:
        """Edges entering `node_id`, in file order."""
        return [self.edges[index] for index in self._edge_index().by_target.get(node_id, ())]

    def outgoing_indexes(self, node_id: str) -> list[int]:
        """Positions in `edges` of the edges leaving `node_id`, in file order."""
        return list(self._edge_index().by_source.get(node_id, ()))

    def _edge_index(self) -> _EdgeIndex:
        # Built once per edge list; graphs grow edges by appending (the parser, and
        # tests that build graphs in code), so a new length means a stale index.
        index = self._index
        if index is None or index.edges is not self.edges or index.count != len(self.edges):
            index = _EdgeIndex.build(self.edges)
            self._index = index
        return index
