"""`git fabro run`: a workflow is found, checked and its configuration merged before the
run starts; it then runs here or in a detached child. `git fabro resume` is in `resume.py`;
what the two share is in `_running.py`."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.cli._collector import start_collecting
from fabro_git.cli._running import (
    carried_secrets,
    disk_full_names_the_run,
    progress_renderer,
    remember_config_secrets,
    report,
    spawn_detached,
    stdin_answers,
    use_run_author,
)
from fabro_git.errors import ConfigError, FabroError, WorkflowError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fabro_git.config.run_config import EffectiveConfig, ModelConfig, RunSection
    from fabro_git.engine.finish import RunResult
    from fabro_git.engine.options import Options
    from fabro_git.engine.runs import OpenRun, RunSpec
    from fabro_git.store.repo import GitRepo
    from fabro_git.workflow import Graph
    from fabro_git.workflow.lint_check import Diagnostic


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


def _carried_by_repository(arg: str, path: Path, repo_root: Path) -> bool:
    """Whether `path`, what the workflow argument `arg` named, is a workflow the
    repository carries that the user named by its name (a path typed is their choice,
    and a shipped example or their own workflow is no repository's)."""
    from fabro_git.cli._workflows import WORKFLOWS_DIR

    typed = Path(arg).expanduser()
    if "/" in arg or typed.exists():
        return False
    return path.resolve().is_relative_to((repo_root / WORKFLOWS_DIR).resolve())


def _warn(message: str) -> None:
    from fabro_git.terminal import printable

    # A warning may quote what a sink's endpoint or command answered.
    print(f"warning: {printable(message)}", file=sys.stderr)


def _build_spec(
    workflow: str,
    *,
    repo_root: Path,
    goal: str | None,
    goal_file: Path | None,
    inputs: list[str],
    labels: list[str],
    options: Options,
    allow_typos: bool = False,
    permissions: str | None = None,
) -> RunSpec:
    from fabro_git.engine.session import RunSpec

    path = resolve_workflow(workflow)
    if goal_file is not None:
        goal = _read_goal(goal_file)
    config, path = _configuration(
        path,
        repo_root,
        carried=_carried_by_repository(workflow, path, repo_root),
        goal=goal,
        inputs=inputs,
        labels=labels,
        options=options,
        permissions=permissions,
    )
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
    setup = _setup_commands(graph, run_cfg)
    if setup or any(n.get("script") or n.get("tool_command") for n in graph.nodes.values()):
        check_script_values(goal, merged_inputs)
    if run_cfg.model is not None:
        _take_configured_model(options, run_cfg.model)
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
        config=config,
    )


def _read_goal(goal_file: Path) -> str:
    """`--goal-file`: the goal, read whole and stripped."""
    from fabro_git.files import UnreadableFile, read_input_text

    try:
        return read_input_text(goal_file).strip()
    except UnreadableFile as err:
        raise ConfigError(f"--goal-file {goal_file}: {err.detail}") from None


def _configuration(
    path: Path,
    repo_root: Path,
    *,
    carried: bool = False,
    goal: str | None,
    inputs: list[str],
    labels: list[str],
    options: Options,
    permissions: str | None,
) -> tuple[EffectiveConfig, Path]:
    """The run's configuration, its layers merged (the flags first, then a run config
    the workflow argument names, then the project's and the user's), and the workflow
    file it runs: `[workflow] graph` of a run config, or `path` itself. A run config
    the repository `carried` (found by a workflow's name, not a path the user typed)
    acts only once trusted, as `.fabro/project.toml` does."""
    from fabro_git.config.run_config import effective_config, flag_layer, load_layer
    from fabro_git.config.trust import default_layers

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
    from fabro_git.config.trust import ask_on_terminal, trusted_project_layer

    if path.suffix == ".toml" and carried:
        ask = ask_on_terminal("Trust this file and run?")
        layers.append(trusted_project_layer(repo_root, ask=ask, file=path))
    elif path.suffix == ".toml":
        layers.append(load_layer(path, "run config", run_config=True))

    layers += default_layers(repo_root, ask=ask_on_terminal("Trust this file and run?"))
    config = effective_config(layers)
    if config.graph is None:
        return config, path
    if not os.path.lexists(config.graph):  # a special file gets the reader's words
        from fabro_git.config.toml_source import line_of
        from fabro_git.errors import SourceError

        raise SourceError(
            f"[workflow] graph points at {config.graph}, which does not exist",
            path=path,
            line=line_of(path, ["workflow", "graph"]),
            hint="graph is relative to the run config's directory (default: workflow.fabro)",
        )
    return config, config.graph


def _setup_commands(graph: Graph, run_cfg: RunSection) -> list[str]:
    """The shell lines run before the first stage: the graph's `setup`, then the run
    config's prepare steps."""
    # Prepare steps of a run config are shell as written (not templates): they read
    # $FABRO_GOAL and $FABRO_INPUT_* like every script.
    setup = [step.shell() for step in run_cfg.prepare.steps] if run_cfg.prepare else []
    graph_setup = graph.attrs.get("setup")
    if graph_setup:
        setup = [line.strip() for line in graph_setup.splitlines() if line.strip()] + setup
    return setup


def _take_configured_model(options: Options, model: ModelConfig) -> None:
    """The run config's `[run.model]` is the run's default model; a `--model` flag
    given without `--provider` still chooses the provider."""
    from fabro_git.llm.choice import flag_provider

    flag_model = options.model if options.provider is None else None
    options.model = model.name
    options.provider = model.provider
    if flag_model:
        options.provider = flag_provider(flag_model, options.provider)


def _validated(path: Path, *, allow_typos: bool = False) -> Graph:
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
            hint=f"see `{shlex.join(['git', 'fabro', 'validate', str(path)])}`",
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


def _print_warnings(path: Path, diagnostics: list[Diagnostic]) -> None:
    """Warnings do not stop a run, but a typo they catch (`test -> exti`) would only show
    itself stages later: print them, as `validate` does, before anything starts."""
    from fabro_git.cli.validate import format_diagnostic

    for diagnostic in diagnostics:
        if diagnostic.severity == "warning":
            print(format_diagnostic(path, diagnostic), file=sys.stderr)


def _refuse_typos(path: Path, diagnostics: list[Diagnostic]) -> None:
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
    from fabro_git.store.asked_early import EarlyAnswers

    # Before the engine and dulwich load: git answers on another core meanwhile.
    early = EarlyAnswers.ask(Path.cwd())
    from fabro_git.cli._streams import outlive_readers
    from fabro_git.engine.options import Options
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
    repo = GitRepo.discover(Path.cwd(), early=early)
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
    opened = _create(repo, spec, options, detach=detach)
    start_collecting()
    if detach:
        return _go_on_detached(repo, opened, options, json_output=json_output)
    result = _execute(repo, opened, options, output)
    if reply_node is not None:
        _print_reply(result, json_output, repo, reply_node)
        return report(result, False, repo, opened.manifest.base_sha, shown=True)
    return report(result, json_output, repo, opened.manifest.base_sha, shown=True)


def _create(repo: GitRepo, spec: RunSpec, options: Options, *, detach: bool) -> OpenRun:
    """The new run, recorded and locked, once its answers and secrets are checked."""
    from fabro_git.config.trust import record_run_config
    from fabro_git.engine.session import create_run
    from fabro_git.engine.stored_run import new_run_trust

    use_run_author(repo, spec.config.run)
    check_answers(spec.graph, options.answers)
    if detach:
        _warn_unanswerable_gates(spec.graph, options)
    from fabro_git import redact

    redact.remember(spec.inputs)
    remember_config_secrets(spec.config.run)

    def trusted(run_id: str, files: Mapping[str, bytes]) -> None:
        # Before the run exists: a run cut off as it starts is as trusted as it was.
        record_run_config(repo.root, run_id, new_run_trust(files, spec.graph))

    return create_run(repo, spec, warn=_warn, before_recorded=trusted)


def _go_on_detached(repo: GitRepo, opened: OpenRun, options: Options, *, json_output: bool) -> int:
    """Hands the new run to a child in the background, and says its id."""
    from fabro_git.engine.session import write_json_result

    run_id, manifest = opened.run_id, opened.manifest
    opened.lock.release()
    opened.bus.close()
    spawn_detached(repo, run_id, options, carried=carried_secrets(manifest.goal, manifest.inputs))
    if json_output:
        from fabro_git.engine.session import RunResult

        write_json_result(
            RunResult(run_id, "running", manifest.run_branch, manifest.meta_ref, None)
        )
    else:
        print(run_id)
    return 0


def _execute(repo: GitRepo, opened: OpenRun, options: Options, output: str) -> RunResult:
    """Runs the new run here, its progress shown on stderr."""
    from fabro_git.engine.session import execute_run
    from fabro_git.handlers import handler_for
    from fabro_git.handlers.hooks import agent_hook_reply

    run_id = opened.run_id
    print(f"run {run_id} started", file=sys.stderr)
    renderer = progress_renderer(output)
    if output == "all" or renderer.live:
        options.on_output = renderer.command_line
    with disk_full_names_the_run(run_id):
        return execute_run(
            repo,
            run_id,
            options=options,
            renderer=renderer,
            resuming=False,
            handlers=handler_for,
            agent_hooks=agent_hook_reply,
            prepared=opened,
        )


def _print_reply(result: RunResult, json_output: bool, repo: GitRepo, node: str) -> None:
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
    if level is None:
        return level
    from fabro_git.agent.permissions import LEVELS, check_level

    if check_level(level) is None:
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
    from fabro_git.workflow.model import HUMAN, MANAGER_LOOP

    nodes = list(graph.nodes.values())
    if not answers or any(node.handler_type == MANAGER_LOOP for node in nodes):
        return  # a child workflow's gates are not known until it runs
    from fabro_git.handlers.human import gate_choices, match

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


def _warn_unanswerable_gates(graph: Graph, options: Options) -> None:
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
