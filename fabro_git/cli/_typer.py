"""The pieces the command declarations share: the command and group classes, the
application's settings, and the arguments and options several commands take.

They live apart from `app.py` so that the declarations split across modules (`app.py`,
`_run_commands.py`, `_groups.py`) speak with one voice: an option two commands share is
written once, and its help cannot drift between them.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

import typer
from typer import _click  # the click that typer vendors and its classes speak


class Command(typer.core.TyperCommand):
    """Usage lines read `git fabro run [OPTIONS] WORKFLOW`, without braces around the
    required arguments."""

    def collect_usage_pieces(self, ctx: _click.Context) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


class Group(typer.core.TyperGroup):
    """Suggests a command only when the typo is close to it (`valdate`, not `prune`)."""

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        try:
            return self._click_resolve_command(ctx, args)
        except _click.exceptions.UsageError as exc:
            from fabro_git.suggest import close_names

            if args:
                matches = close_names(
                    args[0], [n for n, c in self.commands.items() if not c.hidden]
                )
                if matches:
                    exc.message = (
                        exc.message.rstrip(".")
                        + ". Did you mean "
                        + " or ".join(repr(m) for m in matches)
                        + "?"
                    )
                else:
                    exc.message += " See `git fabro -h` for the commands."
            raise


class RunCommand(Command):
    """`run -h` lists the shipped examples; the list is made only when help is shown."""

    def format_epilog(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        if self.epilog is None:
            from fabro_git.cli._examples import example_names

            names = ", ".join(example_names())
            self.epilog = f"Shipped examples, runnable by name: {names}."
        super().format_epilog(ctx, formatter)


class GroupSettings(TypedDict):
    """What every `typer.Typer` of `git fabro` is given: a group of subcommands
    (`git fabro model list`) shows its help when given none."""

    no_args_is_help: bool
    context_settings: dict[str, list[str]]
    rich_markup_mode: None


class AppSettings(GroupSettings):
    """What the application's own `typer.Typer` is given besides."""

    cls: type[Group]
    name: str
    help: str
    add_completion: bool
    pretty_exceptions_enable: bool


GROUP_SETTINGS = GroupSettings(
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)
APP_SETTINGS = AppSettings(
    **GROUP_SETTINGS,
    cls=Group,
    name="git-fabro",
    help="Run AI-agent workflows written as Graphviz DOT graphs, with all state kept in git.",
    add_completion=False,
    pretty_exceptions_enable=False,
)

# The argument most commands take: a run id, a unique prefix of one, or a workflow name.
RunArg = Annotated[
    str, typer.Argument(help="Run id or unique prefix.", show_default=False, metavar="RUN")
]
PermissionsOption = Annotated[
    str | None,
    typer.Option(
        "--permissions",
        help="Agents' permission level where the workflow sets none: read-only, "
        "read-write (the default) or full.",
        metavar="LEVEL",
    ),
]
# The progress display of a run being followed (`run`, `resume`, `attach`).
QuietOption = Annotated[
    bool, typer.Option("-q", "--quiet", help="Show no command output in the progress display.")
]


def output_mode(quiet: bool, verbose: bool) -> str:
    """The progress display's output mode from `--quiet` and `--verbose`."""
    if quiet and verbose:
        from fabro_git.errors import ConfigError

        raise ConfigError("--quiet and --verbose contradict each other; pass one")
    return "none" if quiet else "all" if verbose else "tail"
