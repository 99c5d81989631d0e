"""What a run or a resume refuses before it touches the run: LLM stages that cannot
run here (an unknown model, a missing key, an agent CLI not installed), an in-place
run resumed outside the checkout it ran in, and a stored workflow whose typed values
no longer parse."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fabro_git.engine.checkpoint import Manifest
from fabro_git.engine.runner import Options
from fabro_git.engine.stored_run import StoredRun, load_graph
from fabro_git.errors import FabroError, WorkflowError
from fabro_git.store.repo import GitRepo
from fabro_git.workflow import Graph


def check_in_place_home(repo: GitRepo, run_id: str, manifest: Manifest) -> None:
    """An in-place run resumes only in the checkout it ran in. The manifest's
    `source_directory` is run data (a fetched run's says whatever its author wrote), so it
    never chooses where stages run: it is only compared with this checkout."""
    if not manifest.in_place:
        return
    here = Path(repo.root).resolve()
    if Path(manifest.source_directory).resolve() != here:
        raise FabroError(
            f"run {run_id} ran in place in {manifest.source_directory!r}, not in {here}",
            hint="resume it from that checkout, or continue it in a worktree here with "
            f"`git fabro fork {run_id}`",
        )


def check_resumable(
    repo: GitRepo, run_id: str, stored: StoredRun, options: Options, graph: Graph | None = None
) -> None:
    """Refuse, before a resume touches the run, what `check_options` refuses before a
    run: a key unset since the run started, an agent CLI uninstalled since. `graph`
    is the workflow it goes on with, when not the one it ran."""
    manifest, _cp, meta, source = stored
    graph = graph or load_graph(repo, run_id, manifest, source, meta)
    check_attribute_values(graph, run_id)
    if options.dry_run:
        return
    check_in_place_home(repo, run_id, manifest)
    recorded = manifest.run_config
    check_options(
        options,
        graph,
        recorded.model_fallbacks,
        cli_command=recorded.agent.cli_command if recorded.agent is not None else None,
    )


def check_attribute_values(graph: Graph, run_id: str) -> None:
    """Refuse a workflow (or a child of it) with a typed value the engine could not
    read: a run started by an earlier version took a value validation refuses now
    (`timeout="-5s"`), and its stage would fail to start on every resume."""
    from fabro_git.workflow.lint_attributes import attribute_value
    from fabro_git.workflow.lint_check import ERROR, Check
    from fabro_git.workflow.paths import descendants

    for workflow in [graph, *descendants(graph)]:
        bad = [d for d in attribute_value(Check(workflow, None)) if d.severity == ERROR]
        if bad:
            raise WorkflowError(
                bad[0].message,
                path=workflow.path,
                line=bad[0].line,
                column=bad[0].column,
                hint="correct it in the workflow file, then go on with "
                f"`git fabro resume {run_id} --workflow FILE`",
            )


def check_options(
    options: Options,
    graph: Graph,
    fallbacks: Sequence[str] | None = None,
    *,
    cli_command: Sequence[str] | None = None,
) -> None:
    """Refuse, before the run exists, a workflow whose LLM stages cannot run: an unknown
    model or provider, a missing key, an agent CLI not installed. With --dry-run nothing
    is resolved."""
    if options.dry_run:
        return
    from fabro_git.workflow.model import LLM_TYPES
    from fabro_git.workflow.paths import descendants

    nodes = [
        node
        for workflow in [graph, *descendants(graph)]
        for node in workflow.nodes.values()
        if node.handler_type in LLM_TYPES
    ]
    if not nodes and not fallbacks:
        return  # no model to choose: model choice is not even loaded
    from fabro_git.engine.stage_choice import located
    from fabro_git.llm.choice import StageChoiceError, check_stages

    try:
        check_stages(
            nodes,
            model=options.model,
            provider=options.provider,
            fallbacks=fallbacks,
            env=os.environ,
            cli_command=cli_command,
        )
    except StageChoiceError as err:
        raise located(err) from None
