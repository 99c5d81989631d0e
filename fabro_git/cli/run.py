"""`git fabro run` and `git fabro resume`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fabro_git.errors import ConfigError, FabroError, WorkflowError, disk_full_in

if TYPE_CHECKING:
    from fabro_git.store.repo import GitRepo
    from fabro_git.workflow import Graph


@contextlib.contextmanager
def _disk_full_names_the_run(run_id: str) -> Iterator[None]:
    """A full disk during a run ends with the run id and how to resume it."""
    try:
        yield
    except Exception as exc:
        disk_full = disk_full_in(exc)
        if disk_full is None:
            raise
        raise disk_full.for_run(run_id) from None


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} expects KEY=VALUE, got {value!r}")
        out[key.strip()] = rest
    return out


def resolve_workflow(arg: str) -> Path:
    """The workflow file `arg` names: a path, or a project, personal or shipped
    workflow's name (`fabro_git.cli._workflows`)."""
    from fabro_git.cli._workflows import named_workflows, repository_root, workflow_path

    path = workflow_path(arg)
    if path.exists():
        return path
    names = sorted({w.name for w in named_workflows(repository_root())})
    raise ConfigError(
        f"no workflow file {arg!r}, and no workflow has that name",
        hint="pass a path to a .fabro or run.toml file, or a workflow's name (see "
        "`git fabro workflow list`): " + ", ".join(names),
    )


def stdin_answers() -> bool:
    """Whether human gates may read answers from stdin: a terminal, or a pipe or file
    (`printf 'R\\nA\\n' | git fabro run ...`, one answer a line). /dev/null and a
    closed stdin are not: their gates fail closed at once."""
    import stat

    try:
        if sys.stdin is None or sys.stdin.isatty():
            return sys.stdin is not None
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _build_spec(
    workflow: str,
    *,
    repo_root: Path,
    goal: str | None,
    goal_file: Path | None,
    inputs: list[str],
    labels: list[str],
    options: Any,
    allow_typos: bool = False,
    permissions: str | None = None,
) -> Any:
    from fabro_git.config.run_config import effective_config, flag_layer, load_layer
    from fabro_git.config.trust import default_layers
    from fabro_git.engine.session import RunSpec

    path = resolve_workflow(workflow)
    if goal_file is not None:
        from fabro_git.files import UnreadableFile, read_input_text

        try:
            goal = read_input_text(goal_file).strip()
        except UnreadableFile as err:
            raise ConfigError(f"--goal-file {goal_file}: {err.detail}") from None
    layers = [
        flag_layer(
            goal=goal,
            inputs=_pairs(inputs, "--input"),
            labels=_pairs(labels, "--label"),
            model=options.model,
            provider=options.provider,
            push_remote=options.push_remote,
            max_cost=options.max_cost,
            permissions=check_permissions(permissions),
        )
    ]
    if path.suffix == ".toml":
        layers.append(load_layer(path, "run config", run_config=True))
    from fabro_git.config.trust import ask_on_terminal

    layers += default_layers(repo_root, ask=ask_on_terminal("Trust this file and run?"))
    config = effective_config(layers)
    if config.graph is not None:
        if not os.path.lexists(config.graph):  # a special file gets the reader's words
            from fabro_git.config.run_config import line_of
            from fabro_git.errors import SourceError

            raise SourceError(
                f"[workflow] graph points at {config.graph}, which does not exist",
                path=path,
                line=line_of(path, ["workflow", "graph"]),
                hint="graph is relative to the run config's directory (default: workflow.fabro)",
            )
        path = config.graph
    run_cfg = config.run
    options.push_remote = run_cfg.git.push_remote if run_cfg.git else None
    options.max_cost = run_cfg.max_cost
    graph = _validated(path, allow_typos=allow_typos)
    from fabro_git.engine.session import check_options
    from fabro_git.engine.templating import render_goal
    from fabro_git.workflow.templates import check_input_names, check_script_values

    merged_inputs = dict(run_cfg.inputs)
    check_input_names(merged_inputs)
    goal = run_cfg.goal if run_cfg.goal is not None else render_goal(graph, inputs=merged_inputs)
    _render(graph, goal, merged_inputs)
    # Prepare steps of a run config are shell as written (not templates): they read
    # $FABRO_GOAL and $FABRO_INPUT_* like every script.
    setup = [step.shell() for step in run_cfg.prepare.steps] if run_cfg.prepare else []
    graph_setup = graph.attrs.get("setup")
    if graph_setup:
        setup = [line.strip() for line in graph_setup.splitlines() if line.strip()] + setup
    if setup or any(n.get("script") or n.get("tool_command") for n in graph.nodes.values()):
        check_script_values(goal, merged_inputs)
    if run_cfg.model is not None:
        from fabro_git.engine.model_choice import flag_provider

        flag_model = options.model if options.provider is None else None
        options.model = run_cfg.model.name
        options.provider = run_cfg.model.provider
        if flag_model:
            options.provider = flag_provider(flag_model, options.provider)
    check_options(
        options,
        graph,
        run_cfg.model.fallbacks if run_cfg.model else None,
        cli_command=run_cfg.agent.cli_command if run_cfg.agent else None,
    )
    if not options.dry_run:
        from fabro_git.engine.lifecycle import check_hook_models

        check_hook_models(
            run_cfg.hooks, model=options.model, provider=options.provider, env=os.environ
        )
    return RunSpec(
        graph=graph,
        # What was validated, not a second read that could see another file.
        source=graph.source,
        workflow_path=path.resolve(),
        goal=goal,
        inputs=merged_inputs,
        labels=dict(run_cfg.labels),
        options=options,
        setup_commands=setup,
        exclude_globs=list(run_cfg.checkpoint.exclude_globs) if run_cfg.checkpoint else [],
        settings=config.settings(),
    )


def _validated(path: Path, *, allow_typos: bool = False) -> Any:
    """The workflow at `path`, its warnings printed; a `WorkflowError` listing its
    errors, which refuse a run (and a resume's `--workflow`), and so do its typos
    unless `allow_typos`."""
    from fabro_git.workflow import load
    from fabro_git.workflow.validation import validate

    graph = load(path)
    diagnostics = validate(graph)
    _print_warnings(path, diagnostics)
    errors = [d for d in diagnostics if d.severity == "error"]
    if errors:
        lines = [
            f"{path}:{d.line or 0}:{d.column or 0}: error: [{d.rule}] {d.message}" for d in errors
        ]
        raise WorkflowError(
            f"the workflow has {len(errors)} error(s) and cannot run:\n" + "\n".join(lines),
            path=path,
            hint=f"see `git fabro validate {path}`",
        )
    if not allow_typos:
        _refuse_typos(path, diagnostics)
    return graph


def _render(graph: Graph, goal: str, inputs: dict[str, str]) -> None:
    """Take the files the workflow names and render its templates (and its children's,
    which render again each time they run: this finds a missing input in one before
    the run goes on)."""
    from fabro_git.engine.templating import render_graph
    from fabro_git.workflow.paths import descendants

    _take_named_files(graph)
    render_graph(graph, goal=goal, inputs=inputs)
    for child in descendants(graph):
        render_graph(child, goal=goal, inputs=inputs)


def _print_warnings(path: Path, diagnostics: list[Any]) -> None:
    """Warnings do not stop a run, but a typo they catch (`test -> exti`) would only show
    itself stages later: print them, as `validate` does, before anything starts."""
    from fabro_git.cli.validate import format_diagnostic

    for diagnostic in diagnostics:
        if diagnostic.severity == "warning":
            print(format_diagnostic(path, diagnostic), file=sys.stderr)


def _refuse_typos(path: Path, diagnostics: list[Any]) -> None:
    """A typo with a close known spelling runs, but not as meant: an ignored `promt=`
    makes the stage an agent with no instruction, a misspelt `conditon=` makes its edge
    unconditional. Stop before the run costs anything, and name each fix."""
    from fabro_git.workflow.validation import typos

    slips = typos(diagnostics)
    if not slips:
        return
    lines = []
    for slip in slips:
        assert slip.typo is not None
        written, meant = slip.typo
        child = " (in its child workflow)" if slip.rule == "child_workflow" else ""
        lines.append(
            f"  {path}:{slip.line or 0}:{slip.column or 0}: {written!r} -> {meant!r}{child}"
        )
    count = f"{len(slips)} typo" + ("" if len(slips) == 1 else "s")
    raise WorkflowError(
        f"{count} found; as written the workflow would not do what they mean, so "
        "nothing ran:\n" + "\n".join(lines),
        path=path,
        hint="fix them as shown, or pass --allow-typos to run the workflow as it stands",
    )


def _take_named_files(graph: Graph) -> None:
    """Read every file the workflow names, once: the run reads them from this snapshot
    (and records it), so what it runs is what was validated, on every machine."""
    from fabro_git.workflow.paths import Origin, collect_files, origin_for

    disk = origin_for(graph)  # the one validation read: the run records what validated
    graph.origin = Origin(relpath=disk.relpath, root=disk.root, snapshot=collect_files(graph))


def _use_run_author(repo: GitRepo, settings: dict[str, Any]) -> None:
    """The run's commits carry `[run.git.author]` when its configuration names one."""
    author = ((settings.get("config") or {}).get("git") or {}).get("author") or {}
    if author:
        repo.override_author(author.get("name"), author.get("email"))


def _renderer(output: str) -> Any:
    from fabro_git.events.render import ProgressRenderer

    return ProgressRenderer(stream=sys.stderr, output=output)


def run(
    workflow: str,
    *,
    goal: str | None,
    goal_file: Path | None,
    inputs: list[str],
    auto_approve: bool,
    answers: list[str],
    dry_run: bool,
    in_place: bool,
    labels: list[str],
    model: str | None,
    provider: str | None,
    detach: bool,
    json_output: bool,
    output: str = "tail",
    push_remote: str | None = None,
    retro: bool = True,
    retro_narrative: bool = False,
    max_cost: float | None = None,
    allow_typos: bool = False,
    permissions: str | None = None,
    reply_node: str | None = None,
    run_id: str | None = None,
) -> int:
    """`run_id` is an id allocated beforehand (`git fabro batch`); a new one otherwise."""
    from fabro_git.cli._streams import outlive_readers
    from fabro_git.engine.runner import Options
    from fabro_git.engine.session import create_run, execute_run, write_json_result
    from fabro_git.handlers import handler_for
    from fabro_git.handlers.hooks import agent_hook_reply
    from fabro_git.store.repo import GitRepo

    outlive_readers()
    options = Options(
        auto_approve=auto_approve,
        answers=list(answers),
        dry_run=dry_run,
        in_place=in_place,
        model=model,
        provider=provider,
        interactive=stdin_answers() and not detach,
        push_remote=check_push_remote(push_remote),
        retro=retro,
        retro_narrative=retro_narrative,
        max_cost=check_max_cost(max_cost),
    )
    repo = GitRepo.discover(Path.cwd())
    repo.require_base()
    spec = _build_spec(
        workflow,
        repo_root=repo.root,
        goal=goal,
        goal_file=goal_file,
        inputs=inputs,
        labels=labels,
        options=options,
        allow_typos=allow_typos,
        permissions=permissions,
    )
    if run_id is not None:
        from fabro_git.store import runs as runrefs

        if not runrefs.is_allocated_id(run_id):
            raise ConfigError(f"--run-id {run_id!r} is not a run id (a ULID)")
        spec.run_id = run_id
    _use_run_author(repo, spec.settings)
    check_answers(spec.graph, options.answers)
    if detach:
        _warn_unanswerable_gates(spec.graph, options)
    from fabro_git import redact

    redact.remember(spec.inputs)
    _remember_config_secrets(spec.settings)
    opened = create_run(repo, spec, warn=_warn)
    run_id, manifest = opened.run_id, opened.manifest
    from fabro_git.config.trust import record_run_config

    record_run_config(repo.root, run_id, manifest.settings)
    if detach:
        opened.lock.release()
        opened.bus.close()
        _spawn_detached(repo, run_id, options)
        if json_output:
            from fabro_git.engine.session import RunResult

            write_json_result(
                RunResult(run_id, "running", manifest.run_branch, manifest.meta_ref, None)
            )
        else:
            print(run_id)
        return 0
    print(f"run {run_id} started", file=sys.stderr)
    renderer = _renderer(output)
    if output == "all" or renderer.live:
        options.on_output = renderer.command_line
    with _disk_full_names_the_run(run_id):
        result = execute_run(
            repo,
            run_id,
            options=options,
            renderer=renderer,
            resuming=False,
            handlers=handler_for,
            agent_hooks=agent_hook_reply,
            prepared=opened,
        )
    if reply_node is not None:
        _print_reply(result, json_output, repo, reply_node)
        return _report(result, False, repo, manifest.base_sha, shown=True)
    return _report(result, json_output, repo, manifest.base_sha, shown=True)


def _print_reply(result: Any, json_output: bool, repo: Any, node: str) -> None:
    """The reply of the run's `node` on stdout (`git fabro exec`): as it is, or in the
    run's JSON object as `reply`."""
    import json

    from fabro_git.engine.reader import open_run
    from fabro_git.terminal import json_printable, printable

    reply = ""
    try:
        run = open_run(repo, result.run_id)
        stage = run.stage(node)
        reply = (run.stage_file(stage, "response.md") or b"").decode("utf-8", "replace")
    except FabroError:
        pass  # the stage never answered: the report below says why
    if json_output:
        document = {**result.to_json(), "reply": reply}
        sys.stdout.write(json_printable(json.dumps(document)) + "\n")
    elif reply:
        sys.stdout.write(printable(reply).rstrip("\n") + "\n")
    sys.stdout.flush()


def check_push_remote(remote: str | None) -> str | None:
    """`--push REMOTE` names a remote (or a URL) as `git push` takes it."""
    if remote is not None and (not remote.strip() or remote.startswith("-") or "\n" in remote):
        raise ConfigError(
            f"--push {remote!r} cannot name a git remote",
            hint="pass a remote name such as origin (see `git remote -v`)",
        )
    return remote


def check_permissions(level: str | None) -> str | None:
    """`--permissions LEVEL` names one of the agents' permission levels."""
    from fabro_git.agent.permissions import LEVELS, check_level

    if level is not None and check_level(level) is None:
        raise ConfigError(
            f"--permissions {level!r} is no permission level",
            hint=f"pass one of {', '.join(LEVELS)}",
        )
    return level


def check_max_cost(usd: float | None) -> float | None:
    """`--max-cost USD` is a positive amount of US dollars."""
    import math

    if usd is not None and not (usd > 0 and math.isfinite(usd)):
        raise ConfigError(
            f"--max-cost {usd:g} is no amount to spend",
            hint="pass US dollars above zero, say --max-cost 5",
        )
    return usd


def check_answers(graph: Graph, answers: list[str]) -> None:
    """Every `--answer` must be one that some gate of the workflow can take: a typo
    would otherwise fail the run at its gate, after all the stages before it ran."""
    from fabro_git.handlers.human import gate_choices, match
    from fabro_git.workflow.model import HUMAN, MANAGER_LOOP

    nodes = list(graph.nodes.values())
    if not answers or any(node.handler_type == MANAGER_LOOP for node in nodes):
        return  # a child workflow's gates are not known until it runs
    gates = {node.id: gate_choices(graph, node) for node in nodes if node.handler_type == HUMAN}
    if any(choice.freeform for choices in gates.values() for choice in choices):
        return
    for answer in answers:
        if not any(match(answer, choices) for choices in gates.values()):
            known = "; ".join(
                f"{gate}: " + ", ".join(c.label for c in choices) for gate, choices in gates.items()
            )
            raise ConfigError(
                f"--answer {answer!r} matches no choice of any human gate"
                + (f" ({known})" if known else " (this workflow has none)"),
                hint="answer with a choice's key (A), its label, or its target node",
            )


def _warn_unanswerable_gates(graph: Graph, options: Any) -> None:
    """A detached run has no terminal: a gate with no answer queued fails closed."""
    from fabro_git.workflow.model import HUMAN

    if options.auto_approve:
        return
    gates = [node.id for node in graph.nodes.values() if node.handler_type == HUMAN]
    if len(gates) > len(options.answers):
        _warn(
            f"this workflow has human gates ({', '.join(gates)}) and a detached run cannot ask"
            " at a terminal; each gate with no --answer left waits for an answer from"
            " `git fabro attach RUN` (or queue answers with --answer TEXT, or pass --auto-approve)"
        )


def _report(result: Any, json_output: bool, repo: GitRepo, base_sha: str, *, shown: bool) -> int:
    """After the run: where its result is, or what to do about it. `shown` says the
    progress display already printed the failure, so it is not printed again."""
    from fabro_git.engine.session import write_json_result

    if json_output:
        write_json_result(result)
    run_id = result.run_id
    if result.status == "interrupted" and result.error:
        # Stopped at its spending cap: a plain resume would stop again at once.
        print(
            f"run {run_id} stopped: {result.error}; continue it with"
            f" `git fabro resume {run_id} --max-cost USD` (a higher cap)",
            file=sys.stderr,
        )
    elif result.status == "interrupted":
        if not shown:  # else the run's own notice said it, with the resume command
            print(
                f"run {run_id} interrupted; resume it with `git fabro resume {run_id}`",
                file=sys.stderr,
            )
    elif result.error:
        if not shown:
            from fabro_git import redact
            from fabro_git.terminal import printable

            error = printable(redact.for_process().mask_text(result.error))
            print(f"error: run {run_id} failed: {error}", file=sys.stderr)
        print(
            f"hint: see what happened with `git fabro logs {run_id} --pretty`;"
            f" {_fix_hint(repo, run_id)}",
            file=sys.stderr,
        )
    elif result.run_branch and result.final_git_commit_sha and not json_output:
        _where_the_result_is(repo, run_id, result.run_branch, base_sha, result.final_git_commit_sha)
    code: int = result.exit_code
    return code


def _fix_hint(repo: GitRepo, run_id: str) -> str:
    """How to continue a failed run after fixing its cause: a stage that failed is
    fixed in the repository (`--rebase`), a walk that could not go on (no route, a
    visit limit) in the workflow (`--workflow`)."""
    from fabro_git.engine import outcome
    from fabro_git.engine.session import load_run

    plain = f"fix the cause and `git fabro resume {run_id}`"
    try:
        manifest, cp, _meta, _source = load_run(repo, run_id)
    except FabroError:
        return plain
    if manifest.in_place:
        return plain
    last = cp.node_outcomes.get(cp.next_node_id or "")
    failed = last is not None and last["status"] == outcome.FAILED
    if failed:
        base = manifest.base_branch or manifest.base_sha[:12]
        return f"commit a fix and `git fabro resume {run_id} --rebase {base}`"
    return f"correct the workflow and `git fabro resume {run_id} --workflow FILE`"


def _where_the_result_is(repo: GitRepo, run_id: str, branch: str, base: str, tip: str) -> None:
    try:
        commits, files = repo.change_summary(base, tip)
    except FabroError:
        return
    changed = f"{files} file{'s' if files != 1 else ''} changed" if files else "no files changed"
    lines = [f"Result: branch {branch}, {commits} commit{'s' if commits != 1 else ''}, {changed}"]
    if files:
        lines.append(f"  review:   git fabro diff {run_id[:12]}")
        lines.append(f"  take it:  git merge --squash {branch}")
    spent = _model_use(repo, run_id)
    if spent:
        lines.append(f"  model:    {spent}")
    lines.append(
        f"  details:  git fabro logs {run_id[:12]} --pretty   git fabro inspect {run_id[:12]}"
    )
    from fabro_git.terminal import printable

    # The branch name is the manifest's: a fetched run's, for `attach`.
    print(printable("\n".join(lines)), file=sys.stderr)


def _model_use(repo: GitRepo, run_id: str) -> str | None:
    """The run's tokens and cost as its last checkpoint records them, or None when it
    called no model."""
    import msgspec

    from fabro_git.engine.checkpoint import Checkpoint
    from fabro_git.events.render import format_cost
    from fabro_git.store import runs as runrefs

    try:
        tip = repo.read_ref(runrefs.meta_ref(run_id))
        data = repo.read_file(tip, runrefs.CHECKPOINT) if tip else None
        cp = msgspec.json.decode(data, type=Checkpoint) if data else None
    except (FabroError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    if cp is None or not cp.tokens.total_tokens:
        return None
    tokens = cp.tokens
    text = (
        f"{tokens.total_tokens:,} tokens ({tokens.input_tokens:,} in / "
        f"{tokens.output_tokens:,} out)"
    )
    return text + (f", about {format_cost(cp.total_cost)}" if cp.total_cost else "")


def _recorded_max_cost(settings: dict[str, Any]) -> float | None:
    """The cap the run's configuration set (`--max-cost` or `[run] max_cost`)."""
    value = (settings.get("config") or {}).get("max_cost")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _check_spending(run_id: str, spent: float, cap: float | None) -> None:
    """A run already past its cap would stop again after one more stage: refuse."""
    if cap is not None and spent > cap:
        from fabro_git.events.render import format_cost

        raise ConfigError(
            f"run {run_id} has spent about {format_cost(spent)}, past its cap of {format_cost(cap)}",
            hint=f"continue with a higher cap: `git fabro resume {run_id} --max-cost USD`",
        )


def _fixes(
    repo: GitRepo, run_id: str, stored: Any, rebase: str | None, workflow: str | None
) -> Any:
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


def _spawn_detached(repo: GitRepo, run_id: str, options: Any, fixes: Any = None) -> None:
    from fabro_git.config.locations import make_private_dir, open_private, run_scratch_dir
    from fabro_git.engine.lock import mark_starting

    argv = [sys.executable, "-m", "fabro_git", "resume", run_id, "--detached-child"]
    if options.auto_approve:
        argv.append("--auto-approve")
    for answer in options.answers:
        argv += ["--answer", answer]
    if options.push_remote:
        argv += ["--push", options.push_remote]
    if not options.retro:
        argv.append("--no-retro")
    if options.max_cost is not None:
        argv += ["--max-cost", repr(options.max_cost)]
    if fixes is not None and fixes.rebase is not None:
        argv += ["--rebase", fixes.rebase.sha]
    if fixes is not None and fixes.workflow is not None:
        argv += ["--workflow", str(fixes.workflow.path.resolve())]
    log = make_private_dir(run_scratch_dir(Path(repo.git_dir), run_id)) / "detached.log"
    with open(open_private(log, os.O_WRONLY | os.O_APPEND), "ab") as out:
        child = subprocess.Popen(
            argv,
            cwd=repo.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=dict(os.environ),
        )
    mark_starting(Path(repo.git_dir), run_id, child.pid)


def _remember_config_secrets(settings: dict[str, Any]) -> None:
    """Mask the credentials the run's configuration holds or hands its stages, on a
    resume as on the run's start."""
    import msgspec

    from fabro_git import redact
    from fabro_git.config.run_config import config_secrets

    # A manifest of another version may not convert: then it has nothing to add.
    with contextlib.suppress(msgspec.ValidationError):
        redact.remember_values(config_secrets(settings))


def _run_branch_name(manifest: Any) -> str:
    from fabro_git.store import runs as runrefs

    return manifest.run_branch or runrefs.meta_ref(manifest.run_id)


def _resolve_or_restore(repo: GitRepo, prefix: str, resolve: Callable[[Any, str], str]) -> str:
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
    from fabro_git.cli._runs import resolve_run
    from fabro_git.cli._streams import outlive_readers
    from fabro_git.engine.replication import push_remote_of
    from fabro_git.engine.runner import Options
    from fabro_git.engine.session import check_resumable, execute_run, load_run
    from fabro_git.events import catalogue as ev
    from fabro_git.handlers import handler_for
    from fabro_git.handlers.hooks import agent_hook_reply
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    outlive_readers()
    repo = GitRepo.discover(Path.cwd())
    known = set(runrefs.list_run_ids(repo))
    full_id = _resolve_or_restore(repo, run_id, resolve_run)
    stored = load_run(repo, full_id)
    manifest, cp, _meta, _source = stored
    # A run this repository did not have was found on origin and fetched on demand.
    fetched = (
        [] if full_id in known else [ev.GitFetch(branch=_run_branch_name(manifest), success=True)]
    )
    if manifest.superseded_by:
        from fabro_git.errors import FabroError

        raise FabroError(
            f"run {full_id} was rewound: run {manifest.superseded_by} replaced it",
            hint=f"resume that run with `git fabro resume {manifest.superseded_by}`",
        )
    if cp.status in ("succeeded", "partially_succeeded") and not detached_child:
        from fabro_git.terminal import printable

        status = printable(cp.status, one_line=True)
        print(f"run {full_id} already finished ({status}); nothing to resume", file=sys.stderr)
        return 0
    if not detached_child:
        from fabro_git.config.trust import ask_on_terminal, check_run_config

        check_run_config(
            full_id,
            manifest.settings,
            ask=ask_on_terminal("Trust it and resume?"),
            repo_root=repo.root,
        )
    _remember_config_secrets(manifest.settings)
    options = Options(
        auto_approve=auto_approve or bool(manifest.settings.get("auto_approve")),
        answers=list(answers),
        dry_run=bool(manifest.settings.get("dry_run")),
        in_place=manifest.in_place,
        model=manifest.settings.get("model"),
        provider=manifest.settings.get("provider"),
        interactive=stdin_answers() and not detach and not detached_child,
        detached=detached_child,
        push_remote=check_push_remote(push_remote) or push_remote_of(manifest.settings),
        # The run's own choice holds on every resume; --no-retro here adds to it.
        retro=retro and manifest.settings.get("retro") is not False,
        retro_narrative=bool(manifest.settings.get("retro_narrative")),
        # A cap given here holds for this resume; else the run's own.
        max_cost=check_max_cost(max_cost)
        if max_cost is not None
        else _recorded_max_cost(manifest.settings),
    )
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
        _spawn_detached(repo, full_id, options, fixes)
        print(full_id)
        return 0
    _use_run_author(repo, manifest.settings)
    if not detached_child:
        print(f"resuming run {full_id}", file=sys.stderr)
    renderer = None if detached_child else _renderer(output)
    if renderer is not None:
        renderer.stages_before = cp.stage_index  # the end line counts the whole run
    if renderer is not None and (output == "all" or renderer.live):
        options.on_output = renderer.command_line
    with _disk_full_names_the_run(full_id):
        result = execute_run(
            repo,
            full_id,
            options=options,
            renderer=renderer,
            resuming=True,
            handlers=handler_for,
            agent_hooks=agent_hook_reply,
            before=fetched,
            fixes=fixes,
        )
    return _report(result, json_output, repo, manifest.base_sha, shown=not detached_child)
