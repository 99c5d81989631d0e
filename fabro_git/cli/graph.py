"""`git fabro graph`: draw a workflow (the drawing itself is `workflow.drawing`'s).

`--format dot` prints the styled DOT and needs no Graphviz at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fabro_git.errors import ConfigError, FabroError
from fabro_git.workflow import load
from fabro_git.workflow.drawing import graphviz, quote, render_dot

__all__ = ["quote", "render_dot", "run"]

FORMATS = ("svg", "png", "dot")
DIRECTIONS = {"lr": "LR", "tb": "TB"}


def run(file: str, *, fmt: str, output: Path | None, direction: str | None) -> int:
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
        data = graphviz(dot_source, fmt)
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise FabroError(f"cannot write {output}: {exc.strerror or exc}") from None
    return 0
