"""Rendering `{{ goal }}` and `{{ inputs.* }}` into a graph's string attributes for a run.

Validation cannot know a run's inputs, so this is where a missing input is caught: before
the run exists, with the node and attribute named.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabro_git.errors import ConfigError, FabroError
from fabro_git.workflow import Graph

RENDERED_NODE_ATTRS = ("prompt", "label", "script", "tool_command", "question", "goal")


def render_graph(graph: Graph, *, goal: str, inputs: Mapping[str, str]) -> None:
    from fabro_git.workflow.templates import render

    def one(value: str, where: str, line: int | None) -> str:
        if "{{" not in value and "{%" not in value and "$goal" not in value:
            return value
        try:
            return render(value, goal=goal, inputs=inputs)
        except FabroError as err:
            loc = f"{graph.path}:{line}" if graph.path and line else str(graph.path or "<workflow>")
            raise ConfigError(
                f"{loc}: {where}: {err}",
                hint="pass missing inputs with -V NAME=VALUE (or [run.inputs] in a run config)",
            ) from err

    for key, value in list(graph.attrs.items()):
        if key in ("goal", "label"):
            graph.attrs[key] = one(value, f"graph attribute {key}", None)
    for node in graph.nodes.values():
        for key in RENDERED_NODE_ATTRS:
            raw = node.attrs.get(key)
            if raw is None or (key == "prompt" and raw.startswith("@")):
                continue
            node.attrs[key] = one(raw, f"node {node.id} attribute {key}", node.line)
    for edge in graph.edges:
        label = edge.attrs.get("label")
        if label is not None:
            edge.attrs["label"] = one(label, f"edge {edge.source} -> {edge.target} label", edge.line)
