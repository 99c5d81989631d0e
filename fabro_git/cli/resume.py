"""`git fabro resume`: a run goes on from its last checkpoint, here or in a detached
child, with the settings it was started with and what this command adds (answers, a
higher spending cap, a fix to `--rebase` onto or a corrected `--workflow`)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.cli._running import (
    disk_full_names_the_run,
    progress_renderer,
    remember_config_secrets,
    report,
    spawn_detached,
    stdin_answers,
    take_carried_secrets,
    use_run_author,
)
from fabro_git.cli.run import (
    _render,
    _validated,
    check_max_cost,
    check_push_remote,
    resolve_workflow,
)
from fabro_git.errors import ConfigError, FabroError

if TYPE_CHECKING:
    from fabro_git.engine.checkpoint import Manifest
    from fabro_git.engine.finish import RunResult
    from fabro_git.engine.fixes import Fixes
    from fabro_git.engine.options import Options
    from fabro_git.engine.stored_run import StoredRun
    from fabro_git.events.bus import Sink
    from fabro_git.events.envelope import EventProps
    from fabro_git.store.repo import GitRepo


def resume(
    run_id: str,
    *,
    auto_approve: bool,
    answers: list[str],
    detach: bool,
    json_output: bool,
    output: str = "tail",
    detached_child: bool = False,
    push_remote: str | None = None,
    retro: bool = True,
    max_cost: float | None = None,
    rebase: str | None = None,
    workflow: str | None = None,
) -> int:
    from fabro_git.cli._streams import outlive_readers
    from fabro_git.engine.session import check_resumable
    from fabro_git.store.repo import GitRepo

    outlive_readers()
    repo = GitRepo.discover(Path.cwd())
    found = _run_to_resume(repo, run_id, detached_child=detached_child, own_workflow=workflow)
    if found is None:
        return 0
    full_id, stored, fetched = found
    manifest, cp = stored.manifest, stored.checkpoint
    options = _options(
        manifest,
        auto_approve=auto_approve,
        answers=answers,
        interactive=stdin_answers() and not detach and not detached_child,
        detached_child=detached_child,
        push_remote=push_remote,
        retro=retro,
        max_cost=max_cost,
    )
    if detached_child:
        from fabro_git import redact

        options.carried_goal, options.carried_inputs = take_carried_secrets()
        redact.remember(options.carried_inputs)
    _check_spending(full_id, cp.total_cost, options.max_cost)
    fixes = _fixes(repo, full_id, stored, rebase, workflow)
    if not detached_child:
        check_resumable(
            repo,
            full_id,
            stored,
            options,
            fixes.workflow.graph if fixes.workflow is not None else None,
        )
    if detach:
        spawn_detached(repo, full_id, options, fixes)
        print(full_id)
        return 0
    use_run_author(repo, manifest.run_config)
    if not detached_child:
        print(f"resuming run {full_id}", file=sys.stderr)
    renderer = None if detached_child else progress_renderer(output)
    if renderer is not None:
        renderer.stages_before = cp.stage_index  # the end line counts the whole run
    if renderer is not None and (output == "all" or renderer.live):
        options.on_output = renderer.command_line
    try:
        result = _execute(repo, full_id, options, renderer, before=fetched, fixes=fixes)
    finally:
        if fixes.workflow is not None:
            _trust_own_workflow(repo, full_id, fixes.workflow.source)
    return report(result, json_output, repo, manifest.base_sha, shown=not detached_child)


def _run_to_resume(
    repo: GitRepo, run_id: str, *, detached_child: bool, own_workflow: str | None
) -> tuple[str, StoredRun, list[EventProps]] | None:
    """The run `run_id` names, as stored, with the event of its fetch when it came from
    origin just now; None when it finished already (said on stderr). A rewound run is
    refused, and so is a configuration or workflow the user does not trust (the run's
    own workflow, unless `own_workflow` names the user's file to go on with)."""
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.session import load_run
    from fabro_git.events.catalogue import GitFetch
    from fabro_git.store import runs as runrefs

    known = set(runrefs.list_run_ids(repo))
    full_id = _resolve_or_restore(repo, run_id, resolve_run)
    stored = load_run(repo, full_id)
    manifest, cp, _meta, _source = stored
    # A run this repository did not have was found on origin and fetched on demand.
    fetched: list[EventProps] = (
        [] if full_id in known else [GitFetch(branch=_run_branch_name(manifest), success=True)]
    )
    if manifest.superseded_by:
        raise FabroError(
            f"run {full_id} was rewound: run {manifest.superseded_by} replaced it",
            hint="resume that run with "
            f"`{shlex.join(['git', 'fabro', 'resume', manifest.superseded_by])}`",
        )
    if cp.status in ("succeeded", "partially_succeeded") and not detached_child:
        from fabro_git.terminal import printable

        status = printable(cp.status, one_line=True)
        print(f"run {full_id} already finished ({status}); nothing to resume", file=sys.stderr)
        return None
    if not detached_child:
        from fabro_git.config.trust import ask_on_terminal, check_run_config, recorded_actions
        from fabro_git.engine.stored_run import run_trust

        check_run_config(
            full_id,
            run_trust(repo, full_id, stored)
            if own_workflow is None
            else recorded_actions(manifest.settings),
            ask=ask_on_terminal("Trust it and resume?"),
            repo_root=repo.root,
        )
    remember_config_secrets(manifest.run_config)
    return full_id, stored, fetched


def _trust_own_workflow(repo: GitRepo, run_id: str, source: str) -> None:
    """After `--workflow`, the run's graph is the user's file: its next resume does not
    ask about it. Only once the run's meta ref holds it (the fix's snapshot landed);
    until then it holds the graph that was not asked about."""
    from fabro_git import redact
    from fabro_git.config.trust import record_run_config
    from fabro_git.engine.session import load_run
    from fabro_git.engine.stored_run import run_trust

    stored = load_run(repo, run_id)
    if stored.source == redact.for_process().mask_text(source):
        record_run_config(repo.root, run_id, run_trust(repo, run_id, stored))


def _options(
    manifest: Manifest,
    *,
    auto_approve: bool,
    answers: list[str],
    interactive: bool,
    detached_child: bool,
    push_remote: str | None,
    retro: bool,
    max_cost: float | None,
) -> Options:
    """The resumed run's options: the run's own settings, and what this command adds."""
    from fabro_git.engine.runner import Options

    recorded, started = manifest.run_config, manifest.options
    return Options(
        auto_approve=auto_approve or started.auto_approve,
        answers=list(answers),
        dry_run=started.dry_run,
        in_place=manifest.in_place,
        model=started.model,
        provider=started.provider,
        interactive=interactive,
        detached=detached_child,
        push_remote=check_push_remote(push_remote)
        or (recorded.git.push_remote if recorded.git is not None else None)
        or None,
        # The run's own choice holds on every resume; --no-retro here adds to it.
        retro=retro and started.retro,
        retro_narrative=started.retro_narrative,
        # A cap given here holds for this resume; else the run's own.
        max_cost=check_max_cost(max_cost) if max_cost is not None else recorded.max_cost,
    )


def _execute(
    repo: GitRepo,
    run_id: str,
    options: Options,
    renderer: Sink | None,
    *,
    before: list[EventProps],
    fixes: Fixes,
) -> RunResult:
    from fabro_git.engine.session import execute_run
    from fabro_git.handlers import handler_for
    from fabro_git.handlers.hooks import agent_hook_reply

    with disk_full_names_the_run(run_id):
        return execute_run(
            repo,
            run_id,
            options=options,
            renderer=renderer,
            resuming=True,
            handlers=handler_for,
            agent_hooks=agent_hook_reply,
            before=before,
            fixes=fixes,
        )


def _check_spending(run_id: str, spent: float, cap: float | None) -> None:
    """A run already past its cap would stop again after one more stage: refuse."""
    if cap is not None and spent > cap:
        from fabro_git.events.render import format_cost

        raise ConfigError(
            f"run {run_id} has spent about {format_cost(spent)}, past its cap of {format_cost(cap)}",
            hint=f"continue with a higher cap: `git fabro resume {run_id} --max-cost USD`",
        )


def _fixes(
    repo: GitRepo, run_id: str, stored: StoredRun, rebase: str | None, workflow: str | None
) -> Fixes:
    """What `--rebase` and `--workflow` bring in, checked before anything changes."""
    from fabro_git.engine import fixes

    found = fixes.Fixes()
    manifest, cp = stored.manifest, stored.checkpoint
    if rebase is not None:
        found.rebase = fixes.resolve_rebase(repo, rebase, run_id)
        fixes.check_rebase(repo, run_id, manifest, found.rebase)
    if workflow is not None:
        path = resolve_workflow(workflow)
        graph = _validated(path)
        fixes.check_workflow(graph, cp, path, run_id)
        _render(graph, manifest.goal, dict(manifest.inputs))
        found.workflow = fixes.NewWorkflow(graph=graph, source=graph.source, path=path)
    return found


def _run_branch_name(manifest: Manifest) -> str:
    from fabro_git.store import runs as runrefs

    return manifest.run_branch or runrefs.meta_ref(manifest.run_id)


def _resolve_or_restore(repo: GitRepo, prefix: str, resolve: Callable[[GitRepo, str], str]) -> str:
    """The run `prefix` names; failing that, a run whose meta ref was deleted but whose
    scratch dir is left, its ref put back where its scratch and branch prove it was."""
    from fabro_git.engine.lost_meta import find_lost_run, restore_lost_run
    from fabro_git.errors import RunNotFound

    try:
        return resolve(repo, prefix)
    except RunNotFound as err:
        lost = find_lost_run(repo, prefix)
        if lost is None:
            raise
        if lost.sha is None:
            raise RunNotFound(
                f"run {lost.run_id} has no metadata ref (refs/fabro/meta/{lost.run_id}), and "
                f"its last snapshot cannot be found: {lost.detail}",
                hint=f"fetch the run from a remote that has it (git fabro fetch origin "
                f"{lost.run_id}); its scratch dir is {lost.scratch}",
            ) from err
        line = restore_lost_run(repo, lost)
        print(
            f"run {lost.run_id} had lost its metadata ref; put it back from the run's "
            f"scratch dir and branch: {line}",
            file=sys.stderr,
        )
        return lost.run_id
