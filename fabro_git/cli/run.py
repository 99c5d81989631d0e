"""`git fabro run` and `git fabro resume`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fabro_git.errors import ConfigError, WorkflowError, disk_full_in


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
    from fabro_git.cli._examples import example_names, find_example

    path = Path(arg).expanduser()
    if path.exists():
        return path
    example = find_example(arg)
    if example is not None:
        return example
    raise ConfigError(
        f"no workflow file {arg!r}",
        hint="pass a path to a .fabro or run.toml file, or one of the shipped examples: "
        + ", ".join(example_names()),
    )


def _load_run_config(path: Path) -> dict[str, Any]:
    from fabro_git.files import UnreadableFile, read_input_text

    try:
        data = tomllib.loads(read_input_text(path))
    except UnreadableFile as err:
        raise ConfigError(f"run config {path}: {err.detail}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    version = data.get("_version", 1)
    if version != 1:
        raise ConfigError(f"{path}: unsupported _version {version!r}; this version reads 1")
    return data


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _build_spec(
    workflow: str,
    *,
    goal: str | None,
    goal_file: Path | None,
    inputs: list[str],
    labels: list[str],
    options: Any,
) -> Any:
    from fabro_git.engine.session import RunSpec
    from fabro_git.workflow import load
    from fabro_git.workflow.validation import validate

    path = resolve_workflow(workflow)
    config: dict[str, Any] = {}
    if path.suffix == ".toml":
        config = _load_run_config(path)
        graph_rel = (config.get("workflow") or {}).get("graph", "workflow.fabro")
        config_dir = path.parent
        path = (config_dir / graph_rel).resolve()
        if not path.exists():
            raise ConfigError(f"{workflow}: [workflow].graph points at {path}, which does not exist")
    run_cfg: dict[str, Any] = config.get("run") or {}
    graph = load(path)
    diagnostics = validate(graph)
    errors = [d for d in diagnostics if d.severity == "error"]
    if errors:
        lines = [f"{path}:{d.line or 0}:{d.column or 0}: error: [{d.rule}] {d.message}" for d in errors]
        raise WorkflowError(
            f"the workflow has {len(errors)} error(s) and cannot run:\n" + "\n".join(lines),
            path=path,
            hint=f"see `git fabro validate {path}`",
        )
    if goal_file is not None:
        from fabro_git.files import UnreadableFile, read_input_text

        try:
            goal = read_input_text(goal_file).strip()
        except UnreadableFile as err:
            raise ConfigError(f"--goal-file {goal_file}: {err.detail}") from None
    if goal is None:
        goal = run_cfg.get("goal") or graph.attrs.get("goal") or ""
    merged_inputs = {str(k): str(v) for k, v in (run_cfg.get("inputs") or {}).items()}
    merged_inputs.update(_pairs(inputs, "--input"))
    merged_labels = {str(k): str(v) for k, v in (run_cfg.get("labels") or {}).items()}
    merged_labels.update(_pairs(labels, "--label"))
    setup = [str(s.get("script")) for s in (run_cfg.get("prepare") or {}).get("steps", []) if s.get("script")]
    graph_setup = graph.attrs.get("setup")
    if graph_setup:
        setup = [line.strip() for line in graph_setup.splitlines() if line.strip()] + setup
    excludes = list((run_cfg.get("checkpoint") or {}).get("exclude_globs", []))
    model_cfg = run_cfg.get("model") or {}
    if options.model is None and model_cfg.get("name"):
        options.model = str(model_cfg["name"])
    from fabro_git.engine.session import check_options
    from fabro_git.engine.templating import render_graph

    render_graph(graph, goal=goal, inputs=merged_inputs)
    check_options(options, graph)
    return RunSpec(
        graph=graph,
        # What was validated, not a second read that could see another file.
        source=graph.source,
        workflow_path=path.resolve(),
        goal=goal,
        inputs=merged_inputs,
        labels=merged_labels,
        options=options,
        setup_commands=setup,
        exclude_globs=excludes,
    )


def _renderer() -> Any:
    from fabro_git.events.render import ProgressRenderer

    return ProgressRenderer(stream=sys.stderr)


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
) -> int:
    from fabro_git.engine.runner import Options
    from fabro_git.engine.session import create_run, execute_run, write_json_result
    from fabro_git.store.repo import GitRepo

    options = Options(
        auto_approve=auto_approve,
        answers=list(answers),
        dry_run=dry_run,
        in_place=in_place,
        model=model,
        provider=provider,
        interactive=sys.stdin.isatty() and not detach,
    )
    repo = GitRepo.discover(Path.cwd())
    repo.require_base()
    spec = _build_spec(workflow, goal=goal, goal_file=goal_file, inputs=inputs, labels=labels, options=options)
    run_id, manifest, cp, bus, recorder, scratch, lock = create_run(repo, spec, warn=_warn)
    if detach:
        lock.release()
        bus.close()
        _spawn_detached(repo.root, run_id, options)
        if json_output:
            from fabro_git.engine.session import RunResult

            write_json_result(RunResult(run_id, "running", manifest.run_branch, manifest.meta_ref, None))
        else:
            print(run_id)
        return 0
    print(f"run {run_id} started", file=sys.stderr)
    with _disk_full_names_the_run(run_id):
        result = execute_run(
            repo,
            run_id,
            options=options,
            renderer=_renderer(),
            resuming=False,
            prepared=(manifest, cp, bus, recorder, scratch, lock, spec.graph),
        )
    return _report(result, json_output)


def _report(result: Any, json_output: bool) -> int:
    from fabro_git.engine.session import write_json_result

    if json_output:
        write_json_result(result)
    if result.status == "interrupted":
        print(f"run {result.run_id} interrupted; resume it with `git fabro resume {result.run_id}`", file=sys.stderr)
    elif result.error:
        print(f"error: run {result.run_id} failed: {result.error}", file=sys.stderr)
        print(f"hint: inspect it with `git fabro logs {result.run_id} --pretty`; fix the cause and `git fabro resume {result.run_id}`", file=sys.stderr)
    code: int = result.exit_code
    return code


def _spawn_detached(root: Path, run_id: str, options: Any) -> None:
    from fabro_git.config.locations import run_scratch_dir

    argv = [sys.executable, "-m", "fabro_git", "resume", run_id, "--detached-child"]
    if options.auto_approve:
        argv.append("--auto-approve")
    for answer in options.answers:
        argv += ["--answer", answer]
    log = run_scratch_dir(run_id) / "detached.log"
    with open(log, "ab") as out:
        subprocess.Popen(
            argv,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=dict(os.environ),
        )


def resume(
    run_id: str,
    *,
    auto_approve: bool,
    answers: list[str],
    detach: bool,
    json_output: bool,
    dry_run: bool = False,
    detached_child: bool = False,
) -> int:
    from fabro_git.engine.runner import Options
    from fabro_git.engine.session import execute_run, load_run
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = runrefs.resolve_run_id(repo, run_id)
    manifest, cp, _meta, _source = load_run(repo, full_id)
    if cp.status in ("succeeded", "partially_succeeded") and not detached_child:
        print(f"run {full_id} already finished ({cp.status}); nothing to resume", file=sys.stderr)
        return 0
    options = Options(
        auto_approve=auto_approve or bool(manifest.settings.get("auto_approve")),
        answers=list(answers),
        dry_run=dry_run or bool(manifest.settings.get("dry_run")),
        in_place=manifest.in_place,
        model=manifest.settings.get("model"),
        provider=manifest.settings.get("provider"),
        interactive=sys.stdin.isatty() and not detach and not detached_child,
    )
    if detach:
        _spawn_detached(repo.root, full_id, options)
        print(full_id)
        return 0
    if not detached_child:
        print(f"resuming run {full_id}", file=sys.stderr)
    with _disk_full_names_the_run(full_id):
        result = execute_run(
            repo, full_id, options=options, renderer=None if detached_child else _renderer(), resuming=True
        )
    return _report(result, json_output)
