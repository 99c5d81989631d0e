"""Lint rules: catch a broken workflow before a run spends time and tokens on it.

Each rule is a small function over the parsed graph that yields `Diagnostic`s with the
file position of the node, edge or attribute at fault. Errors stop `git fabro run`, and
so do typos (below); other warnings are printed and the run goes ahead.

Choices worth knowing:

- Edges create the nodes they name (as in Graphviz), so `edge_target_exists` can only
  fire for graphs built in code, not for parsed files.
- `all_conditional_edges` does not reject every node whose edges all carry conditions,
  only those where some run could find no edge to follow. It tries every outcome the
  node's handler can report, crossed with a handful of values per context key taken
  from the conditions themselves (and the values around numeric thresholds), and
  reports the first combination that matches no edge. `outcome=succeeded` beside
  `outcome!=succeeded` is therefore fine; `outcome=succeeded` beside `outcome=failed`
  on an agent is not, since an agent may also finish `partially_succeeded`.
- `orphan_custom_outcome` warns for a node that routes on an `outcome=` value no stage
  reports and has no unconditional edge. Fabro warns whatever the values, but for the
  standard success/failure pair that warning is noise on every run, teaching users to
  skip warnings: whether the values it names cover every outcome the node can report
  is `all_conditional_edges`' question, which it answers exactly (an error when not). `prompt_on_llm_nodes` accepts a label (it becomes the instruction), and
  `stylesheet_model_known` knows catalogue ids and aliases, nothing else.
- A few rules beyond the usual set: `attribute_value` (a typed attribute that does not
  parse, which would otherwise fail mid-run), `command_requires_script`,
  `script_template` (a template in a python script, where no substitution is safe, or
  in a here-document that expands nothing), `selection_valid` and `permissions_valid`.
- Warnings for typos, each with a "did you mean" from `fabro_git.suggest`:
  `implicit_node` (a node only an edge names, `test -> exti`), `unknown_attribute`
  (against the registry in workflow/attributes.py), `condition_typo` (`outcom=...`,
  `outcome=succeded`) and `dead_end` (a reachable stage with no way out). Those with a
  close known spelling (an attribute, shape, type or condition word) carry it as
  `Diagnostic.typo`, and `git fabro run` refuses them: a run that goes ahead ignores the
  attribute or makes the edge unconditional, and costs tokens without doing what was meant.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import PurePosixPath

import msgspec

from fabro_git.errors import WorkflowError
from fabro_git.suggest import close_names
from fabro_git.workflow import catalogue
from fabro_git.workflow.attributes import (
    EDGE_ATTRIBUTES,
    GRAPHVIZ_GRAPH,
    GRAPHVIZ_NODE,
    KNOWN,
    NODE_ATTRIBUTES,
)
from fabro_git.workflow.conditions import (
    OUTCOME_ALIASES,
    STANDARD_OUTCOMES,
    Condition,
    ConditionError,
    normalize_outcome,
    parse_condition,
)
from fabro_git.workflow.model import (
    AGENT,
    COMMAND,
    EXIT,
    HANDLER_TYPES,
    HUMAN,
    LLM_TYPES,
    MANAGER_LOOP,
    PARALLEL,
    SHAPE_TO_TYPE,
    START,
    TYPE_ALIASES,
    WAIT,
    Edge,
    Graph,
    Node,
    collector_paused,
    node_id_problem,
    parse_bool,
    parse_duration,
)
from fabro_git.workflow.paths import (
    CHILD_SOURCE,
    CHILD_WORKFLOW,
    Origin,
    PathRefused,
    child_graph,
    named_paths,
    origin_for,
)
from fabro_git.workflow.stylesheet import StylesheetError, parse_stylesheet
from fabro_git.workflow.templates import (
    TemplateError,
    is_file_ref,
    is_known_variable,
    render_script,
    template_references,
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
NODE_DURATIONS: tuple[str, ...] = ("timeout", "duration", "manager.poll_interval")
EDGE_INTS: tuple[str, ...] = ("weight",)
EDGE_BOOLS: tuple[str, ...] = ("loop_restart", "freeform")
GRAPH_INTS: tuple[str, ...] = (
    "default_max_retries",
    "default_max_retry",
    "max_node_visits",
    "loop_restart_signature_limit",
)
GRAPH_DURATIONS: tuple[str, ...] = ("stall_timeout",)

# Combinations tried by all_conditional_edges before it gives up proving coverage.
_MAX_CASES = 4096

_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# Bare condition keys the engine sets itself; any other bare key reads the context.
_ROUTING_KEYS: tuple[str, ...] = ("outcome", "preferred_label")


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


class _Check:
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


Rule = Callable[[_Check], Iterator[Diagnostic]]


# Structure ------------------------------------------------------------------------------


def _some_names(nodes: list[Node], shown: int = 5) -> str:
    """`'a', 'b', 'c'`, or the first few and how many more: one message per extra node
    must not list them all."""
    names = ", ".join(repr(n.id) for n in nodes[:shown])
    return names if len(nodes) <= shown else f"{names} and {len(nodes) - shown} more"


def _start_node(check: _Check) -> Iterator[Diagnostic]:
    starts = [n for n in check.graph.nodes.values() if n.handler_type == START]
    if not starts:
        yield check.on_graph(
            "start_node",
            ERROR,
            "no start node: add one, e.g. start [shape=Mdiamond]",
            check.graph_pos(),
        )
    names = _some_names(starts)
    for extra in starts[1:]:
        yield check.on_node(
            "start_node",
            ERROR,
            f"more than one start node ({names}): a workflow has exactly one",
            extra,
            check.node_pos(extra),
        )


def _terminal_node(check: _Check) -> Iterator[Diagnostic]:
    exits = [n for n in check.graph.nodes.values() if n.handler_type == EXIT]
    if not exits:
        yield check.on_graph(
            "terminal_node",
            ERROR,
            "no exit node: add one, e.g. exit [shape=Msquare]",
            check.graph_pos(),
        )
    names = _some_names(exits)
    for extra in exits[1:]:
        yield check.on_node(
            "terminal_node",
            ERROR,
            f"more than one exit node ({names}): route every path to a single exit",
            extra,
            check.node_pos(extra),
        )


def _start_no_incoming(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.handler_type != START:
            continue
        for edge in check.graph.incoming(node.id):
            yield check.on_edge(
                "start_no_incoming",
                ERROR,
                f"edge {edge.source} -> {edge.target} enters the start node; nothing may "
                "lead back to start",
                edge,
                check.edge_pos(edge),
            )


def _exit_no_outgoing(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.handler_type != EXIT:
            continue
        for edge in check.graph.outgoing(node.id):
            yield check.on_edge(
                "exit_no_outgoing",
                ERROR,
                f"edge {edge.source} -> {edge.target} leaves the exit node; a run ends at exit",
                edge,
                check.edge_pos(edge),
            )


def _edge_target_exists(check: _Check) -> Iterator[Diagnostic]:
    for edge in check.graph.edges:
        for end in (edge.source, edge.target):
            if end not in check.graph.nodes:
                yield check.on_edge(
                    "edge_target_exists",
                    ERROR,
                    f"edge {edge.source} -> {edge.target} names {end!r}, which is not a node",
                    edge,
                    check.edge_pos(edge),
                )


def _reachability(check: _Check) -> Iterator[Diagnostic]:
    reachable = check.reachable()
    for node in check.graph.nodes.values():
        if node.id not in reachable:
            yield check.on_node(
                "reachability",
                WARNING,
                f"node {node.id!r} cannot be reached from the start node",
                node,
                check.node_pos(node),
            )


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    """`; did you mean 'exit'?`, or nothing when no known name is close."""
    close = close_names(word, known)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(name) for name in close) + "?"


def _where(check: _Check, line: int, column: int) -> str:
    """`path:line:col` of a place in this workflow, as compilers and editors write it."""
    path = check.graph.path
    return f"{path}:{line}:{column}" if path is not None else f"line {line}, column {column}"


def _implicit_node(check: _Check) -> Iterator[Diagnostic]:
    """A node that only an edge names is usually a misspelt target: `test -> exti`
    makes an agent called `exti` rather than reaching `exit`."""
    graph = check.graph
    implicit = check.implicit_nodes()
    if not implicit:
        return
    known = [node_id for node_id in graph.nodes if node_id not in implicit]
    for node in implicit.values():
        naming = graph.incoming(node.id) + graph.outgoing(node.id)
        edge = min(naming, key=lambda e: (e.line, e.column), default=None)
        via = (
            f"edge {edge.source} -> {edge.target} at {_where(check, edge.line, edge.column)}"
            if edge is not None
            else "an edge"
        )
        handler = node.handler_type
        article = "an" if handler[:1] in "aeiou" else "a"
        suggestion = _did_you_mean(node.id, known)
        advice = suggestion or (
            f"; if it is meant to be a stage, declare it with its attributes, e.g. "
            f'{node.id} [prompt="..."]'
        )
        yield check.on_node(
            "implicit_node",
            WARNING,
            f"node {node.id!r} has no statement of its own: it exists only because {via} "
            f"names it, so it runs as {article} {handler} with no attributes of its own{advice}",
            node,
            check.node_pos(node),
        )


def _dead_end(check: _Check) -> Iterator[Diagnostic]:
    """A stage with no way out ends the run (or its parallel branch) there, short of
    the exit; usually a forgotten edge."""
    graph = check.graph
    exit_node = next((n for n in graph.nodes.values() if n.handler_type == EXIT), None)
    if exit_node is None or graph.start_node() is None:
        return  # a fragment, or a graph start_node/terminal_node already refuse
    sources = {edge.source for edge in graph.edges}
    ends = [node for node in graph.nodes.values() if node.id not in sources]
    if not ends:
        return
    reachable = check.reachable()
    implicit = check.implicit_nodes()
    for node in ends:
        if node.handler_type == EXIT or node.id in implicit or node.id not in reachable:
            continue  # implicit_node and reachability speak for the last two
        yield check.on_node(
            "dead_end",
            WARNING,
            f"node {node.id!r} has no outgoing edge, so a run that reaches it stops there "
            f"without reaching the exit; add an edge from it, e.g. {node.id} -> {exit_node.id}",
            node,
            check.node_pos(node),
        )


def _parallel_join(check: _Check) -> Iterator[Diagnostic]:
    """Branches of a fan-out that reach no node in common walk on, each on its own, to a
    fan-in or the exit: whatever they pass runs once per branch, and no branch's files
    are merged unless a fan-in is on the way."""
    graph = check.graph
    for node in graph.nodes.values():
        if node.handler_type != "parallel" or len(graph.outgoing(node.id)) < 2:
            continue
        if graph.join_node(node.id) is not None:
            continue
        yield check.on_node(
            "parallel_join",
            WARNING,
            f"the branches of fan-out {node.id!r} never reach a node in common short of the "
            "exit, so each walks on alone and nothing merges their work; lead them to one "
            "node, e.g. a fan-in (shape=tripleoctagon), where the run goes on once",
            node,
            check.node_pos(node),
        )


def _node_id_valid(check: _Check) -> Iterator[Diagnostic]:
    # Ids name directories and refs: two that differ only in case are one directory
    # and one loose ref on a case-insensitive file system (macOS, Windows).
    by_folded: dict[str, Node] = {}
    for node in check.graph.nodes.values():
        problem = node_id_problem(node.id)
        if problem is None:
            first = by_folded.setdefault(node.id.casefold(), node)
            if first is node:
                continue
            problem = (
                f"it differs from {first.id!r} (line {first.line}) only in case, and the two "
                "would share a directory and a ref on a case-insensitive file system"
            )
        shown = node.id if len(node.id) <= 60 else node.id[:57] + "..."
        yield check.on_node(
            "node_id_valid",
            ERROR,
            f"node id {shown!r} cannot be used: {problem}; pick another id and put display "
            'text in label="..."',
            node,
            check.node_pos(node),
        )


def _unknown_attribute(check: _Check) -> Iterator[Diagnostic]:
    """An attribute that nothing reads: a typo (`scrpt=`), or one written on the wrong
    kind of statement (`condition` on a node). The known names are in
    workflow/attributes.py."""
    graph = check.graph
    # A graph attribute is mirrored into the context as `graph.NAME`, so a condition
    # that reads it makes a custom one meaningful.
    read_by_conditions: set[str] = set()
    for condition in check.conditions.values():
        for clause in condition.clauses():
            key = clause.key.removeprefix("context.")
            if key.startswith("graph."):
                read_by_conditions.add(key[len("graph.") :])
    reported: set[tuple[str, int, int]] = set()

    def problem(
        kind: str, key: str, pos: tuple[int | None, int | None]
    ) -> tuple[str, tuple[str, str] | None] | None:
        """Why nothing reads `key` here, and the (key, meant) typo when one is close."""
        if kind == "graph" and key in read_by_conditions:
            return None
        at = (key, pos[0] or 0, pos[1] or 0)
        if at in reported:  # a `node [...]` default reaches every node after it
            return None
        reported.add(at)
        places = {"node": "nodes", "edge": "edges", "graph": "the graph"}
        elsewhere = [places[other] for other in places if key in KNOWN[other]]
        if elsewhere:
            return f"it is read on {' and '.join(elsewhere)}, not on {places[kind]}", None
        close = close_names(key, KNOWN[kind])
        if close:
            return "nothing reads it" + _did_you_mean(key, KNOWN[kind]), (key, close[0])
        for other in places:
            close = close_names(key, KNOWN[other])
            if close:
                where = places[other].removesuffix("s").removeprefix("the ")
                suggestion = f"; did you mean {close[0]!r}, a {where} attribute?"
                return "nothing reads it" + suggestion, (key, close[0])
        return "nothing reads it", None

    for key in graph.attrs:
        if key in KNOWN["graph"]:
            continue
        pos = check.key_position(check.graph_pos(key), key)
        found = problem("graph", key, pos)
        if found is not None:
            why, typo = found
            yield check.on_graph(
                "unknown_attribute", WARNING, f"unknown graph attribute {key!r}: {why}", pos, typo
            )
    # A subgraph's attributes are Graphviz's (a cluster's label, style, rank), and its
    # label also names a stylesheet class.
    pending = list(graph.subgraphs)
    while pending:
        subgraph = pending.pop()
        pending.extend(subgraph.children)
        for key in subgraph.attrs:
            if key in GRAPHVIZ_GRAPH:
                continue
            where = subgraph.positions.get(key, (subgraph.line, subgraph.column))
            pos = check.key_position(where, key)
            suggestion = _did_you_mean(key, GRAPHVIZ_GRAPH)
            name = f"subgraph {subgraph.name}" if subgraph.name else "subgraph"
            yield check.on_graph(
                "unknown_attribute",
                WARNING,
                f"{name}: unknown attribute {key!r}: only Graphviz reads a subgraph's "
                f"attributes{suggestion or ''}",
                pos,
            )
    for node in graph.nodes.values():
        for key in node.attrs:
            if key in NODE_ATTRIBUTES or key in node.styled:
                continue
            pos = check.key_position(check.node_pos(node, key), key)
            found = problem("node", key, pos)
            if found is not None:
                why, typo = found
                yield check.on_node(
                    "unknown_attribute",
                    WARNING,
                    f"node {node.id!r}: unknown attribute {key!r}: {why}",
                    node,
                    pos,
                    typo,
                )
    for edge in graph.edges:
        for key in edge.attrs:
            if key in EDGE_ATTRIBUTES:
                continue
            pos = check.key_position(check.edge_pos(edge, key), key)
            found = problem("edge", key, pos)
            if found is not None:
                why, typo = found
                yield check.on_edge(
                    "unknown_attribute",
                    WARNING,
                    f"edge {edge.source} -> {edge.target}: unknown attribute {key!r}: {why}",
                    edge,
                    pos,
                    typo,
                )


def _condition_typo(check: _Check) -> Iterator[Diagnostic]:
    """A condition that can never be true as written because of a slip of the keyboard:
    a bare key one or two edits from `outcome` or `preferred_label` (a bare key reads
    the context, where nothing sets `outcom`), or an outcome value close to one a stage
    reports (`outcome=succeded`)."""
    graph = check.graph
    outcome_names = (*STANDARD_OUTCOMES, *OUTCOME_ALIASES)
    for index, condition in sorted(check.conditions.items()):
        edge = graph.edges[index]
        for clause in condition.clauses():
            key = clause.key
            message = None
            typo: tuple[str, str] | None = None
            if key == "outcome":
                if clause.op not in ("=", "!=") or clause.value in outcome_names:
                    continue
                close = close_names(clause.value, STANDARD_OUTCOMES)
                if close:
                    message = (
                        f"no stage reports outcome {clause.value!r}, so this clause is "
                        f"{'never' if clause.op == '=' else 'always'} true"
                        f"{_did_you_mean(clause.value, close)}"
                    )
                    typo = (clause.value, close[0])
            elif not key.startswith("context.") and key not in _ROUTING_KEYS:
                close = close_names(key, _ROUTING_KEYS)
                # An agent may set any key through context_updates; one its prompt names
                # is meant, not a slip.
                if close and key not in check.words():
                    message = (
                        f"{key!r} is a context key that no stage sets, so it reads as empty"
                        f"{_did_you_mean(key, close)}"
                    )
                    typo = (key, close[0])
            if message is None:
                continue
            pos = check.value_position(edge.positions.get("condition"), clause.offset)
            yield check.on_edge(
                "condition_typo",
                WARNING,
                f"edge {edge.source} -> {edge.target}: condition {condition.text!r}: {message}",
                edge,
                pos,
                typo,
            )


# Expressions -----------------------------------------------------------------------------


def _condition_syntax(check: _Check) -> Iterator[Diagnostic]:
    for index in sorted(check.bad_conditions):
        edge = check.graph.edges[index]
        text = edge.condition or ""
        try:
            parse_condition(text)
        except ConditionError as err:
            pos = check.value_position(edge.positions.get("condition"), err.offset)
            yield check.on_edge(
                "condition_syntax",
                ERROR,
                f"edge {edge.source} -> {edge.target}: bad condition {text!r}: {err.detail}",
                edge,
                pos,
            )


def _stylesheet_syntax(check: _Check) -> Iterator[Diagnostic]:
    text = check.graph.attrs.get("model_stylesheet", "")
    if not text.strip():
        return
    try:
        parse_stylesheet(text)
    except StylesheetError as err:
        pos = check.value_position(check.graph.positions.get("model_stylesheet"), err.offset)
        yield check.on_graph("stylesheet_syntax", ERROR, f"model_stylesheet: {err.detail}", pos)


def _template_variable(check: _Check) -> Iterator[Diagnostic]:
    graph = check.graph
    origin = origin_for(graph)
    seen: set[tuple[int | None, int | None, str]] = set()

    def scan(
        text: str,
        where: tuple[int, int] | None,
        fallback: tuple[int | None, int | None],
        owner: str,
        in_file: bool = False,
    ) -> Iterator[tuple[tuple[int | None, int | None], str]]:
        def position(offset: int) -> tuple[int | None, int | None]:
            if where is None:
                return fallback
            # A reference inside an @file prompt is reported at the attribute.
            return check.value_position(where, 0 if in_file else offset)

        try:
            refs = template_references(text)
        except TemplateError as err:
            yield position(err.offset), f"{owner}: {err.message}"
            return
        for name, offset in refs:
            if name.startswith("%"):
                message = (
                    f"{owner}: unsupported template tag {{% {name[1:]} %}}; only {{% raw %}} exists"
                )
            elif is_known_variable(name):
                continue
            else:
                message = (
                    f"{owner}: unknown template variable {{{{ {name} }}}}; "
                    "only {{ goal }} and {{ inputs.NAME }} exist"
                )
            pos = position(offset)
            key = (pos[0], pos[1], message.split(": ", 1)[1])
            if key in seen:
                continue
            seen.add(key)
            yield pos, message

    for key, value in graph.attrs.items():
        if key == "model_stylesheet":
            continue
        for pos, message in scan(
            value, graph.positions.get(key), check.graph_pos(), f"graph attribute {key}"
        ):
            yield check.on_graph("template_variable", ERROR, message, pos)
    for node in graph.nodes.values():
        for key, value in node.attrs.items():
            if key in node.styled:
                continue
            for pos, message in scan(
                value, node.positions.get(key), check.node_pos(node), f"node {node.id!r} {key}"
            ):
                yield check.on_node("template_variable", ERROR, message, node, pos)
        prompt_file = _prompt_file(origin, node) if is_file_ref(node.prompt or "") else None
        if prompt_file is not None:
            name, content = prompt_file
            owner = f"node {node.id!r} prompt file {PurePosixPath(name).name}"
            where = node.positions.get("prompt")
            for pos, message in scan(content, where, check.node_pos(node), owner, in_file=True):
                yield check.on_node("template_variable", ERROR, message, node, pos)
    for edge in graph.edges:
        for key, value in edge.attrs.items():
            owner = f"edge {edge.source} -> {edge.target} {key}"
            for pos, message in scan(value, edge.positions.get(key), check.edge_pos(edge), owner):
                yield check.on_edge("template_variable", ERROR, message, edge, pos)


def _attribute_value(check: _Check) -> Iterator[Diagnostic]:
    def bad(value: str, kind: str) -> bool:
        text = value.strip()
        if not text:
            return False
        if kind == "int":
            try:
                int(text, 10)
            except ValueError:
                return True
            return False
        if kind == "bool":
            return parse_bool(text) is None
        return parse_duration(text) is None

    expected = {
        "int": "an integer",
        "bool": "true or false",
        "duration": "a duration such as 250ms, 30s, 15m, 2h or 1d",
    }
    graph = check.graph
    for kind, keys in (("int", GRAPH_INTS), ("duration", GRAPH_DURATIONS)):
        for key in keys:
            value = graph.attrs.get(key)
            if value is not None and bad(value, kind):
                yield check.on_graph(
                    "attribute_value",
                    ERROR,
                    f"graph attribute {key}={value!r} is not {expected[kind]}",
                    check.graph_pos(key),
                )
    for node in graph.nodes.values():
        for kind, keys in (("int", NODE_INTS), ("bool", NODE_BOOLS), ("duration", NODE_DURATIONS)):
            for key in keys:
                value = node.attrs.get(key)
                if value is not None and bad(value, kind):
                    yield check.on_node(
                        "attribute_value",
                        ERROR,
                        f"node {node.id!r}: {key}={value!r} is not {expected[kind]}",
                        node,
                        check.node_pos(node, key),
                    )
    for edge in graph.edges:
        for kind, keys in (("int", EDGE_INTS), ("bool", EDGE_BOOLS)):
            for key in keys:
                value = edge.attrs.get(key)
                if value is not None and bad(value, kind):
                    yield check.on_edge(
                        "attribute_value",
                        ERROR,
                        f"edge {edge.source} -> {edge.target}: {key}={value!r} is not {expected[kind]}",
                        edge,
                        check.edge_pos(edge, key),
                    )


# Routing ---------------------------------------------------------------------------------


def _possible_outcomes(node: Node) -> list[str]:
    handler = node.handler_type
    if handler in (COMMAND, HUMAN):
        outcomes = ["succeeded", "failed"]
    elif handler in (START, EXIT, WAIT):
        outcomes = ["succeeded"]
    elif handler == PARALLEL:
        outcomes = ["succeeded", "partially_succeeded", "failed"]
    else:
        # Agents, prompts and everything else; a conditional node routes on the
        # outcome it was handed, which may be any of them.
        outcomes = list(STANDARD_OUTCOMES)
    if _flag(node, "allow_partial") and "partially_succeeded" not in outcomes:
        outcomes.append("partially_succeeded")
    if _flag(node, "auto_status"):
        outcomes = ["succeeded"] + (["skipped"] if "skipped" in outcomes else [])
    return outcomes


def _flag(node: Node, key: str) -> bool:
    return parse_bool(node.attrs.get(key, "")) is True


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _format_number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _candidate_values(conditions: list[Condition]) -> dict[str, list[str]]:
    """For each key the conditions read, values that exercise each comparison."""
    texts: dict[str, set[str]] = {}
    numbers: dict[str, set[float]] = {}
    for condition in conditions:
        for clause in condition.clauses():
            if clause.key == "outcome":
                continue
            key = clause.key
            if key.startswith("context."):
                key = key[len("context.") :]
            values = texts.setdefault(key, {""})
            if clause.op is None:
                values.add("true")
                continue
            number = (
                _number(clause.value) if clause.op in ("=", "!=", ">", "<", ">=", "<=") else None
            )
            if number is not None:
                numbers.setdefault(key, set()).add(number)
            values.add(clause.value)
    out: dict[str, list[str]] = {}
    for key, values in texts.items():
        points = sorted(numbers.get(key, set()))
        extra: set[float] = set()
        for low, high in itertools.pairwise(points):
            extra.add((low + high) / 2)
        if points:
            extra.add(points[0] - 1)
            extra.add(points[-1] + 1)
        values |= {_format_number(v) for v in extra}
        out[key] = sorted(values)
    return out


def _uncovered_case(node: Node, conditions: list[Condition]) -> str | None:
    """A description of a situation in which no condition holds, or None."""
    candidates = _candidate_values(conditions)
    preferred: set[str] = {""}
    for condition in conditions:
        for clause in condition.clauses():
            if clause.key == "preferred_label" and clause.op is not None:
                preferred.add(clause.value)
    candidates.pop("preferred_label", None)
    keys = sorted(candidates)
    outcomes = _possible_outcomes(node)
    total = len(outcomes) * len(preferred)
    for key in keys:
        total *= len(candidates[key])
    if total > _MAX_CASES:
        return "(too many combinations to prove that some edge always matches)"
    for outcome in outcomes:
        for label in sorted(preferred):
            for combo in itertools.product(*(candidates[key] for key in keys)):
                context = dict(zip(keys, combo, strict=True))
                if any(
                    c.evaluate(outcome=outcome, preferred_label=label, context=context)
                    for c in conditions
                ):
                    continue
                parts = [f"outcome={outcome}"]
                if label:
                    parts.append(f"preferred_label={label!r}")
                parts += [f"{k}={v!r}" for k, v in context.items()]
                return "when " + ", ".join(parts)
    return None


def _all_conditional_edges(check: _Check) -> Iterator[Diagnostic]:
    graph = check.graph
    for node_id, node in graph.nodes.items():
        indexes = graph.outgoing_indexes(node_id)
        if not indexes or node.handler_type == EXIT:
            continue
        if any(index not in check.conditions for index in indexes):
            # An unconditional edge is a fallback; a bad condition is reported elsewhere.
            continue
        case = _uncovered_case(node, [check.conditions[index] for index in indexes])
        if case is None:
            continue
        yield check.on_node(
            "all_conditional_edges",
            ERROR,
            f"every edge out of {node_id!r} has a condition and none matches {case}; "
            "add an edge without a condition as the fallback",
            node,
            check.node_pos(node),
        )


def _orphan_custom_outcome(check: _Check) -> Iterator[Diagnostic]:
    """A node that routes on an `outcome=` value no stage reports, with no unconditional
    edge: the run will never take that edge, and may find no edge at all."""
    graph = check.graph
    known = set(STANDARD_OUTCOMES) | {"retry"}
    for node in graph.nodes.values():
        indexes = graph.outgoing_indexes(node.id)
        if not indexes or any(graph.edges[i].condition is None for i in indexes):
            continue
        tested: list[tuple[Edge, int, str]] = []
        for index in indexes:
            condition = check.conditions.get(index)
            if condition is None:
                continue
            for clause in condition.clauses():
                if clause.key == "outcome" and clause.op == "=":
                    tested.append((graph.edges[index], clause.offset, clause.value))
        if not tested:
            continue
        custom = [(e, o, v) for e, o, v in tested if normalize_outcome(v) not in known]
        if not custom:
            continue
        edge, offset, _value = custom[0]
        names = sorted({v for _e, _o, v in custom})
        yield check.on_node(
            "orphan_custom_outcome",
            WARNING,
            f"{node.id!r} routes on outcome= conditions but has no unconditional edge to "
            f"fall back on when none matches; no stage reports {', '.join(map(repr, names))}",
            node,
            check.value_position(edge.positions.get("condition"), offset),
        )


def _freeform_edge_count(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.handler_type != HUMAN:
            continue
        freeform = [
            e
            for e in check.graph.outgoing(node.id)
            if parse_bool(e.attrs.get("freeform", "")) is True
        ]
        for edge in freeform[1:]:
            yield check.on_edge(
                "freeform_edge_count",
                ERROR,
                f"human gate {node.id!r} has {len(freeform)} freeform edges; it may have at most one",
                edge,
                check.edge_pos(edge, "freeform"),
            )


def _random_selection_no_conditions(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.attrs.get("selection", "").strip() != "random":
            continue
        for edge in check.graph.outgoing(node.id):
            if edge.condition is not None:
                yield check.on_edge(
                    "random_selection_no_conditions",
                    ERROR,
                    f"node {node.id!r} picks its edge at random, so edge {edge.source} -> "
                    f"{edge.target} cannot have a condition; use weights instead",
                    edge,
                    check.edge_pos(edge, "condition"),
                )


def _selection_valid(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        value = node.attrs.get("selection")
        if value is not None and value.strip() not in SELECTION_MODES:
            yield check.on_node(
                "selection_valid",
                WARNING,
                f"node {node.id!r}: selection={value!r} is not one of {', '.join(SELECTION_MODES)}",
                node,
                check.node_pos(node, "selection"),
            )


def _permissions_valid(check: _Check) -> Iterator[Diagnostic]:
    from fabro_git.config.run_config import PERMISSION_LEVELS as LEVELS
    from fabro_git.config.run_config import permission_level as check_level

    for node in check.graph.nodes.values():
        value = node.attrs.get("permissions")
        if value is not None and check_level(value.strip()) is None:
            yield check.on_node(
                "permissions_valid",
                ERROR,
                f"node {node.id!r}: permissions={value!r} is no permission level; "
                f"use one of {', '.join(LEVELS)}",
                node,
                check.node_pos(node, "permissions"),
            )


# Nodes -----------------------------------------------------------------------------------


def _type_known(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        explicit = node.explicit_type
        if explicit is not None:
            if explicit not in HANDLER_TYPES and explicit not in TYPE_ALIASES:
                types = [*HANDLER_TYPES, *TYPE_ALIASES]
                close = close_names(explicit, types)
                yield check.on_node(
                    "type_known",
                    WARNING,
                    f"node {node.id!r}: unknown type {explicit!r}"
                    f"{_did_you_mean(explicit, types) or ';'} known types "
                    f"are {', '.join(sorted(HANDLER_TYPES))}",
                    node,
                    check.node_pos(node, "type"),
                    (explicit, close[0]) if close else None,
                )
            continue
        shape = node.attrs.get("shape")
        if shape is not None and shape not in SHAPE_TO_TYPE:
            close = close_names(shape, SHAPE_TO_TYPE)
            yield check.on_node(
                "type_known",
                WARNING,
                f"node {node.id!r}: shape {shape!r} has no handler, so it runs as an agent"
                f"{_did_you_mean(shape, SHAPE_TO_TYPE) or ';'} known shapes are "
                f"{', '.join(sorted(SHAPE_TO_TYPE))}",
                node,
                check.node_pos(node, "shape"),
                (shape, close[0]) if close else None,
            )


def _fidelity_valid(check: _Check) -> Iterator[Diagnostic]:
    allowed = ", ".join(FIDELITY_MODES)
    value = check.graph.attrs.get("default_fidelity")
    if value is not None and value.strip() and value.strip() not in FIDELITY_MODES:
        yield check.on_graph(
            "fidelity_valid",
            WARNING,
            f"default_fidelity={value!r} is not one of {allowed}",
            check.graph_pos("default_fidelity"),
        )
    for node in check.graph.nodes.values():
        value = node.attrs.get("fidelity")
        if value is not None and value.strip() not in FIDELITY_MODES:
            yield check.on_node(
                "fidelity_valid",
                WARNING,
                f"node {node.id!r}: fidelity={value!r} is not one of {allowed}",
                node,
                check.node_pos(node, "fidelity"),
            )
    for edge in check.graph.edges:
        value = edge.attrs.get("fidelity")
        if value is not None and value.strip() not in FIDELITY_MODES:
            yield check.on_edge(
                "fidelity_valid",
                WARNING,
                f"edge {edge.source} -> {edge.target}: fidelity={value!r} is not one of {allowed}",
                edge,
                check.edge_pos(edge, "fidelity"),
            )


def _retry_target_exists(check: _Check) -> Iterator[Diagnostic]:
    graph = check.graph
    for key in ("retry_target", "fallback_retry_target"):
        value = graph.attrs.get(key, "").strip()
        if value and value not in graph.nodes:
            yield check.on_graph(
                "retry_target_exists",
                WARNING,
                f"graph {key}={value!r} names no node{_did_you_mean(value, graph.nodes)}",
                check.graph_pos(key),
            )
    for node in graph.nodes.values():
        for key in ("retry_target", "fallback_retry_target"):
            value = node.attrs.get(key, "").strip()
            if value and value not in graph.nodes:
                yield check.on_node(
                    "retry_target_exists",
                    WARNING,
                    f"node {node.id!r}: {key}={value!r} names no node"
                    f"{_did_you_mean(value, graph.nodes)}",
                    node,
                    check.node_pos(node, key),
                )


def _goal_gate_has_retry(check: _Check) -> Iterator[Diagnostic]:
    graph = check.graph
    keys = ("retry_target", "fallback_retry_target")
    graph_level = any(graph.attrs.get(key, "").strip() for key in keys)
    for node in graph.nodes.values():
        if not _flag(node, "goal_gate"):
            continue
        if graph_level or any(node.attrs.get(key, "").strip() for key in keys):
            continue
        yield check.on_node(
            "goal_gate_has_retry",
            WARNING,
            f"goal gate {node.id!r} has no retry_target (on the node or the graph), so an "
            "unmet gate fails the run instead of looping back",
            node,
            check.node_pos(node, "goal_gate"),
        )


def _prompt_on_llm_nodes(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.handler_type not in LLM_TYPES or node.prompt is not None:
            continue
        if (node.attrs.get("label") or "").strip():
            continue  # the label is the instruction, as in Fabro
        kind = "agent" if node.handler_type == AGENT else "prompt"
        yield check.on_node(
            "prompt_on_llm_nodes",
            WARNING,
            f"{kind} node {node.id!r} has neither a prompt nor a label, so its id "
            f"{node.id!r} will be sent as the whole instruction",
            node,
            check.node_pos(node),
        )


def _command_requires_script(check: _Check) -> Iterator[Diagnostic]:
    for node in check.graph.nodes.values():
        if node.handler_type != COMMAND:
            continue
        if (node.attrs.get("script") or node.attrs.get("tool_command") or "").strip():
            continue
        yield check.on_node(
            "command_requires_script",
            ERROR,
            f'command node {node.id!r} has no script="..." to run',
            node,
            check.node_pos(node),
        )


def _script_template(check: _Check) -> Iterator[Diagnostic]:
    """A template a script cannot take: any in a python script, where a value would be
    pasted into code, or one in a here-document that expands nothing."""
    for node in check.graph.nodes.values():
        language = (node.attrs.get("language") or "shell").strip().lower()
        for key in ("script", "tool_command"):
            text = node.attrs.get(key) or ""
            if "{{" not in text:
                continue
            try:
                refs = template_references(text, legacy_goal=False)
                if not all(is_known_variable(name) for name, _offset in refs):
                    continue  # template_variable reports it
                inputs = {name[len("inputs.") :] for name, _offset in refs if name != "goal"}
                render_script(text, inputs=inputs, language=language)
            except TemplateError as err:
                pos = check.value_position(node.positions.get(key), err.offset)
                if pos == (None, None):
                    pos = check.node_pos(node)
                message = f"node {node.id!r} {key}: {err.message}"
                yield check.on_node("script_template", ERROR, message, node, pos)


def _unresolved_file_ref(check: _Check) -> Iterator[Diagnostic]:
    origin = origin_for(check.graph)
    for named in named_paths(check.graph):
        if named.key != "prompt":
            continue
        try:
            relpath = origin.resolve(named.ref)
        except PathRefused:
            continue  # path_inside_repository reports it
        try:
            origin.read(relpath)
        except PathRefused as exc:
            yield check.on_node(
                "unresolved_file_ref",
                ERROR,
                f"node {named.node.id!r}: prompt file {'@' + named.ref!r} {exc.message}",
                named.node,
                check.node_pos(named.node, "prompt"),
            )


def _thread_id_requires_fidelity_full(check: _Check) -> Iterator[Diagnostic]:
    graph = check.graph
    default = graph.attrs.get("default_fidelity", "").strip()
    for node in graph.nodes.values():
        if not node.attrs.get("thread_id", "").strip():
            continue
        fidelity = node.attrs.get("fidelity", "").strip() or default or "compact"
        incoming = graph.incoming(node.id)
        if incoming and all(e.attrs.get("fidelity", "").strip() == "full" for e in incoming):
            fidelity = "full"  # every way in sets it
        if fidelity != "full":
            yield check.on_node(
                "thread_id_requires_fidelity_full",
                WARNING,
                f"node {node.id!r} sets thread_id but its fidelity is {fidelity!r}; a shared "
                'thread needs fidelity="full"',
                node,
                check.node_pos(node, "thread_id"),
            )
    for edge in graph.edges:
        if not edge.attrs.get("thread_id", "").strip():
            continue
        target = graph.nodes.get(edge.target)
        fidelity = (
            edge.attrs.get("fidelity", "").strip()
            or (target.attrs.get("fidelity", "").strip() if target else "")
            or default
            or "compact"
        )
        if fidelity != "full":
            yield check.on_edge(
                "thread_id_requires_fidelity_full",
                WARNING,
                f"edge {edge.source} -> {edge.target} sets thread_id but the fidelity into "
                f'{edge.target!r} is {fidelity!r}; a shared thread needs fidelity="full"',
                edge,
                check.edge_pos(edge, "thread_id"),
            )


def _model_known(check: _Check, model: str) -> bool:
    """A catalogue id or alias; anything else, `provider/model` included, is unknown
    (the provider goes in its own `provider` attribute)."""
    return model in check.known_models


def _stylesheet_model_known(check: _Check) -> Iterator[Diagnostic]:
    graph = check.graph
    text = graph.attrs.get("model_stylesheet", "")
    if text.strip():
        try:
            sheet = parse_stylesheet(text)
        except StylesheetError:
            sheet = None
        if sheet is not None:
            for rule in sheet.rules:
                for declaration in rule.declarations:
                    if declaration.property != "model" or _model_known(check, declaration.value):
                        continue
                    pos = check.value_position(
                        graph.positions.get("model_stylesheet"), declaration.offset
                    )
                    yield check.on_graph(
                        "stylesheet_model_known",
                        WARNING,
                        f"model_stylesheet: unknown model {declaration.value!r}"
                        f"{_did_you_mean(declaration.value, check.known_models)}",
                        pos,
                    )
    for node in graph.nodes.values():
        model = node.attrs.get("model")
        if model is None or "model" in node.styled or _model_known(check, model.strip()):
            continue
        key = "model" if "model" in node.positions else "llm_model"
        yield check.on_node(
            "stylesheet_model_known",
            WARNING,
            f"node {node.id!r}: unknown model {model!r}"
            f"{_did_you_mean(model.strip(), check.known_models)}",
            node,
            check.node_pos(node, key),
        )


# Paths a workflow names -------------------------------------------------------------------


def _prompt_file(origin: Origin, node: Node) -> tuple[str, str] | None:
    """(root-relative path, text) of the node's `@file` prompt, if it can be read."""
    prompt = node.prompt
    if prompt is None or not is_file_ref(prompt):
        return None
    try:
        relpath = origin.resolve(prompt.strip()[1:])
        return relpath, origin.read(relpath).decode("utf-8")
    except (PathRefused, UnicodeDecodeError):
        return None


def _path_inside_repository(check: _Check) -> Iterator[Diagnostic]:
    """Every path the workflow names stays inside its root (see workflow/paths.py)."""
    origin = origin_for(check.graph)
    for named in named_paths(check.graph):
        try:
            origin.resolve(named.ref)
        except PathRefused as exc:
            shown = (
                f"prompt file {'@' + named.ref!r}"
                if named.key == "prompt"
                else f"{named.key} {named.ref!r}"
            )
            yield check.on_node(
                "path_inside_repository",
                ERROR,
                f"node {named.node.id!r}: {shown} {exc.message}",
                named.node,
                check.node_pos(named.node, named.key),
            )


def _child_workflow(check: _Check) -> Iterator[Diagnostic]:
    """A sub-workflow's child must exist, parse and validate, and not include itself;
    its errors and warnings are reported at the parent's attribute, each naming its
    place in the child."""
    graph = check.graph
    origin = origin_for(graph)
    for node in graph.nodes.values():
        if node.handler_type != MANAGER_LOOP:
            continue
        key = CHILD_SOURCE if node.attrs.get(CHILD_SOURCE) else CHILD_WORKFLOW
        pos = check.node_pos(node, key)
        ref = (node.attrs.get(CHILD_WORKFLOW) or "").strip()
        if key == CHILD_WORKFLOW and ref:
            try:
                origin.resolve(ref)
            except PathRefused:
                continue  # path_inside_repository reports it
        try:
            child = child_graph(graph, node)
        except WorkflowError as err:
            yield check.on_node("child_workflow", ERROR, err.detail, node, pos)
            continue
        assert child.origin is not None
        memo = child.origin.memo
        memo_key = child.origin.relpath if key == CHILD_WORKFLOW else None
        if memo_key is not None and memo_key in memo:
            problems = memo[memo_key]
        else:
            problems = [
                d
                for d in validate(child, known_models=check.known_models)
                if d.severity in (ERROR, WARNING)
            ]
            if memo_key is not None:
                memo[memo_key] = problems
        what = f"child workflow {ref!r}" if key == CHILD_WORKFLOW else CHILD_SOURCE
        # An inline child's positions count from the start of the attribute's value.
        file = str(child.path) if key == CHILD_WORKFLOW else "inline"
        for problem in problems:
            where = ":".join(str(p) for p in (file, problem.line, problem.column) if p is not None)
            yield check.on_node(
                "child_workflow",
                problem.severity,
                f"node {node.id!r}: {what}: {where}: [{problem.rule}] {problem.message}",
                node,
                pos,
                problem.typo,
            )


RULES: tuple[Rule, ...] = (
    _start_node,
    _terminal_node,
    _start_no_incoming,
    _exit_no_outgoing,
    _edge_target_exists,
    _reachability,
    _implicit_node,
    _dead_end,
    _parallel_join,
    _node_id_valid,
    _condition_syntax,
    _stylesheet_syntax,
    _template_variable,
    _attribute_value,
    _unknown_attribute,
    _condition_typo,
    _all_conditional_edges,
    _orphan_custom_outcome,
    _freeform_edge_count,
    _random_selection_no_conditions,
    _selection_valid,
    _permissions_valid,
    _type_known,
    _fidelity_valid,
    _retry_target_exists,
    _goal_gate_has_retry,
    _prompt_on_llm_nodes,
    _command_requires_script,
    _script_template,
    _unresolved_file_ref,
    _thread_id_requires_fidelity_full,
    _stylesheet_model_known,
    _path_inside_repository,
    _child_workflow,
)

RULE_IDS: tuple[str, ...] = tuple(rule.__name__.lstrip("_") for rule in RULES)


def validate(
    graph: Graph, *, known_models: set[str] | frozenset[str] | None = None
) -> list[Diagnostic]:
    """Run every rule over `graph`; diagnostics come back in file order.

    `known_models` replaces the built-in catalogue for `stylesheet_model_known`.
    """
    out: list[Diagnostic] = []
    with collector_paused():
        check = _Check(graph, known_models)
        for rule in RULES:
            out.extend(rule(check))
    out.sort(key=lambda d: (d.line or 0, d.column or 0))
    return out
