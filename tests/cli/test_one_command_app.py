"""`git fabro CMD ...` parses with an application holding CMD alone (it starts faster):
what a user sees must be exactly what the whole application gives."""

from __future__ import annotations

import pytest
import typer

from fabro_git.cli import app as cli


def _commands() -> list[str]:
    names = []
    for info in cli.app.registered_commands:
        assert info.callback is not None
        names.append(info.name or typer.main.get_command_name(info.callback.__name__))
    return names


def _outcome(capsys: pytest.CaptureFixture[str], args: list[str], *, whole: bool) -> tuple:
    code = cli.run_app(list(args), whole=whole)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_fast_path_is_taken_for_every_plain_command() -> None:
    names = _commands()
    assert {"run", "resume", "logs", "ps", "validate"} <= set(names)
    for name in names:
        one = cli._app_for([name, "-h"])
        assert one is not cli.app, name
        assert [c.callback for c in one.registered_commands] == [
            c.callback
            for c in cli.app.registered_commands
            if (c.name or typer.main.get_command_name(c.callback.__name__)) == name
        ]
    # Groups, options first and unknown words go through the whole application.
    for args in (["model", "list"], ["-h"], ["--version"], ["valdate"], []):
        assert cli._app_for(args) is cli.app, args


@pytest.mark.parametrize(
    "tail",
    [["-h"], ["--no-such-option"], ["--json", "--no-such-option"]],
    ids=["help", "bad-option", "bad-option-after-a-good-one"],
)
def test_every_command_says_the_same_either_way(
    capsys: pytest.CaptureFixture[str], tail: list[str]
) -> None:
    for name in _commands():
        fast = _outcome(capsys, [name, *tail], whole=False)
        whole = _outcome(capsys, [name, *tail], whole=True)
        assert fast == whole, name
        assert fast[1] or fast[2], f"{name} {tail} said nothing"
