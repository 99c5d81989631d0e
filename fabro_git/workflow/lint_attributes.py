"""Lint rules on attributes: unknown names, values that do not parse, handler types,
fidelity and selection modes, retry targets, prompts, scripts and models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath

from fabro_git.durations import DURATION_EXPECTED
from fabro_git.suggest import close_names
from fabro_git.workflow.attributes import (
    EDGE_ATTRIBUTES,
    GRAPHVIZ_GRAPH,
    KNOWN,
    NODE_ATTRIBUTES,
)
from fabro_git.workflow.lint_check import (
    EDGE_BOOLS,
    EDGE_INTS,
    ERROR,
    FIDELITY_MODES,
    GRAPH_DURATIONS,
    GRAPH_INTS,
    NODE_BOOLS,
    NODE_DURATIONS,
    NODE_INTS,
    SELECTION_MODES,
    WARNING,
    Check,
    Diagnostic,
    did_you_mean,
    is_flag_set,
    prompt_file_of,
)
from fabro_git.workflow.model import (
    AGENT,
    COMMAND,
    HANDLER_TYPES,
    LLM_TYPES,
    SHAPE_TO_TYPE,
    TYPE_ALIASES,
    Edge,
    Node,
    parse_bool,
    parse_duration,
)
from fabro_git.workflow.paths import Origin, origin_for
from fabro_git.workflow.stylesheet import StylesheetError, parse_stylesheet
from fabro_git.workflow.templates import (
    TemplateError,
    is_file_ref,
    is_known_variable,
    render_script,
    template_references,
)

_PLACES = {"node": "nodes", "edge": "edges", "graph": "the graph"}


def _why_unread(kind: str, key: str) -> tuple[str, tuple[str, str] | None]:
    """Why nothing reads `key` on a `kind` statement, and the (key, meant) typo when a
    known name is close."""
    elsewhere = [_PLACES[other] for other in _PLACES if key in KNOWN[other]]
    if elsewhere:
        return f"it is read on {' and '.join(elsewhere)}, not on {_PLACES[kind]}", None
    close = close_names(key, KNOWN[kind])
    if close:
        return "nothing reads it" + did_you_mean(key, KNOWN[kind]), (key, close[0])
    for other in _PLACES:
        close = close_names(key, KNOWN[other])
        if close:
            where = _PLACES[other].removesuffix("s").removeprefix("the ")
            suggestion = f"; did you mean {close[0]!r}, a {where} attribute?"
            return "nothing reads it" + suggestion, (key, close[0])
    return "nothing reads it", None


class _Unread:
    """One pass of `unknown_attribute`: each unread key is reported once per place."""

    def __init__(self, check: Check) -> None:
        self.check = check
        # A graph attribute is mirrored into the context as `graph.NAME`, so a
        # condition that reads it makes a custom one meaningful.
        self.read_by_conditions: set[str] = set()
        for condition in check.conditions.values():
            for clause in condition.clauses():
                key = clause.key.removeprefix("context.")
                if key.startswith("graph."):
                    self.read_by_conditions.add(key[len("graph.") :])
        self.reported: set[tuple[str, int, int]] = set()

    def problem(
        self, kind: str, key: str, pos: tuple[int | None, int | None]
    ) -> tuple[str, tuple[str, str] | None] | None:
        if kind == "graph" and key in self.read_by_conditions:
            return None
        at = (key, pos[0] or 0, pos[1] or 0)
        if at in self.reported:  # a `node [...]` default reaches every node after it
            return None
        self.reported.add(at)
        return _why_unread(kind, key)

    def on_graph(self) -> Iterator[Diagnostic]:
        check = self.check
        for key in check.graph.attrs:
            if key in KNOWN["graph"]:
                continue
            pos = check.key_position(check.graph_pos(key), key)
            found = self.problem("graph", key, pos)
            if found is not None:
                why, typo = found
                message = f"unknown graph attribute {key!r}: {why}"
                yield check.on_graph("unknown_attribute", WARNING, message, pos, typo)

    def on_nodes(self) -> Iterator[Diagnostic]:
        check = self.check
        for node in check.graph.nodes.values():
            for key in node.attrs:
                if key in NODE_ATTRIBUTES or key in node.styled:
                    continue
                pos = check.key_position(check.node_pos(node, key), key)
                found = self.problem("node", key, pos)
                if found is not None:
                    why, typo = found
                    message = f"node {node.id!r}: unknown attribute {key!r}: {why}"
                    yield check.on_node("unknown_attribute", WARNING, message, node, pos, typo)

    def on_edges(self) -> Iterator[Diagnostic]:
        check = self.check
        for edge in check.graph.edges:
            for key in edge.attrs:
                if key in EDGE_ATTRIBUTES:
                    continue
                pos = check.key_position(check.edge_pos(edge, key), key)
                found = self.problem("edge", key, pos)
                if found is not None:
                    why, typo = found
                    message = (
                        f"edge {edge.source} -> {edge.target}: unknown attribute {key!r}: {why}"
                    )
                    yield check.on_edge("unknown_attribute", WARNING, message, edge, pos, typo)


def _unknown_subgraph_attributes(check: Check) -> Iterator[Diagnostic]:
    """A subgraph's attributes are Graphviz's (a cluster's label, style, rank), and its
    label also names a stylesheet class."""
    pending = list(check.graph.subgraphs)
    while pending:
        subgraph = pending.pop()
        pending.extend(subgraph.children)
        for key in subgraph.attrs:
            if key in GRAPHVIZ_GRAPH:
                continue
            where = subgraph.positions.get(key, (subgraph.line, subgraph.column))
            pos = check.key_position(where, key)
            suggestion = did_you_mean(key, GRAPHVIZ_GRAPH)
            name = f"subgraph {subgraph.name}" if subgraph.name else "subgraph"
            yield check.on_graph(
                "unknown_attribute",
                WARNING,
                f"{name}: unknown attribute {key!r}: only Graphviz reads a subgraph's "
                f"attributes{suggestion or ''}",
                pos,
            )


def unknown_attribute(check: Check) -> Iterator[Diagnostic]:
    """An attribute that nothing reads: a typo (`scrpt=`), or one written on the wrong
    kind of statement (`condition` on a node). The known names are in
    workflow/attributes.py."""
    unread = _Unread(check)
    yield from unread.on_graph()
    yield from _unknown_subgraph_attributes(check)
    yield from unread.on_nodes()
    yield from unread.on_edges()


def stylesheet_syntax(check: Check) -> Iterator[Diagnostic]:
    text = check.graph.attrs.get("model_stylesheet", "")
    if not text.strip():
        return
    try:
        parse_stylesheet(text)
    except StylesheetError as err:
        pos = check.value_position(check.graph.positions.get("model_stylesheet"), err.offset)
        yield check.on_graph("stylesheet_syntax", ERROR, f"model_stylesheet: {err.detail}", pos)


class _TemplateScan:
    """One pass of `template_variable`: each problem is reported once per place."""

    def __init__(self, check: Check) -> None:
        self.check = check
        self.seen: set[tuple[int | None, int | None, str]] = set()

    def scan(
        self,
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
            return self.check.value_position(where, 0 if in_file else offset)

        try:
            refs = template_references(text)
        except TemplateError as err:
            yield position(err.offset), f"{owner}: {err.message}"
            return
        for name, offset in refs:
            message = _template_problem(name)
            if message is None:
                continue
            pos = position(offset)
            key = (pos[0], pos[1], message)
            if key in self.seen:
                continue
            self.seen.add(key)
            yield pos, f"{owner}: {message}"

    def on_graph(self) -> Iterator[Diagnostic]:
        check = self.check
        for key, value in check.graph.attrs.items():
            if key == "model_stylesheet":
                continue
            where = check.graph.positions.get(key)
            owner = f"graph attribute {key}"
            for pos, message in self.scan(value, where, check.graph_pos(), owner):
                yield check.on_graph("template_variable", ERROR, message, pos)

    def on_node(self, node: Node, origin: Origin) -> Iterator[Diagnostic]:
        check = self.check
        for key, value in node.attrs.items():
            if key in node.styled:
                continue
            where = node.positions.get(key)
            owner = f"node {node.id!r} {key}"
            for pos, message in self.scan(value, where, check.node_pos(node), owner):
                yield check.on_node("template_variable", ERROR, message, node, pos)
        prompt_file = prompt_file_of(origin, node) if is_file_ref(node.prompt or "") else None
        if prompt_file is not None:
            name, content = prompt_file
            owner = f"node {node.id!r} prompt file {PurePosixPath(name).name}"
            where = node.positions.get("prompt")
            for pos, message in self.scan(
                content, where, check.node_pos(node), owner, in_file=True
            ):
                yield check.on_node("template_variable", ERROR, message, node, pos)

    def on_edge(self, edge: Edge) -> Iterator[Diagnostic]:
        check = self.check
        for key, value in edge.attrs.items():
            owner = f"edge {edge.source} -> {edge.target} {key}"
            where = edge.positions.get(key)
            for pos, message in self.scan(value, where, check.edge_pos(edge), owner):
                yield check.on_edge("template_variable", ERROR, message, edge, pos)


def _template_problem(name: str) -> str | None:
    """What is wrong with a template reference `name`; None for a known variable."""
    if name.startswith("%"):
        return f"unsupported template tag {{% {name[1:]} %}}; only {{% raw %}} exists"
    if is_known_variable(name):
        return None
    return (
        f"unknown template variable {{{{ {name} }}}}; only {{{{ goal }}}} and "
        "{{ inputs.NAME }} exist"
    )


def template_variable(check: Check) -> Iterator[Diagnostic]:
    scan = _TemplateScan(check)
    origin = origin_for(check.graph)
    yield from scan.on_graph()
    for node in check.graph.nodes.values():
        yield from scan.on_node(node, origin)
    for edge in check.graph.edges:
        yield from scan.on_edge(edge)


def _unparsable(value: str, kind: str) -> bool:
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


_EXPECTED = {
    "int": "an integer",
    "bool": "true or false",
    "duration": DURATION_EXPECTED,
}


def _bad_values(
    attrs: dict[str, str], kinds: tuple[tuple[str, tuple[str, ...]], ...]
) -> Iterator[tuple[str, str, str]]:
    """(key, value, what it should be) for each typed attribute in `attrs` that does
    not parse."""
    for kind, keys in kinds:
        for key in keys:
            value = attrs.get(key)
            if value is not None and _unparsable(value, kind):
                yield key, value, _EXPECTED[kind]


def attribute_value(check: Check) -> Iterator[Diagnostic]:
    graph = check.graph
    for key, value, expected in _bad_values(
        graph.attrs, (("int", GRAPH_INTS), ("duration", GRAPH_DURATIONS))
    ):
        yield check.on_graph(
            "attribute_value",
            ERROR,
            f"graph attribute {key}={value!r} is not {expected}",
            check.graph_pos(key),
        )
    node_kinds = (("int", NODE_INTS), ("bool", NODE_BOOLS), ("duration", NODE_DURATIONS))
    for node in graph.nodes.values():
        for key, value, expected in _bad_values(node.attrs, node_kinds):
            yield check.on_node(
                "attribute_value",
                ERROR,
                f"node {node.id!r}: {key}={value!r} is not {expected}",
                node,
                check.node_pos(node, key),
            )
    for edge in graph.edges:
        for key, value, expected in _bad_values(
            edge.attrs, (("int", EDGE_INTS), ("bool", EDGE_BOOLS))
        ):
            yield check.on_edge(
                "attribute_value",
                ERROR,
                f"edge {edge.source} -> {edge.target}: {key}={value!r} is not {expected}",
                edge,
                check.edge_pos(edge, key),
            )


def selection_valid(check: Check) -> Iterator[Diagnostic]:
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


def permissions_valid(check: Check) -> Iterator[Diagnostic]:
    from fabro_git.config.run_config import PERMISSION_LEVELS, permission_level

    for node in check.graph.nodes.values():
        value = node.attrs.get("permissions")
        if value is not None and permission_level(value.strip()) is None:
            yield check.on_node(
                "permissions_valid",
                ERROR,
                f"node {node.id!r}: permissions={value!r} is no permission level; "
                f"use one of {', '.join(PERMISSION_LEVELS)}",
                node,
                check.node_pos(node, "permissions"),
            )


def type_known(check: Check) -> Iterator[Diagnostic]:
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
                    f"{did_you_mean(explicit, types) or ';'} known types "
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
                f"{did_you_mean(shape, SHAPE_TO_TYPE) or ';'} known shapes are "
                f"{', '.join(sorted(SHAPE_TO_TYPE))}",
                node,
                check.node_pos(node, "shape"),
                (shape, close[0]) if close else None,
            )


def fidelity_valid(check: Check) -> Iterator[Diagnostic]:
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


def retry_target_exists(check: Check) -> Iterator[Diagnostic]:
    graph = check.graph
    for key in ("retry_target", "fallback_retry_target"):
        value = graph.attrs.get(key, "").strip()
        if value and value not in graph.nodes:
            yield check.on_graph(
                "retry_target_exists",
                WARNING,
                f"graph {key}={value!r} names no node{did_you_mean(value, graph.nodes)}",
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
                    f"{did_you_mean(value, graph.nodes)}",
                    node,
                    check.node_pos(node, key),
                )


def goal_gate_has_retry(check: Check) -> Iterator[Diagnostic]:
    graph = check.graph
    keys = ("retry_target", "fallback_retry_target")
    graph_level = any(graph.attrs.get(key, "").strip() for key in keys)
    for node in graph.nodes.values():
        if not is_flag_set(node, "goal_gate"):
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


def prompt_on_llm_nodes(check: Check) -> Iterator[Diagnostic]:
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


def command_requires_script(check: Check) -> Iterator[Diagnostic]:
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


def script_template(check: Check) -> Iterator[Diagnostic]:
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


def thread_id_requires_fidelity_full(check: Check) -> Iterator[Diagnostic]:
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


def _model_known(check: Check, model: str) -> bool:
    """A catalogue id or alias; anything else, `provider/model` included, is unknown
    (the provider goes in its own `provider` attribute)."""
    return model in check.known_models


def stylesheet_model_known(check: Check) -> Iterator[Diagnostic]:
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
                        f"{did_you_mean(declaration.value, check.known_models)}",
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
            f"{did_you_mean(model.strip(), check.known_models)}",
            node,
            check.node_pos(node, key),
        )
