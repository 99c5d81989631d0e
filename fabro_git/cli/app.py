"""The typer application: option parsing only.

Each command is a thin typed function that imports its implementation module lazily
(`fabro_git.cli.<command>`), so `git fabro ps` does not pay for the engine's imports.
The commands are registered here in the order `git fabro -h` lists them; `run` and
`resume` are declared in `_run_commands.py` (they share most of their options), the groups
of subcommands in `_groups.py`, and what the declarations share in `_typer.py`.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated

import typer

from fabro_git import __version__
from fabro_git.cli import _groups, _run_commands
from fabro_git.cli._collector import start_collecting
from fabro_git.cli._typer import (
    APP_SETTINGS,
    Command,
    Group,
    PermissionsOption,
    QuietOption,
    RunArg,
    RunCommand,
    output_mode,
)

app = typer.Typer(**APP_SETTINGS)


command = functools.partial(app.command, cls=Command)


def _version_callback(value: bool) -> None:
    if value:
        print(f"git-fabro {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """git fabro: AI-agent workflows in your repository."""


@command()
def validate(
    files: Annotated[
        list[str],
        typer.Argument(help="Workflow files to check.", show_default=False, metavar="FILE..."),
    ],
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail (exit 1) on warnings too, not only errors.")
    ] = False,
) -> None:
    """Check workflow files and print their diagnostics."""
    from fabro_git.cli import validate as impl

    raise typer.Exit(impl.run(files, json_output=json_output, strict=strict))


@command()
def graph(
    file: Annotated[
        str, typer.Argument(help="Workflow file to render.", show_default=False, metavar="FILE")
    ],
    fmt: Annotated[str, typer.Option("--format", help="svg, png or dot.")] = "svg",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")
    ] = None,
    direction: Annotated[
        str | None, typer.Option("--direction", help="lr or tb; overrides rankdir.")
    ] = None,
) -> None:
    """Render a workflow graph through Graphviz."""
    from fabro_git.cli import graph as impl

    raise typer.Exit(impl.run(file, fmt=fmt, output=output, direction=direction))


@command()
def demo(
    directory: Annotated[
        Path | None,
        typer.Argument(
            help="Where to make it (default: a new temporary directory).",
            show_default=False,
            metavar="DIR",
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary repository (a DIR is kept).")
    ] = False,
) -> None:
    """Make a scratch repository and run the hello example in it."""
    from fabro_git.cli import demo as impl

    raise typer.Exit(impl.run(directory, keep=keep))


app.command(cls=RunCommand)(_run_commands.run)
command()(_run_commands.resume)


@command()
def batch(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="The workflow (a file or a name); or `status BATCH`.",
            show_default=False,
            metavar="WORKFLOW | status BATCH",
        ),
    ] = None,
    inputs: Annotated[
        Path | None,
        typer.Option(
            "--inputs",
            help="JSONL or CSV, one run a row: goal and the inputs by key or column.",
            metavar="FILE",
        ),
    ] = None,
    remote: Annotated[
        str | None,
        typer.Option(
            "--remote", help="Replicate every run and the batch to this remote.", metavar="REMOTE"
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run the rows as tasks on a Ray cluster: ADDRESS, `local` or `auto`"
            " (RAY_ADDRESS). Needs --remote and git-fabro[ray].",
            metavar="ADDRESS",
        ),
    ] = None,
    max_parallel: Annotated[
        int,
        typer.Option(
            "--max-parallel",
            help="Runs at once on this machine; LLM stages at once across the batch.",
            metavar="N",
        ),
    ] = 4,
    labels: Annotated[
        list[str] | None,
        typer.Option("--label", help="KEY=VALUE label of every run; repeatable."),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per run.")
    ] = False,
    resume: Annotated[
        str | None,
        typer.Option("--resume", help="Go on with the unfinished runs of BATCH.", metavar="BATCH"),
    ] = None,
) -> None:
    """Run a workflow once per row of an inputs file; `batch status BATCH` shows a batch."""
    from fabro_git.cli import batch as impl
    from fabro_git.errors import ConfigError

    words = args or []
    if words[:1] == ["status"] and not Path("status").exists():
        if len(words) != 2:
            raise ConfigError("git fabro batch status takes one batch id")
        raise typer.Exit(impl.status(words[1], json_output=json_output))
    if len(words) > 1:
        raise ConfigError(f"git fabro batch takes one workflow, not {len(words)}")
    raise typer.Exit(
        impl.run(
            words[0] if words else None,
            inputs=inputs,
            remote=remote,
            ray=ray,
            max_parallel=max_parallel,
            labels=labels or [],
            json_output=json_output,
            resume=resume,
        )
    )


@command()
def ps(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print JSON lines, one run each.")
    ] = False,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="status=S[,S...], workflow=TEXT or label=NAME=VALUE; repeatable, all must hold.",
            metavar="KEY=VALUE",
        ),
    ] = None,
) -> None:
    """List every run in this repository."""
    from fabro_git.cli import ps as impl

    raise typer.Exit(impl.run(json_output=json_output, filters=filters or []))


@command()
def logs(
    run_id: RunArg,
    pretty: Annotated[bool, typer.Option("--pretty", help="Render events for people.")] = False,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing events of a live run.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="With --pretty, show bookkeeping events too.")
    ] = False,
    tail: Annotated[
        int | None, typer.Option("-n", "--tail", help="Only the last N events.", metavar="N")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Only events newer than this (30s, 10m, 2h, 1d).", metavar="DURATION"
        ),
    ] = None,
) -> None:
    """Print a run's events as JSON lines."""
    from fabro_git.cli import logs as impl

    raise typer.Exit(
        impl.run(run_id, pretty=pretty, follow=follow, verbose=verbose, tail=tail, since=since)
    )


@command()
def events(
    runs: Annotated[
        list[str] | None,
        typer.Argument(
            help="Runs (ids, prefixes or workflow names); every run when none is given.",
            show_default=False,
            metavar="RUN...",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Keep printing events until the runs end (or, of every run, ever).",
        ),
    ] = False,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="event=NAME (a glob: 'agent.*') or node=ID; repeatable: any value of a key, every key.",
            metavar="KEY=VALUE",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Only events newer than this (30s, 10m, 2h, 1d).", metavar="DURATION"
        ),
    ] = None,
) -> None:
    """Print the events of runs (or of every run) as JSON lines, as logs does."""
    from fabro_git.cli import events as impl

    raise typer.Exit(impl.run(runs or [], follow=follow, filters=filters or [], since=since))


@command()
def inspect(
    run_id: RunArg,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    retro: Annotated[
        bool, typer.Option("--retro", help="Show the run's retro: each stage, and the totals.")
    ] = False,
) -> None:
    """Show a run's manifest, checkpoint and status."""
    from fabro_git.cli import inspect as impl

    if retro:
        raise typer.Exit(impl.show_retro(run_id, json_output=json_output))
    raise typer.Exit(impl.run(run_id, json_output=json_output))


@command()
def fetch(
    remote: Annotated[
        str, typer.Argument(help="Remote to fetch from.", metavar="REMOTE")
    ] = "origin",
    run_id: Annotated[
        str | None,
        typer.Argument(
            help="Fetch only this run (an id or a prefix the remote resolves).",
            show_default=False,
            metavar="RUN",
        ),
    ] = None,
) -> None:
    """Fetch runs' refs (refs/fabro/* and fabro/run/*) from a remote, and say how many came."""
    from fabro_git.cli import sync as impl

    raise typer.Exit(impl.fetch(remote, run_id))


@command()
def push(
    remote: Annotated[str, typer.Argument(help="Remote to push to.", metavar="REMOTE")] = "origin",
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(help="Runs to push (default: all).", show_default=False, metavar="RUN..."),
    ] = None,
) -> None:
    """Push runs' branches and metadata refs to a remote, never forced."""
    from fabro_git.cli import sync as impl

    raise typer.Exit(impl.push(remote, run_ids or []))


@command()
def show(
    run_id: Annotated[
        str,
        typer.Argument(
            help="Run id or unique prefix (or a workflow name: its latest run).",
            show_default=False,
            metavar="RUN",
        ),
    ],
    node: Annotated[
        str | None,
        typer.Argument(
            help="One stage: NODE (its latest visit) or NODE@VISIT.",
            show_default=False,
            metavar="NODE[@VISIT]",
        ),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="The run's bytes unchanged, escapes and all (for pipes, not terminals)."
        ),
    ] = False,
) -> None:
    """Show a run's stages, or what one stage did: its output, prompt and response."""
    from fabro_git.cli import show as impl

    raise typer.Exit(impl.run(run_id, node, raw=raw))


@command()
def wait(
    run_id: RunArg,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            help="Give up after this long (90 seconds, 30s, 10m, 2h); exit 124.",
            metavar="DURATION",
        ),
    ] = None,
) -> None:
    """Wait for a run to end, and exit as it did (0, 1, or 130 when interrupted)."""
    from fabro_git.cli import wait as impl

    raise typer.Exit(impl.run(run_id, timeout=timeout))


@command()
def attach(
    run_id: RunArg,
    quiet: QuietOption = False,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Show each command stage's whole output.")
    ] = False,
) -> None:
    """Follow a live run's progress and answer its human gates from this terminal."""
    from fabro_git.cli import attach as impl

    raise typer.Exit(impl.run(run_id, output=output_mode(quiet, verbose)))


@command()
def serve(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on; other than loopback, anyone who can reach it and has the token can act on runs.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on (0 picks a free one).", metavar="N")
    ] = 8765,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the page in the default browser.")
    ] = False,
) -> None:
    """Watch and steer this repository's runs in a browser, live."""
    from fabro_git.cli import serve as impl

    raise typer.Exit(impl.run(host=host, port=port, open_browser=open_browser))


@command()
def interrupt(run_id: RunArg) -> None:
    """Stop a live run at a checkpoint; `resume` continues it."""
    from fabro_git.cli import control as impl

    raise typer.Exit(impl.interrupt(run_id))


@command()
def steer(
    run_id: RunArg,
    text: Annotated[
        str,
        typer.Argument(
            help="Guidance for the agent in flight.", show_default=False, metavar="TEXT"
        ),
    ],
) -> None:
    """Send guidance to a live run's agent stage, before its next turn."""
    from fabro_git.cli import control as impl

    raise typer.Exit(impl.steer(run_id, text))


@command()
def fork(
    run_id: RunArg,
    target: Annotated[
        str | None,
        typer.Argument(
            help="Checkpoint: NODE, NODE@VISIT or @N (default: the latest).",
            show_default=False,
            metavar="NODE[@VISIT]",
        ),
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="List the run's checkpoints instead.")
    ] = False,
) -> None:
    """Make a new run that starts from a checkpoint of this one."""
    from fabro_git.cli import fork as impl

    raise typer.Exit(impl.run(run_id, target, list_only=list_only))


@command()
def rewind(
    run_id: RunArg,
    target: Annotated[
        str | None,
        typer.Argument(
            help="Checkpoint: NODE, NODE@VISIT or @N.", show_default=False, metavar="NODE[@VISIT]"
        ),
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="List the run's checkpoints instead.")
    ] = False,
) -> None:
    """Replace a run by a new one from an earlier checkpoint."""
    from fabro_git.cli import rewind as impl

    raise typer.Exit(impl.run(run_id, target, list_only=list_only))


@command()
def dump(
    run_id: RunArg,
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            help="Directory to write (absent or empty).",
            show_default=False,
            metavar="DIR",
        ),
    ],
) -> None:
    """Export a run's recorded state to a directory of plain files."""
    from fabro_git.cli import dump as impl

    raise typer.Exit(impl.run(run_id, output))


@command()
def diff(
    run_id: RunArg,
    node: Annotated[
        str | None,
        typer.Argument(
            help="Only this stage's changes: NODE or NODE@VISIT.",
            show_default=False,
            metavar="NODE[@VISIT]",
        ),
    ] = None,
    stat: Annotated[
        bool, typer.Option("--stat", help="Show a diffstat instead of the patch.")
    ] = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="git's bytes unchanged, control characters in the run's files included"
            " (for `git apply`).",
        ),
    ] = False,
) -> None:
    """Show what a run, or one of its stages, changed."""
    from fabro_git.cli import diff as impl

    raise typer.Exit(impl.run(run_id, node, stat=stat, raw=raw))


@command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def log(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="A run (id, prefix or workflow name), then options for git log.",
            show_default=False,
            metavar="[RUN] [GIT-LOG-OPTIONS]...",
        ),
    ] = None,
) -> None:
    """git log over a run's metadata ref, or every run's."""
    from fabro_git.cli import log as impl

    raise typer.Exit(impl.run(args or []))


@command()
def doctor(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Check the tools, keys and leftovers runs depend on."""
    from fabro_git.cli import doctor as impl

    raise typer.Exit(impl.run(json_output=json_output))


@command()
def trust(
    yes: Annotated[
        bool, typer.Option("-y", "--yes", help="Trust without asking (read the file first).")
    ] = False,
    revoke: Annotated[
        bool, typer.Option("--revoke", help="Stop trusting this repository's project config.")
    ] = False,
    list_only: Annotated[
        bool, typer.Option("--list", help="List the trusted files and whether they changed.")
    ] = False,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Trust the configuration a run recorded (a fetched run's hooks and servers).",
            metavar="RUN",
        ),
    ] = None,
) -> None:
    """Allow this repository's .fabro/project.toml to run hooks, servers and pushes."""
    from fabro_git.cli import trust as impl

    raise typer.Exit(impl.run(yes=yes, revoke=revoke, list_only=list_only, run_id=run_id))


@command()
def completion(
    shell: Annotated[
        str, typer.Argument(help="bash, zsh or fish.", show_default=False, metavar="SHELL")
    ],
) -> None:
    """Print a shell completion script."""
    import typer.main

    from fabro_git.cli import completion as impl

    raise typer.Exit(impl.run(shell, typer.main.get_command(app)))


@command()
def rm(
    run_ids: Annotated[
        list[str],
        typer.Argument(help="Run ids or unique prefixes.", show_default=False, metavar="RUN..."),
    ],
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Remove without asking.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
) -> None:
    """Remove runs: their refs, worktrees, scratch dirs and lock files."""
    from fabro_git.cli import rm as impl

    raise typer.Exit(impl.run(run_ids, yes=yes, dry_run=dry_run))


@command()
def prune(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Only runs started longer ago than this (30m, 24h, 30d).",
            metavar="DURATION",
        ),
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help="Only runs with these statuses (comma-separated; repeatable).",
            metavar="STATUS",
        ),
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option("--workflow", help="Only runs of this workflow (exact name).", metavar="NAME"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
    yes: Annotated[bool, typer.Option("-y", "--yes", help="Remove without asking.")] = False,
) -> None:
    """Remove old runs (default: older than 24h) and what gone runs left behind."""
    from fabro_git.cli import prune as impl

    raise typer.Exit(
        impl.run(
            older_than=older_than,
            statuses=status or [],
            workflow=workflow,
            dry_run=dry_run,
            yes=yes,
        )
    )


@command("exec")
def exec_prompt(
    prompt: Annotated[
        str, typer.Argument(help="What the agent is to do.", show_default=False, metavar="PROMPT")
    ],
    permissions: PermissionsOption = None,
    model: Annotated[str | None, typer.Option("--model", help="The agent's model.")] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="The agent's provider.")
    ] = None,
    in_place: Annotated[
        bool,
        typer.Option(
            "--in-place", help="Work in this checkout, without a worktree or run-branch commits."
        ),
    ] = False,
    auto_approve: Annotated[
        bool,
        typer.Option("--auto-approve", help="Ask nothing: deny every tool call beyond the level."),
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: the run and its reply.")
    ] = False,
) -> None:
    """Run one agent session on PROMPT here, as a one-stage run."""
    from fabro_git.cli import exec_prompt as impl

    raise typer.Exit(
        impl.run(
            prompt,
            permissions=permissions,
            model=model,
            provider=provider,
            in_place=in_place,
            json_output=json_output,
            auto_approve=auto_approve,
        )
    )


@command()
def init() -> None:
    """Set this repository up: .fabro/project.toml and a first workflow, hello."""
    from fabro_git.cli import workflow as impl

    raise typer.Exit(impl.init())


app.add_typer(_groups.model_app, name="model")
app.add_typer(_groups.workflow_app, name="workflow")
app.add_typer(_groups.artifact_app, name="artifact")


def _add_hooks() -> None:
    from fabro_git.cli.hooks import app as hooks_app

    app.add_typer(hooks_app, name="hooks", cls=Group)


_add_hooks()


def _app_for(args: list[str]) -> typer.Typer:
    """The application to parse `args` with: when they start with a plain command's name,
    one holding that command alone, so the other commands' options are not built (about
    10 ms of every invocation); the whole application otherwise (`-h`, a group such as
    `model`, a typo that wants suggestions)."""
    if not args or args[0].startswith("-"):
        return app
    for info in app.registered_commands:
        if info.callback is None:
            continue
        name = info.name or typer.main.get_command_name(info.callback.__name__)
        if name == args[0]:
            one = typer.Typer(**APP_SETTINGS)
            one.registered_callback = app.registered_callback
            one.registered_commands = [info]
            return one
    return app


def run_app(args: list[str], *, whole: bool = False) -> int:
    """Parse `args` and run the command they name. With `whole`, through the application
    holding every command (what `_app_for` is checked against)."""
    application = app if whole else _app_for(args)
    if args[:1] != ["run"]:
        start_collecting()  # `run` turns it on once its modules are loaded
    try:
        result = application(args=args, prog_name="git fabro", standalone_mode=False)
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", 0))
    except typer.Abort as exc:
        raise KeyboardInterrupt from exc
    except typer.TyperException as exc:  # usage errors: bad option, missing argument
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 1
    return int(result) if isinstance(result, int) else 0
