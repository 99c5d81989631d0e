"""Workflows by name: the project's, the user's own, and the shipped examples.

A repository keeps its workflows in `.fabro/workflows/<name>/` and a user theirs in
`workflows/<name>/` beside `settings.toml` in git fabro's config dir; each directory
holds `workflow.fabro`, or a run config `workflow.toml` that names the graph (by
default the `workflow.fabro` beside it). `run`, `validate` and `graph` take a name
wherever they take a file: a path that exists wins, then the project's workflow of that
name, then the user's, then a shipped example, so a repository's `hello` is the one its
users mean. A name no workflow has exactly may be the start of one (as a run id may
be); when it starts several, nothing is guessed and the candidates are listed.

A workflow found by name is repository-carried like any workflow file: running it by
name is the user's choice of its graph. Its run config is another matter: a project's
`workflow.toml` (found by name, not typed as a path) comes with the repository, as
`.fabro/project.toml` does, and its hooks, servers and pushes act only once trusted
(`fabro_git.cli.run._carried_by_repository`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fabro_git.errors import ConfigError
from fabro_git.files import NAMED_GRAPH_FILE

Origin = Literal["project", "personal", "example"]
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
WORKFLOWS_DIR = Path(".fabro") / "workflows"
GRAPH_FILE = NAMED_GRAPH_FILE
RUN_CONFIG_FILE = "workflow.toml"


@dataclass(frozen=True)
class NamedWorkflow:
    name: str
    origin: Origin
    # What `run` reads: the run config when the directory has one, else the graph.
    path: Path


def repository_root(start: Path | None = None) -> Path | None:
    """The top of the git checkout holding `start` (the working directory), found
    without starting git: the nearest directory with a `.git`."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / ".git").exists():
            return directory
    return None


def personal_dir() -> Path:
    """The user's own workflows: `workflows/` in git fabro's config dir."""
    from fabro_git.config.run_config import user_settings_path

    return user_settings_path().parent / "workflows"


def _in_directory(base: Path, origin: Origin) -> list[NamedWorkflow]:
    found: list[NamedWorkflow] = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not NAME.fullmatch(entry.name) or not entry.is_dir():
            continue
        for file in (RUN_CONFIG_FILE, GRAPH_FILE):
            if (entry / file).is_file():
                found.append(NamedWorkflow(entry.name, origin, entry / file))
                break
    return found


def named_workflows(repo_root: Path | None) -> list[NamedWorkflow]:
    """Every workflow a name can reach, in the order a name is looked up."""
    from fabro_git.workflow.paths import examples_dir

    found = _in_directory(repo_root / WORKFLOWS_DIR, "project") if repo_root else []
    found += _in_directory(personal_dir(), "personal")
    found += [
        NamedWorkflow(path.stem, "example", path) for path in sorted(examples_dir().glob("*.fabro"))
    ]
    return found


def find_named(arg: str, repo_root: Path | None) -> NamedWorkflow | None:
    """The workflow `arg` names: exactly, in lookup order, else the one whose name it
    begins. Several beginning with it is an error that lists them."""
    # `hello.fabro` names a shipped example, as it always did; a missing file's name
    # is never taken for the start of another's.
    file_like = arg.endswith((".fabro", ".toml"))
    name = arg.removesuffix(".fabro")
    if not NAME.fullmatch(name):
        return None
    known = named_workflows(repo_root)
    for workflow in known:
        if workflow.name == name and (workflow.origin == "example" or not file_like):
            return workflow
    if file_like:
        return None
    starting: dict[str, NamedWorkflow] = {}
    for workflow in known:
        if workflow.name.startswith(name):
            starting.setdefault(workflow.name, workflow)
    if len(starting) > 1:
        listed = ", ".join(f"{w.name} ({w.origin})" for w in starting.values())
        raise ConfigError(
            f"workflow name {arg!r} is ambiguous: it could be {listed}",
            hint="type more of the name, or pass the workflow file's path",
        )
    return next(iter(starting.values()), None)


def workflow_path(arg: str | Path, repo_root: Path | None = None) -> Path:
    """`arg` itself when it is a path that exists (or plainly a path), else the file of
    the workflow it names; `arg` as a path when no workflow has that name. An empty
    `arg` is refused: as a path it would be the current directory, which no one means."""
    text = str(arg)
    if not text.strip():
        raise ConfigError(
            "no workflow given: the WORKFLOW argument is empty",
            hint="pass a path to a .fabro or run.toml file, or a workflow's name (see "
            "`git fabro workflow list`)",
        )
    path = Path(text).expanduser()
    if path.exists() or "/" in text:
        return path
    named = find_named(text, repo_root if repo_root is not None else repository_root())
    return named.path if named is not None else path


def check_name(name: str) -> str:
    if not NAME.fullmatch(name) or name.endswith((".fabro", ".toml")):
        raise ConfigError(
            f"{name!r} cannot name a workflow",
            hint="use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    return name
