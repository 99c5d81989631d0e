"""The declarations of `run` and `resume`: a run is started and continued with many of the
same options, declared here once.

`app.py` registers the two commands in its help order; like every declaration, each
imports its implementation (`fabro_git.cli.run`, `fabro_git.cli.resume`) only when it is
called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fabro_git.cli._typer import PermissionsOption, QuietOption, RunArg, output_mode

PushOption = Annotated[
    str | None,
    typer.Option(
        "--push",
        help="Push the run's refs to this remote after every checkpoint.",
        metavar="REMOTE",
    ),
]
MaxCostOption = Annotated[
    float | None,
    typer.Option(
        "--max-cost",
        help="Stop the run at its next checkpoint once its model cost passes USD.",
        metavar="USD",
    ),
]
AutoApproveOption = Annotated[
    bool, typer.Option("--auto-approve", help="Answer every human gate with its default.")
]
AnswerOption = Annotated[
    list[str] | None,
    typer.Option("--answer", help="Queue an answer for the next human gate; repeatable."),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="End with one JSON object describing the run.")
]
VerboseOption = Annotated[
    bool,
    typer.Option("-v", "--verbose", help="Show each command stage's output live, line by line."),
]

# `run`'s own options whose declarations take more than a line.
WorkflowArg = Annotated[
    str,
    typer.Argument(
        help="Workflow file, or the name of a project, personal or shipped workflow.",
        show_default=False,
        metavar="WORKFLOW",
    ),
]
InPlaceOption = Annotated[
    bool,
    typer.Option(
        "--in-place", help="Run in this checkout, without a worktree or run-branch commits."
    ),
]
RetroNarrativeOption = Annotated[
    bool,
    typer.Option(
        "--retro-narrative",
        help="Also ask the run's model for the retro's narrative (one call at the end).",
    ),
]
AllowTyposOption = Annotated[
    bool,
    typer.Option(
        "--allow-typos", help="Run even when validation finds typos (did-you-mean warnings)."
    ),
]


def run(
    workflow: WorkflowArg,
    goal: Annotated[str | None, typer.Option("--goal", help="The run's goal ({{ goal }}).")] = None,
    goal_file: Annotated[
        Path | None, typer.Option("--goal-file", help="Read the goal from a file.")
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option("-V", "--input", help="KEY=VALUE for {{ inputs.KEY }}; repeatable."),
    ] = None,
    auto_approve: AutoApproveOption = False,
    answers: AnswerOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Simulate LLM stages instead of calling a model.")
    ] = False,
    in_place: InPlaceOption = False,
    labels: Annotated[
        list[str] | None, typer.Option("--label", help="KEY=VALUE run label; repeatable.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Default model for LLM stages.")
    ] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Default provider for LLM stages.")
    ] = None,
    detach: Annotated[
        bool,
        typer.Option("-d", "--detach", help="Print the run id and continue in the background."),
    ] = False,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    no_retro: Annotated[
        bool, typer.Option("--no-retro", help="Write no retro (retro.json) at the run's end.")
    ] = False,
    retro_narrative: RetroNarrativeOption = False,
    push_remote: PushOption = None,
    max_cost: MaxCostOption = None,
    allow_typos: AllowTyposOption = False,
    permissions: PermissionsOption = None,
    run_id: Annotated[str | None, typer.Option("--run-id", hidden=True)] = None,
) -> None:
    """Start a run of a workflow in a new worktree."""
    from fabro_git.cli import run as impl

    raise typer.Exit(
        impl.run(
            workflow,
            goal=goal,
            goal_file=goal_file,
            inputs=inputs or [],
            auto_approve=auto_approve,
            answers=answers or [],
            dry_run=dry_run,
            in_place=in_place,
            labels=labels or [],
            model=model,
            provider=provider,
            detach=detach,
            json_output=json_output,
            output=output_mode(quiet, verbose),
            push_remote=push_remote,
            retro=not no_retro,
            retro_narrative=retro_narrative,
            max_cost=max_cost,
            allow_typos=allow_typos,
            permissions=permissions,
            run_id=run_id,
        )
    )


def resume(
    run_id: RunArg,
    auto_approve: AutoApproveOption = False,
    answers: AnswerOption = None,
    detach: Annotated[
        bool, typer.Option("-d", "--detach", help="Continue in the background.")
    ] = False,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    no_retro: Annotated[
        bool, typer.Option("--no-retro", help="Write no retro at the run's end.")
    ] = False,
    detached_child: Annotated[bool, typer.Option("--detached-child", hidden=True)] = False,
    push_remote: PushOption = None,
    max_cost: MaxCostOption = None,
    rebase: Annotated[
        str | None,
        typer.Option(
            "--rebase",
            help="Merge REV (a fix committed since) into the run branch, then continue.",
            metavar="REV",
        ),
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option(
            "--workflow",
            help="Continue with this corrected workflow (it keeps every completed node).",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """Continue an interrupted or failed run from its last checkpoint."""
    from fabro_git.cli import resume as impl

    raise typer.Exit(
        impl.resume(
            run_id,
            auto_approve=auto_approve,
            answers=answers or [],
            detach=detach,
            json_output=json_output,
            output=output_mode(quiet, verbose),
            detached_child=detached_child,
            push_remote=push_remote,
            retro=not no_retro,
            max_cost=max_cost,
            rebase=rebase,
            workflow=workflow,
        )
    )
