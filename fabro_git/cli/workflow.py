"""`git fabro init`, `git fabro workflow list` and `git fabro workflow create`.

`init` gives a repository the layout the other commands look in: `.fabro/project.toml`
(the project's run defaults) and a first workflow, `hello`, that needs no model. The
workflow commands list what a name can reach (`fabro_git.cli._workflows`) and write a
starter in the project's `.fabro/workflows/<name>/`. Nothing here overwrites a file:
what exists is the user's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fabro_git.cli._workflows import (
    GRAPH_FILE,
    WORKFLOWS_DIR,
    NamedWorkflow,
    check_name,
    named_workflows,
    repository_root,
)
from fabro_git.config.run_config import PROJECT_CONFIG, SCHEMA_VERSION
from fabro_git.errors import ConfigError

PROJECT_TOML = f"""\
_version = {SCHEMA_VERSION}

# Defaults for every run in this repository; a run config or a flag overrides them.
# Keys that act on your machine (hooks, MCP servers, cli_command, push_remote,
# permissions = "full") act only once you ran `git fabro trust` on this file.
[run]
# goal = "..."
# labels = {{ team = "..." }}

# [run.model]
# name = "claude-sonnet-4-6"

# [run.agent]
# permissions = "read-write"   # read-only, read-write or full
"""

HELLO = """\
// This project's first workflow: `git fabro run hello`. It needs no model: each
// stage is a shell command run in the run's own worktree, and each completed stage
// is a commit on the run branch. Change it, or make more with `git fabro workflow create`.
digraph Hello {
    graph [goal="Greet from this project"]

    start [shape=Mdiamond]
    exit  [shape=Msquare]

    greet [
        label="Write the greeting",
        shape=parallelogram,
        script="printf 'Hello from the hello workflow of this project.\\\\n' > hello.txt"
    ]
    show [label="Show it", shape=parallelogram, script="cat hello.txt"]

    start -> greet -> show -> exit
}
"""

STARTER = """\
// {name}: run it with `git fabro run {name}`.
digraph {graph_name} {{
    graph [goal="{goal}"]

    start [shape=Mdiamond]
    exit  [shape=Msquare]

    work [
        label="Do the work",
        shape=box,
        prompt="{{{{ goal }}}}"
    ]

    start -> work -> exit
}}
"""


def _repository() -> Path:
    root = repository_root()
    if root is None:
        raise ConfigError(
            "not inside a git repository", hint="run it in your repository (or `git init` first)"
        )
    return root


def _write_new(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as fh:
        fh.write(text)


def init() -> int:
    root = _repository()
    files = {
        root / PROJECT_CONFIG: PROJECT_TOML,
        root / WORKFLOWS_DIR / "hello" / GRAPH_FILE: HELLO,
    }
    there = [path for path in files if path.exists()]
    if there:
        shown = ", ".join(str(path.relative_to(root)) for path in there)
        raise ConfigError(
            f"{shown} already exist(s); nothing was written",
            hint="this repository is set up already: see `git fabro workflow list`",
        )
    for path, text in files.items():
        _write_new(path, text)
        print(f"created {path.relative_to(root)}")
    print("next: git fabro run hello  (and commit .fabro/ to share it)")
    return 0


def _dot_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def create(name: str, *, goal: str | None) -> int:
    root = _repository()
    check_name(name)
    path = root / WORKFLOWS_DIR / name / GRAPH_FILE
    if path.parent.exists():
        raise ConfigError(
            f"{path.parent.relative_to(root)} already exists; nothing was written",
            hint="choose another name, or edit the workflow that is there",
        )
    graph_name = "".join(
        part.capitalize() for part in name.replace(".", "-").replace("_", "-").split("-")
    )
    if not graph_name[:1].isalpha():
        graph_name = "W" + graph_name
    text = STARTER.format(
        name=name, graph_name=graph_name, goal=_dot_string(goal or f"Describe what {name} does")
    )
    _write_new(path, text)
    print(f"created {path.relative_to(root)}")
    return 0


def _goal(workflow: NamedWorkflow) -> str:
    if workflow.path.suffix != ".fabro":
        return ""
    from fabro_git.workflow import load

    try:
        return str(load(workflow.path).attrs.get("goal") or "")
    except Exception:  # a broken workflow is still listed; validate says what is wrong
        return ""


def list_workflows(*, json_output: bool) -> int:
    root = repository_root()
    found = named_workflows(root)
    first: dict[str, NamedWorkflow] = {}
    rows: list[dict[str, str | None]] = []
    for workflow in found:
        winner = first.setdefault(workflow.name, workflow)
        path = workflow.path
        if root is not None and path.is_relative_to(root):
            path = path.relative_to(root)
        rows.append(
            {
                "name": workflow.name,
                "origin": workflow.origin,
                "path": str(path),
                "goal": _goal(workflow),
                "shadowed_by": winner.origin if winner is not workflow else None,
            }
        )
    if json_output:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from fabro_git.terminal import printable

    width = max((len(str(row["name"])) for row in rows), default=4)
    for row in rows:
        note = f"  (shadowed by the {row['shadowed_by']} one)" if row["shadowed_by"] else ""
        goal = f"  {printable(str(row['goal']), one_line=True)[:70]}" if row["goal"] else ""
        print(f"{row['name']:<{width}}  {row['origin']:<8}  {row['path']}{goal}{note}")
    return 0
