"""What every lint rule of `fabro_git.workflow.validation` shares: the `Diagnostic` a
rule yields, the `Check` of one pass (parsed conditions, reachability, positions in the
source) and the typed-attribute tables."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

import msgspec

from fabro_git.suggest import close_names
from fabro_git.workflow import catalogue
from fabro_git.workflow.attributes import (
    GRAPHVIZ_NODE,
)
from fabro_git.workflow.conditions import (
    Condition,
    ConditionError,
    parse_condition,
)
from fabro_git.workflow.model import (
    EXIT,
    START,
    Edge,
    Graph,
    Node,
    parse_bool,
)
from fabro_git.workflow.paths import (
    Origin,
    PathRefused,
)
from fabro_git.workflow.templates import (
    is_file_ref,
)

ERROR = "error"


WARNING = "warning"


INFO = "info"


FIDELITY_MODES: tuple[str, ...] = (
    "full",
    "truncate",
    "compact",
    "summary:low",
    "summary:medium",
    "summary:high",
)


SELECTION_MODES: tuple[str, ...] = ("deterministic", "random")


# Attributes whose values must parse as a given type, by where they are written.
NODE_INTS: tuple[str, ...] = (
    "max_visits",
    "max_retries",
    "max_tokens",
    "max_parallel",
    "manager.max_cycles",
    "max_subagent_depth",
)


NODE_BOOLS: tuple[str, ...] = (
    "goal_gate",
    "auto_status",
    "allow_partial",
    "project_memory",
    "allow_push",
)


NODE_DURATIONS: tuple[str, ...] = ("timeout", "duration", "human.timeout", "manager.poll_interval")


EDGE_INTS: tuple[str, ...] = ("weight",)


EDGE_BOOLS: tuple[str, ...] = ("loop_restart", "freeform")


GRAPH_INTS: tuple[str, ...] = (
    "default_max_retries",
    "default_max_retry",
    "max_node_visits",
    "loop_restart_signature_limit",
)


GRAPH_DURATIONS: tuple[str, ...] = ("stall_timeout",)


_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


class Diagnostic(msgspec.Struct, frozen=True):
    rule: str
    severity: str  # "error", "warning" or "info"
    message: str
    node_id: str | None = None
    edge: tuple[str, str] | None = None
    line: int | None = None
    column: int | None = None
    # A slip of the keyboard with a close known spelling: (as written, meant). A run
    # refuses these (`--allow-typos` overrides): the workflow would run, but not as meant.
    typo: tuple[str, str] | None = None


def has_errors(diagnostics: Iterable[Diagnostic]) -> bool:
    return any(d.severity == ERROR for d in diagnostics)


def typos(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """The warnings that are slips of the keyboard, each with its close known spelling."""
    return [d for d in diagnostics if d.severity == WARNING and d.typo is not None]


class Check:
    """Shared state for one validation pass: parsed conditions, the stylesheet."""

    def __init__(self, graph: Graph, known_models: set[str] | frozenset[str] | None) -> None:
        self.graph = graph
        self.known_models = catalogue.KNOWN_MODELS if known_models is None else known_models
        self.conditions: dict[int, Condition] = {}
        self.bad_conditions: set[int] = set()
        self._lines: tuple[str, list[int]] | None = None
        self._reachable: set[str] | None = None
        self._implicit: dict[str, Node] | None = None
        self._words: set[str] | None = None
        for index, edge in enumerate(graph.edges):
            text = edge.condition
            if text is None:
                continue
            try:
                self.conditions[index] = parse_condition(text)
            except ConditionError:
                self.bad_conditions.add(index)

    # Facts several rules share ------------------------------------------------------

    def reachable(self) -> set[str]:
        """Ids of the nodes a walk from the start node can reach; every id when the
        graph has no start node (`start_node` reports that, and nothing is unreachable
        from a start that does not exist)."""
        if self._reachable is None:
            graph = self.graph
            starts = [n.id for n in graph.nodes.values() if n.handler_type == START]
            if not starts:
                self._reachable = set(graph.nodes)
                return self._reachable
            # An explicit stack, not recursion: a 100k-node chain is a 100k-deep walk.
            seen = set(starts)
            frontier = list(starts)
            while frontier:
                current = frontier.pop()
                for edge in graph.outgoing(current):
                    if edge.target not in seen:
                        seen.add(edge.target)
                        frontier.append(edge.target)
            self._reachable = seen
        return self._reachable

    def implicit_nodes(self) -> dict[str, Node]:
        """Nodes that exist only because an edge names them: no statement of their own
        and no attribute beyond Graphviz's drawing ones (a `node [fontname=...]`
        default must not hide a typo). An implicit start or exit is the usual
        shorthand, not a slip."""
        if self._implicit is None:
            self._implicit = {
                node.id: node
                for node in self.graph.nodes.values()
                if not node.declared
                and node.handler_type not in (START, EXIT)
                and all(key in GRAPHVIZ_NODE for key in node.attrs if key not in node.styled)
            }
        return self._implicit

    def words(self) -> set[str]:
        """Every name-like word in the nodes' attribute values: a context key a prompt
        tells an agent to set (in its `context_updates`) appears here."""
        if self._words is None:
            found: set[str] = set()
            for node in self.graph.nodes.values():
                for key, value in node.attrs.items():
                    if key not in node.styled:
                        found.update(_WORD_RE.findall(value))
            self._words = found
        return self._words

    # Positions --------------------------------------------------------------------

    def value_position(
        self, where: tuple[int, int] | None, offset: int = 0
    ) -> tuple[int | None, int | None]:
        """File position of character `offset` of the value written at `where`.

        Walks the source as the tokenizer does, so escapes and line continuations
        inside a quoted string map back to the right line and column.
        """
        if where is None:
            return None, None
        line, column = where
        source, line_starts = self._source_lines()
        if not 1 <= line <= len(line_starts):
            return line, column
        # Index of the token in the whole source.
        pos = line_starts[line - 1] + column - 1
        if pos >= len(source) or source[pos] != '"':
            return line, column + offset
        pos += 1
        column += 1
        remaining = offset
        while pos < len(source) and remaining > 0 and source[pos] != '"':
            if source[pos] == "\\" and source[pos + 1 : pos + 2] == "\n":
                pos += 2
                line += 1
                column = 1
                continue
            step = (
                2
                if source[pos] == "\\" and source[pos + 1 : pos + 2] in ('"', "\\", "n", "t")
                else 1
            )
            if source[pos] == "\n":
                line += 1
                column = 1
            else:
                column += step
            pos += step
            remaining -= 1
        return line, column

    def key_position(
        self, where: tuple[int | None, int | None], key: str
    ) -> tuple[int | None, int | None]:
        """Position of the name in `key=value`, given the value's position: the parser
        records where values start, and a misspelt name is better pointed at."""
        line, column = where
        if line is None or column is None:
            return where
        source, line_starts = self._source_lines()
        if not 1 <= line <= len(line_starts):
            return where
        start = line_starts[line - 1]
        before = source[start : start + column - 1].rstrip(" \t")
        if not before.endswith("="):
            return where
        before = before[:-1].rstrip(" \t")
        for written in (key, f'"{key}"'):
            if before.endswith(written):
                return line, len(before) - len(written) + 1
        return where

    def _source_lines(self) -> tuple[str, list[int]]:
        """The source as the tokenizer saw it and the offset of each line's start."""
        if self._lines is None:
            source = self.graph.source.replace("\r\n", "\n")
            starts = [0]
            starts.extend(match.end() for match in re.finditer("\n", source))
            self._lines = (source, starts)
        return self._lines

    def node_pos(self, node: Node, key: str | None = None) -> tuple[int | None, int | None]:
        if key is not None and key in node.positions:
            return node.positions[key]
        return node.line, node.column

    def edge_pos(self, edge: Edge, key: str | None = None) -> tuple[int | None, int | None]:
        if key is not None and key in edge.positions:
            return edge.positions[key]
        return edge.line, edge.column

    def graph_pos(self, key: str | None = None) -> tuple[int | None, int | None]:
        if key is not None and key in self.graph.positions:
            return self.graph.positions[key]
        return self.graph.line, self.graph.column

    # Diagnostics builders -----------------------------------------------------------

    @staticmethod
    def on_node(
        rule: str,
        severity: str,
        message: str,
        node: Node,
        pos: tuple[int | None, int | None],
        typo: tuple[str, str] | None = None,
    ) -> Diagnostic:
        return Diagnostic(rule, severity, message, node.id, None, pos[0], pos[1], typo)

    @staticmethod
    def on_edge(
        rule: str,
        severity: str,
        message: str,
        edge: Edge,
        pos: tuple[int | None, int | None],
        typo: tuple[str, str] | None = None,
    ) -> Diagnostic:
        edge_ends = (edge.source, edge.target)
        return Diagnostic(rule, severity, message, None, edge_ends, pos[0], pos[1], typo)

    @staticmethod
    def on_graph(
        rule: str,
        severity: str,
        message: str,
        pos: tuple[int | None, int | None],
        typo: tuple[str, str] | None = None,
    ) -> Diagnostic:
        return Diagnostic(rule, severity, message, None, None, pos[0], pos[1], typo)


Rule = Callable[[Check], Iterator[Diagnostic]]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`; did you mean 'exit'?`, or nothing when no known name is close."""
    close = close_names(word, known)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(name) for name in close) + "?"


def source_place(check: Check, line: int, column: int) -> str:
    """`path:line:col` of a place in this workflow, as compilers and editors write it."""
    path = check.graph.path
    return f"{path}:{line}:{column}" if path is not None else f"line {line}, column {column}"


def is_flag_set(node: Node, key: str) -> bool:
    return parse_bool(node.attrs.get(key, "")) is True


def prompt_file_of(origin: Origin, node: Node) -> tuple[str, str] | None:
    """(root-relative path, text) of the node's `@file` prompt, if it can be read."""
    prompt = node.prompt
    if prompt is None or not is_file_ref(prompt):
        return None
    try:
        relpath = origin.resolve(prompt.strip()[1:])
        return relpath, origin.read(relpath).decode("utf-8")
    except (PathRefused, UnicodeDecodeError):
        return None
