"""The workflow language: DOT source in, a checked `Graph` out.

`load` is the one way the rest of git fabro reads a workflow file, through the bounded
reader in `fabro_git.files`. It turns every way a file can be unusable (missing, a
directory, a FIFO or device, over 10 MB, not UTF-8, not DOT, a syntax error) into a
`WorkflowError` that names the file and position, so no caller needs its own handling.
"""

from __future__ import annotations

from pathlib import Path

from fabro_git.errors import WorkflowError
from fabro_git.files import UnreadableFile, read_input_file
from fabro_git.workflow.model import Edge, Graph, Node
from fabro_git.workflow.parser import parse
from fabro_git.workflow.validation import Diagnostic, has_errors, validate

__all__ = ["Diagnostic", "Edge", "Graph", "Node", "has_errors", "load", "parse", "validate"]


def load(path: Path) -> Graph:
    """Read and parse a workflow file (stylesheet applied, not yet validated)."""
    path = Path(path)
    try:
        data = read_input_file(path)
    except UnreadableFile as err:
        hint = "check the path, or run `git fabro validate` on it"
        raise WorkflowError(
            err.detail, path=path, hint=hint if err.detail == "no such file" else None
        ) from None
    if b"\x00" in data:
        raise WorkflowError("this is a binary file, not a DOT workflow", path=path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise WorkflowError(
            f"not valid UTF-8 (byte 0x{data[exc.start]:02x}); save the workflow as UTF-8",
            path=path,
            line=line,
            column=column,
        ) from None
    return parse(text, path)


def _position(data: bytes, offset: int) -> tuple[int, int]:
    line_start = data.rfind(b"\n", 0, offset) + 1
    line = data.count(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return line, column
