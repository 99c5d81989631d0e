"""`git fabro validate`: check workflow files without running them.

Every problem, including a file that cannot be read or parsed, is printed as a
diagnostic in the compiler-style `path:line:col: severity: [rule] message` form, so
editors and CI logs can jump to it, and `--json` always yields one document even when a
file is broken. The exit status is 1 if any file has an error; warnings alone pass
(Fabro's verdicts), unless `--strict` makes them fail too, as CI may want.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fabro_git.errors import WorkflowError
from fabro_git.terminal import printable
from fabro_git.workflow import Diagnostic, Graph, has_errors, load, validate


def check_file(path: Path) -> tuple[Graph | None, list[Diagnostic]]:
    """The graph (None if unreadable) and its diagnostics; a parse failure is one."""
    try:
        graph = load(path)
    except WorkflowError as err:
        return None, [Diagnostic("parse", "error", err.detail, None, None, err.line, err.column)]
    return graph, validate(graph)


def format_diagnostic(path: Path, diagnostic: Diagnostic) -> str:
    """The diagnostic's one line, as `validate` and `run` print it: the file name and the
    names a message quotes (a subgraph's, a template's, a symlink's target) are the
    workflow's, so their escapes are shown, never executed."""
    where = str(path)
    if diagnostic.line is not None:
        where += f":{diagnostic.line}"
        if diagnostic.column is not None:
            where += f":{diagnostic.column}"
    return printable(
        f"{where}: {diagnostic.severity}: [{diagnostic.rule}] {diagnostic.message}", one_line=True
    )


def _summary(path: Path, graph: Graph | None, diagnostics: list[Diagnostic]) -> str:
    errors = sum(1 for d in diagnostics if d.severity == "error")
    warnings = sum(1 for d in diagnostics if d.severity == "warning")
    if graph is None:
        return printable(f"{path}: could not be parsed", one_line=True)
    counts = f"{len(graph.nodes)} nodes, {len(graph.edges)} edges"
    if errors:
        verdict = f"invalid ({_plural(errors, 'error')}, {_plural(warnings, 'warning')})"
    elif warnings:
        verdict = f"valid with {_plural(warnings, 'warning')}"
    else:
        verdict = "valid"
    return printable(f"{path}: {verdict} - workflow {graph.name!r}, {counts}", one_line=True)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _as_json(path: Path, graph: Graph | None, diagnostics: list[Diagnostic]) -> dict[str, object]:
    return {
        "file": str(path),
        "name": graph.name if graph is not None else None,
        "nodes": len(graph.nodes) if graph is not None else 0,
        "edges": len(graph.edges) if graph is not None else 0,
        "diagnostics": [
            {
                "rule": d.rule,
                "severity": d.severity,
                "message": d.message,
                "node_id": d.node_id,
                "edge": list(d.edge) if d.edge is not None else None,
                "line": d.line,
                "column": d.column,
                "typo": {"written": d.typo[0], "meant": d.typo[1]} if d.typo else None,
            }
            for d in diagnostics
        ],
    }


def run(files: list[str], *, json_output: bool, strict: bool = False) -> int:
    failed = False
    documents: list[dict[str, object]] = []
    from fabro_git.cli._workflows import workflow_path

    for path in map(workflow_path, files):
        graph, diagnostics = check_file(path)
        failed = failed or has_errors(diagnostics)
        if strict:
            failed = failed or any(d.severity == "warning" for d in diagnostics)
        if json_output:
            documents.append(_as_json(path, graph, diagnostics))
            continue
        for diagnostic in diagnostics:
            print(format_diagnostic(path, diagnostic))
        print(_summary(path, graph, diagnostics))
    if json_output:
        json.dump(documents, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 1 if failed else 0
