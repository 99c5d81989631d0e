"""Rendering `{{ goal }}` and `{{ inputs.* }}` into a graph's string attributes for a run.

Validation cannot know a run's inputs, so this is where a missing input is caught: before
the run exists, with the node and attribute named. Scripts (`script`, `tool_command` and
the graph's `setup`) get references to environment variables, never the values; see
`fabro_git.workflow.templates`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabro_git.errors import ConfigError, FabroError
from fabro_git.workflow import Graph

RENDERED_NODE_ATTRS = ("prompt", "label", "script", "tool_command", "question", "goal")
SCRIPT_ATTRS = ("script", "tool_command")
_MISSING_INPUT_HINT = "pass missing inputs with -V NAME=VALUE (or [run.inputs] in a run config)"


class _Renderer:
    """Renders one attribute value of `graph`; a failure names the file and line."""

    def __init__(self, graph: Graph, goal: str, inputs: Mapping[str, str]) -> None:
        self.graph = graph
        self.goal = goal
        self.inputs = inputs

    def __call__(
        self, value: str, where: str, line: int | None, language: str | None = None
    ) -> str:
        from fabro_git.workflow.templates import render, render_script

        if "{{" not in value and "{%" not in value and "$goal" not in value:
            return value
        try:
            if language is None:
                return render(value, goal=self.goal, inputs=self.inputs)
            return render_script(value, inputs=self.inputs, language=language)
        except FabroError as err:
            path = self.graph.path
            loc = f"{path}:{line}" if path and line else str(path or "<workflow>")
            hint = _MISSING_INPUT_HINT if "undefined input" in err.message else None
            raise ConfigError(f"{loc}: {where}: {err}", hint=hint) from err


def render_graph(graph: Graph, *, goal: str, inputs: Mapping[str, str]) -> None:
    one = _Renderer(graph, goal, inputs)
    for key, value in list(graph.attrs.items()):
        if key in ("goal", "label"):
            graph.attrs[key] = one(value, f"graph attribute {key}", None)
        elif key == "setup":
            graph.attrs[key] = one(value, "graph attribute setup", None, "shell")
    for node in graph.nodes.values():
        language = (node.attrs.get("language") or "shell").strip().lower()
        for key in RENDERED_NODE_ATTRS:
            raw = node.attrs.get(key)
            if raw is None or (key == "prompt" and raw.startswith("@")):
                continue
            where = f"node {node.id} attribute {key}"
            node.attrs[key] = one(raw, where, node.line, language if key in SCRIPT_ATTRS else None)
    for edge in graph.edges:
        label = edge.attrs.get("label")
        if label is not None:
            edge.attrs["label"] = one(
                label, f"edge {edge.source} -> {edge.target} label", edge.line
            )


def render_goal(graph: Graph, *, inputs: Mapping[str, str]) -> str:
    """The run's goal when it comes from the graph's `goal` attribute, which may name
    inputs (`goal="Test {{ inputs.repo }}"`)."""
    from fabro_git.workflow.templates import render

    value = graph.attrs.get("goal") or ""
    if "{{" not in value and "{%" not in value:
        return value
    try:
        return render(value, goal="", inputs=inputs)
    except FabroError as err:
        raise ConfigError(
            f"{graph.path or '<workflow>'}: graph attribute goal: {err}", hint=_MISSING_INPUT_HINT
        ) from err
