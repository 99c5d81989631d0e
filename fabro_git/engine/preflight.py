"""What a run or a resume refuses before it touches the run: LLM stages that cannot
run here (an unknown model, a missing key, an agent CLI not installed) and an in-place
run resumed outside the checkout it ran in."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fabro_git.engine.checkpoint import Manifest
from fabro_git.engine.runner import Options
from fabro_git.engine.stored_run import StoredRun, load_graph
from fabro_git.errors import FabroError
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
    if options.dry_run:
        return
    manifest, _cp, meta, source = stored
    check_in_place_home(repo, run_id, manifest)
    recorded = manifest.run_config
    check_options(
        options,
        graph or load_graph(repo, run_id, manifest, source, meta),
        recorded.model_fallbacks,
        cli_command=recorded.agent.cli_command if recorded.agent is not None else None,
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
