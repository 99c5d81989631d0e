"""Lint rules on the graph's shape: a start and an exit, reachable stages, a way out
of each loop, no dead ends, nodes only an edge names, joins, ids, and the files
nodes point at."""

from __future__ import annotations

from collections.abc import Iterator

from fabro_git.workflow.lint_check import (
    ERROR,
    WARNING,
    Check,
    Diagnostic,
    did_you_mean,
    source_place,
)
from fabro_git.workflow.model import (
    EXIT,
    START,
    Graph,
    Node,
    node_id_problem,
)
from fabro_git.workflow.paths import (
    PathRefused,
    named_paths,
    origin_for,
)


def _some_names(nodes: list[Node], shown: int = 5) -> str:
    """`'a', 'b', 'c'`, or the first few and how many more: one message per extra node
    must not list them all."""
    names = ", ".join(repr(n.id) for n in nodes[:shown])
    return names if len(nodes) <= shown else f"{names} and {len(nodes) - shown} more"


def start_node(check: Check) -> Iterator[Diagnostic]:
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


def terminal_node(check: Check) -> Iterator[Diagnostic]:
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


def start_no_incoming(check: Check) -> Iterator[Diagnostic]:
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


def exit_no_outgoing(check: Check) -> Iterator[Diagnostic]:
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


def edge_target_exists(check: Check) -> Iterator[Diagnostic]:
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


def reachability(check: Check) -> Iterator[Diagnostic]:
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


def endless_loop(check: Check) -> Iterator[Diagnostic]:
    """Reachable stages from which no path leads to the exit, nor to a stage with no
    way out (`dead_end`): a run that gets to them goes round them for ever, as no visit
    limit holds a run by default. One error for each group of such stages that lead
    to each other, at the first of them in the file."""
    graph = check.graph
    exits = graph.exit_nodes()
    if not exits or graph.start_node() is None:
        return  # start_node and terminal_node refuse the graph already
    # Walked backwards from every place a run ends: what can get there.
    ending = {node.id for node in graph.nodes.values() if not graph.outgoing(node.id)}
    ending.update(node.id for node in exits)
    frontier = list(ending)
    while frontier:
        for edge in graph.incoming(frontier.pop()):
            if edge.source not in ending:
                ending.add(edge.source)
                frontier.append(edge.source)
    reachable = check.reachable()
    trapped = {node_id for node_id in reachable if node_id not in ending}
    if not trapped:
        return
    order = {node_id: index for index, node_id in enumerate(graph.nodes)}
    seen: set[str] = set()
    for node in graph.nodes.values():  # file order
        if node.id not in trapped or node.id in seen:
            continue
        group = _loop_group(graph, node.id, trapped)
        seen.update(group)
        members = [graph.nodes[node_id] for node_id in sorted(group, key=order.__getitem__)]
        what = "node" if len(members) == 1 else "nodes"
        yield check.on_node(
            "endless_loop",
            ERROR,
            f"no path from {what} {_some_names(members)} reaches the exit or ends anywhere, "
            "so a run that gets there goes round a loop for ever; add a way out, e.g. "
            f"{members[-1].id} -> {exits[0].id}",
            node,
            check.node_pos(node),
        )


def _loop_group(graph: Graph, first: str, trapped: set[str]) -> set[str]:
    """The trapped nodes joined to `first` by edges between trapped nodes, either way."""
    group = {first}
    frontier = [first]
    while frontier:
        current = frontier.pop()
        for edge in graph.outgoing(current) + graph.incoming(current):
            for other in (edge.source, edge.target):
                if other in trapped and other not in group:
                    group.add(other)
                    frontier.append(other)
    return group


def implicit_node(check: Check) -> Iterator[Diagnostic]:
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
            f"edge {edge.source} -> {edge.target} at {source_place(check, edge.line, edge.column)}"
            if edge is not None
            else "an edge"
        )
        handler = node.handler_type
        article = "an" if handler[:1] in "aeiou" else "a"
        suggestion = did_you_mean(node.id, known)
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


def dead_end(check: Check) -> Iterator[Diagnostic]:
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


def parallel_join(check: Check) -> Iterator[Diagnostic]:
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


def node_id_valid(check: Check) -> Iterator[Diagnostic]:
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


def unresolved_file_ref(check: Check) -> Iterator[Diagnostic]:
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


def path_inside_repository(check: Check) -> Iterator[Diagnostic]:
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
