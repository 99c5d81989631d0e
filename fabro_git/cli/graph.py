"""`git fabro graph`: draw a workflow.

Workflow files are valid DOT, but drawn as written they look like any other graph.
This re-emits the workflow as presentation DOT, where each handler type has its own
shape and colour, edges show their conditions, and subgraphs become labelled clusters,
then hands it to Graphviz's `dot` for SVG or PNG. `--format dot` prints the styled DOT
and needs no Graphviz at all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from fabro_git.errors import ConfigError, FabroError, ToolMissing
from fabro_git.workflow import Edge, Graph, Node, load
from fabro_git.workflow.model import Subgraph

FORMATS = ("svg", "png", "dot")
DIRECTIONS = {"lr": "LR", "tb": "TB"}

FONT = "Helvetica"

# Per handler type: Graphviz node attributes.
STYLES: dict[str, dict[str, str]] = {
    "start": {
        "shape": "circle",
        "style": "filled",
        "fillcolor": "#16a34a",
        "color": "#166534",
        "fontcolor": "white",
        "width": "0.9",
        "fixedsize": "true",
    },
    "exit": {
        "shape": "doublecircle",
        "style": "filled",
        "fillcolor": "#dc2626",
        "color": "#7f1d1d",
        "fontcolor": "white",
        "width": "0.8",
        "fixedsize": "true",
    },
    "agent": {
        "shape": "box",
        "style": "rounded,filled",
        "fillcolor": "#dbeafe",
        "color": "#2563eb",
    },
    "prompt": {"shape": "note", "style": "filled", "fillcolor": "#ede9fe", "color": "#7c3aed"},
    "command": {
        "shape": "parallelogram",
        "style": "filled",
        "fillcolor": "#f1f5f9",
        "color": "#475569",
    },
    "human": {"shape": "hexagon", "style": "filled", "fillcolor": "#fef3c7", "color": "#d97706"},
    "conditional": {
        "shape": "diamond",
        "style": "filled",
        "fillcolor": "#ffedd5",
        "color": "#ea580c",
    },
    "parallel": {
        "shape": "component",
        "style": "filled",
        "fillcolor": "#ccfbf1",
        "color": "#0d9488",
    },
    "parallel.fan_in": {
        "shape": "tripleoctagon",
        "style": "filled",
        "fillcolor": "#ccfbf1",
        "color": "#0d9488",
    },
    "wait": {
        "shape": "octagon",
        "style": "filled,dashed",
        "fillcolor": "#f5f5f4",
        "color": "#78716c",
    },
    "stack.manager_loop": {
        "shape": "house",
        "style": "filled",
        "fillcolor": "#fce7f3",
        "color": "#db2777",
    },
}
# How the second line of a node's label names its handler type.
TYPE_NAMES = {
    "parallel": "fan-out",
    "parallel.fan_in": "fan-in",
    "stack.manager_loop": "manager loop",
}
UNKNOWN_STYLE = {
    "shape": "box",
    "style": "filled,dashed",
    "fillcolor": "#fee2e2",
    "color": "#b91c1c",
}


def quote(text: str) -> str:
    """A DOT double-quoted string whose rendered text is `text`, its control characters
    shown as escapes (`\\x1b`): the DOT may be printed to a terminal, and a cloned
    repository's workflow is not the user's own text."""
    from fabro_git.terminal import printable

    escaped = printable(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _attr_list(attrs: dict[str, str]) -> str:
    return ", ".join(f"{key}={quote(value)}" for key, value in attrs.items())


def _node_label(node: Node) -> str:
    handler = node.handler_type
    if handler in ("start", "exit"):
        return node.attrs.get("label") or handler.capitalize()
    lines = [node.label]
    detail = TYPE_NAMES.get(handler, handler)
    if handler in ("agent", "prompt") and node.attrs.get("model"):
        detail += f" · {node.attrs['model']}"
    elif handler == "wait" and node.attrs.get("duration"):
        detail += f" · {node.attrs['duration']}"
    if node.attrs.get("goal_gate", "").strip().lower() == "true":
        detail += " · goal gate"
    lines.append(detail)
    return "\n".join(lines)


def _edge_attrs(edge: Edge) -> dict[str, str]:
    attrs: dict[str, str] = {}
    parts: list[str] = []
    if edge.label:
        parts.append(edge.label)
    if edge.condition:
        parts.append(f"[{edge.condition}]")
        attrs["color"] = "#2563eb"
        attrs["fontcolor"] = "#1d4ed8"
    if edge.attrs.get("freeform", "").strip().lower() == "true":
        parts.append("(free text)")
    if edge.attrs.get("loop_restart", "").strip().lower() == "true":
        attrs["style"] = "dashed"
        parts.append("(restart)")
    if parts:
        attrs["label"] = "\n".join(parts)
    weight = edge.attrs.get("weight", "").strip()
    if weight.lstrip("-").isdigit() and int(weight) > 0:
        attrs["penwidth"] = str(min(1 + int(weight) / 5, 4))
    return attrs


def render_dot(graph: Graph, *, direction: str | None = None) -> str:
    """Presentation DOT for `graph`; `direction` is "LR" or "TB"."""
    rankdir = direction or graph.attrs.get("rankdir", "").upper() or "LR"
    if rankdir not in ("LR", "TB", "RL", "BT"):
        rankdir = "LR"
    title = graph.name
    if graph.goal:
        goal = graph.goal if len(graph.goal) <= 100 else graph.goal[:97] + "..."
        title += f"\n{goal}"
    out = [f"digraph {quote(graph.name)} {{"]
    out.append(
        "  graph ["
        + _attr_list(
            {
                "rankdir": rankdir,
                "fontname": FONT,
                "fontsize": "16",
                "label": title,
                "labelloc": "t",
                "bgcolor": "white",
                "pad": "0.3",
                "nodesep": "0.5",
                "ranksep": "0.6",
            }
        )
        + "]"
    )
    out.append(f'  node [fontname="{FONT}", fontsize="12", penwidth="1.4", margin="0.15,0.08"]')
    out.append(f'  edge [fontname="{FONT}", fontsize="10", color="#64748b", arrowsize="0.8"]')

    def emit_cluster(subgraph: Subgraph, indent: str, counter: list[int]) -> None:
        counter[0] += 1
        out.append(f"{indent}subgraph cluster_{counter[0]} {{")
        style = {"label": subgraph.label or "", "style": "rounded,dashed", "color": "#94a3b8"}
        out.append(f"{indent}  graph [{_attr_list(style)}]")
        for child in subgraph.children:
            emit_cluster(child, indent + "  ", counter)
        nested = {node_id for child in subgraph.children for node_id in child.node_ids}
        for node_id in subgraph.node_ids:
            if node_id not in nested and node_id not in placed:
                placed.add(node_id)
                out.append(f"{indent}  {quote(node_id)}")
        out.append(f"{indent}}}")

    placed: set[str] = set()
    counter = [0]
    for node in graph.nodes.values():
        style = dict(STYLES.get(node.handler_type, UNKNOWN_STYLE))
        style["label"] = _node_label(node)
        style["tooltip"] = node.id
        out.append(f"  {quote(node.id)} [{_attr_list(style)}]")
    for subgraph in graph.subgraphs:
        if subgraph.label:
            emit_cluster(subgraph, "  ", counter)
    for edge in graph.edges:
        attrs = _edge_attrs(edge)
        suffix = f" [{_attr_list(attrs)}]" if attrs else ""
        out.append(f"  {quote(edge.source)} -> {quote(edge.target)}{suffix}")
    out.append("}")
    return "\n".join(out) + "\n"


def run(file: Path, *, fmt: str, output: Path | None, direction: str | None) -> int:
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    rankdir: str | None = None
    if direction is not None:
        rankdir = DIRECTIONS.get(direction.lower())
        if rankdir is None:
            raise ConfigError(f"unknown direction {direction!r}: choose lr or tb")
    from fabro_git.cli._workflows import workflow_path

    graph = load(workflow_path(file))
    dot_source = render_dot(graph, direction=rankdir)
    if fmt == "dot":
        data = dot_source.encode("utf-8")
    else:
        if output is None and fmt == "png" and sys.stdout.isatty():
            raise ConfigError("refusing to write a PNG to the terminal", hint="use -o FILE.png")
        data = _graphviz(dot_source, fmt)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise FabroError(f"cannot write {output}: {exc.strerror or exc}") from None
    return 0


def _graphviz(dot_source: str, fmt: str) -> bytes:
    dot = shutil.which("dot")
    if dot is None:
        raise ToolMissing(
            f"Graphviz's `dot` is needed to render {fmt} but is not on PATH",
            hint="install Graphviz (apt-get install graphviz, brew install graphviz) "
            "or use --format dot",
        )
    try:
        proc = subprocess.run(
            [dot, f"-T{fmt}"],
            input=dot_source.encode("utf-8"),
            capture_output=True,
            check=False,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise FabroError("Graphviz `dot` did not finish within 5 minutes") from None
    except OSError as exc:
        raise ToolMissing(f"cannot run Graphviz `dot`: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", errors="replace").strip()
        raise FabroError(f"Graphviz `dot -T{fmt}` failed: {detail or f'exit {proc.returncode}'}")
    return proc.stdout
