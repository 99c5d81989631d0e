"""The groups of subcommands: `model list|test`, `workflow list|create` and
`artifact list|cp`, each a typer application that `app.py` adds under its name.

As every declaration, each subcommand imports its implementation only when it is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fabro_git.cli._typer import GROUP_SETTINGS, Command, RunArg

model_app = typer.Typer(
    name="model",
    help="List the model catalogue and check provider keys.",
    **GROUP_SETTINGS,
)


@model_app.command("list")
def model_list(
    provider: Annotated[
        str | None, typer.Option("--provider", help="Only this provider's models.")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Print the model catalogue: ids, aliases, context windows and prices."""
    from fabro_git.cli import model as impl

    raise typer.Exit(impl.run_list(provider=provider, json_output=json_output))


@model_app.command("test")
def model_test(
    provider: Annotated[
        str | None, typer.Option("--provider", help="Test only this provider.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Test this model instead of the provider's default."),
    ] = None,
) -> None:
    """Send a tiny prompt to each configured provider and report the result."""
    from fabro_git.cli import model as impl

    raise typer.Exit(impl.run_test(provider=provider, model=model))


workflow_app = typer.Typer(
    name="workflow",
    help="List the workflows runnable by name, and start new ones.",
    **GROUP_SETTINGS,
)


@workflow_app.command("list", cls=Command)
def workflow_list(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """List the project's, your own and the shipped workflows, in lookup order."""
    from fabro_git.cli import workflow as impl

    raise typer.Exit(impl.list_workflows(json_output=json_output))


@workflow_app.command("create", cls=Command)
def workflow_create(
    name: Annotated[
        str, typer.Argument(help="The new workflow's name.", show_default=False, metavar="NAME")
    ],
    goal: Annotated[str | None, typer.Option("--goal", help="The workflow's goal.")] = None,
) -> None:
    """Write a starter workflow in .fabro/workflows/NAME/."""
    from fabro_git.cli import workflow as impl

    raise typer.Exit(impl.create(name, goal=goal))


artifact_app = typer.Typer(
    name="artifact",
    help="List and copy a run's captured test assets and offloaded values.",
    **GROUP_SETTINGS,
)

_ArtifactNode = Annotated[
    str | None,
    typer.Option("--node", help="Only this stage's: NODE or NODE@VISIT.", metavar="NODE"),
]
_ArtifactRetry = Annotated[
    int | None,
    typer.Option("--retry", help="Only assets of this attempt (1 is the first).", metavar="N"),
]


@artifact_app.command("list", cls=Command)
def artifact_list(
    run_id: RunArg,
    node: _ArtifactNode = None,
    retry: _ArtifactRetry = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """List a run's assets and offloaded values, read from git."""
    from fabro_git.cli import artifact as impl

    raise typer.Exit(impl.run_list(run_id, node, retry, json_output))


@artifact_app.command("cp", cls=Command)
def artifact_cp(
    source: Annotated[
        str,
        typer.Argument(
            help="RUN (all its files) or RUN:PATH (a path `artifact list` shows, or a dir).",
            show_default=False,
            metavar="RUN[:PATH]",
        ),
    ],
    dest: Annotated[Path, typer.Argument(help="Directory to copy into.", metavar="DEST")] = Path(
        "."
    ),
    node: _ArtifactNode = None,
    retry: _ArtifactRetry = None,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree", help="Keep the NODE_SLUG/retry_N/ layout (and each attempt's manifest)."
        ),
    ] = False,
) -> None:
    """Copy a run's assets and offloaded values out of git into DEST."""
    from fabro_git.cli import artifact as impl

    raise typer.Exit(impl.run_cp(source, dest, node, retry, tree))
