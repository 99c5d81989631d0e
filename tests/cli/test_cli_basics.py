"""The command itself: entry points, version, help, the man page and the error boundary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, run_fabro

from fabro_git import __version__
from fabro_git.cli import boundary
from fabro_git.errors import FabroError

MAN = ROOT / "man" / "git-fabro.1"


def test_version_through_git_and_python_m() -> None:
    proc = run_fabro("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"git-fabro {__version__}"
    same = subprocess.run(
        [sys.executable, "-m", "fabro_git", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert same.stdout == proc.stdout


def test_short_help_lists_commands() -> None:
    proc = run_fabro("-h")
    assert proc.returncode == 0
    for command in (
        "validate",
        "graph",
        "run",
        "resume",
        "ps",
        "logs",
        "inspect",
        "fetch",
        "push",
        "model",
    ):
        assert re.search(rf"^\s+{command}\b", proc.stdout, re.M), command


def test_usage_error_is_a_clear_exit_1() -> None:
    proc = run_fabro("run", "--no-such-option")
    assert proc.returncode == 1
    assert "No such option" in proc.stderr
    assert "Traceback" not in proc.stderr


def _cli_surface() -> dict[str, list[str]]:
    import typer.main

    from fabro_git.cli.app import app

    group = typer.main.get_command(app)
    surface: dict[str, list[str]] = {}
    commands = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        if getattr(command, "hidden", False):  # `__complete`, for the completion scripts
            continue
        sub = getattr(command, "commands", None)  # a group such as `model`: its subcommands
        commands += [(f"{name} {n}", c) for n, c in sub.items()] if sub else [(name, command)]
    for name, command in commands:
        opts = []
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            opts += [o for o in param.opts if o.startswith("-")]
        surface[name] = opts
    return surface


def test_man_page_documents_every_command_and_option() -> None:
    text = MAN.read_text()
    # roff escapes hyphens as \-; compare on the rendered form.
    plain = text.replace("\\-", "-").replace("\\fB", "").replace("\\fR", "").replace("\\fI", "")
    surface = _cli_surface()
    assert surface, "no commands found"
    missing = []
    for command, options in surface.items():
        section = re.search(rf"^\.SS \"?{command}\b.*?(?=^\.SS |^\.SH )", plain, re.M | re.S)
        if section is None:
            missing.append(f"command {command}")
            continue
        for option in options:
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", section.group(0)):
                missing.append(f"{command} {option}")
    assert not missing, f"missing from man/git-fabro.1: {missing}"
    assert "--version" in plain and "-h" in plain


def test_man_page_is_installed_beside_the_package() -> None:
    share = Path(sys.prefix) / "share" / "man" / "man1" / "git-fabro.1"
    if not share.exists():
        pytest.skip("editable install: setuptools does not install data files")
    assert share.read_text() == MAN.read_text()
    if (
        subprocess.run(["sh", "-c", "command -v man"], capture_output=True, check=False).returncode
        != 0
    ):
        pytest.skip("man is not installed")
    env = dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="100")
    proc = subprocess.run(
        ["git", "fabro", "--help"], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "run AI-agent workflows" in proc.stdout.replace("\u2010", "-")


def test_boundary_maps_user_errors_interrupts_and_bugs(capsys: pytest.CaptureFixture[str]) -> None:
    def user_error() -> int:
        raise FabroError("the thing is wrong", hint="do the other thing")

    assert boundary(user_error) == 1
    err = capsys.readouterr().err
    assert err == "error: the thing is wrong\nhint: do the other thing\n"

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert boundary(interrupted) == 130
    assert "Interrupted" in capsys.readouterr().err

    def bug() -> int:
        raise RuntimeError("kaboom")

    assert boundary(bug) == 3
    err = capsys.readouterr().err
    assert "unexpected error: RuntimeError: kaboom" in err
    log = Path(re.search(r"written to (\S+);", err).group(1))  # type: ignore[union-attr]
    body = log.read_text()
    assert f"git-fabro: {__version__}" in body
    assert "dulwich:" in body and "python:" in body
    assert "RuntimeError: kaboom" in body and "Traceback" in body


def test_commands_outside_a_repository_explain(tmp_path: Path) -> None:
    proc = run_fabro("ps", cwd=tmp_path)
    assert proc.returncode == 1
    assert "not inside a git repository" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_shipped_examples_by_name_in_validate_and_graph(tmp_path: Path) -> None:
    proc = run_fabro("validate", "hello", "parallel-review", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json

    docs = json.loads(proc.stdout)
    assert [d["name"] for d in docs] == ["Hello", "ParallelReview"]
    dot = run_fabro("graph", "branch-loop", "--format", "dot", cwd=tmp_path)
    assert dot.returncode == 0 and dot.stdout.startswith('digraph "BranchLoop"')
    # A path that exists always wins over an example's name.
    (tmp_path / "hello").write_text("not dot at all")
    bad = run_fabro("validate", "hello", cwd=tmp_path)
    assert bad.returncode == 1


def test_usage_lines_help_and_suggestions() -> None:
    from helpers import run_fabro

    run_help = run_fabro("run", "-h")
    assert "Usage: git fabro run [OPTIONS] WORKFLOW\n" in run_help.stdout
    assert "{" not in run_help.stdout.splitlines()[0]
    assert "Shipped examples, runnable by name: branch-loop, hello, human-gate" in run_help.stdout
    validate_help = run_fabro("validate", "-h")
    assert "Usage: git fabro validate [OPTIONS] FILE...\n" in validate_help.stdout
    for typo, suggestion in (
        ("valdate", "'validate'"),
        ("logz", "'log' or 'logs'"),
        ("inpsect", "'inspect'"),
    ):
        proc = run_fabro(typo)
        assert proc.returncode == 1 and f"Did you mean {suggestion}?" in proc.stderr, proc.stderr
    unrelated = run_fabro("prune-everything")
    assert "Did you mean" not in unrelated.stderr and "git fabro -h" in unrelated.stderr


def test_close_names() -> None:
    from fabro_git.suggest import close_names

    assert close_names("exti", ["exit", "start", "test"]) == ["exit"]
    assert close_names("prune", ["run", "ps", "push"]) == []
    assert close_names("scrpt", ["script", "prompt"]) == ["script"]
    assert close_names("outcom", ["outcome", "preferred_label"]) == ["outcome"]
    assert close_names("same", ["same"]) == []


def test_demo_makes_a_repository_and_runs_hello(tmp_path: Path) -> None:
    import json as _json

    from helpers import git, run_fabro

    target = tmp_path / "demo"
    proc = run_fabro("demo", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"demo repository: {target}" in proc.stderr and f"cd {target}" in proc.stderr
    (row,) = [
        _json.loads(line) for line in run_fabro("ps", "--json", cwd=target).stdout.splitlines()
    ]
    assert row["workflow"] == "hello" and row["status"] == "succeeded"
    assert "Hello" in git(target, "show", f"fabro/run/{row['run_id']}:hello.txt")
    again = run_fabro("demo", str(target), cwd=tmp_path)
    assert again.returncode == 1 and "not an empty directory" in again.stderr


def test_demo_refuses_a_file_as_a_file(tmp_path: Path) -> None:
    from helpers import run_fabro

    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    proc = run_fabro("demo", str(afile), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"error: {afile} is a file, not a directory" in proc.stderr, proc.stderr
    assert "not an empty directory" not in proc.stderr and "Traceback" not in proc.stderr
    assert afile.read_text() == "mine\n"


def test_demo_in_a_temporary_directory_leaves_nothing_behind_unless_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from helpers import run_fabro

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    runs = Path(os.environ["FABRO_HOME"]) / "runs"
    proc = run_fabro("demo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(temp.iterdir()) == [] and list(runs.iterdir()) == []
    assert "removed the demo repository" in proc.stderr and "--keep" in proc.stderr
    assert "the commands above have nothing to look at" in proc.stderr
    kept = run_fabro("demo", "--keep", cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    (target,) = temp.iterdir()
    assert (target / ".git").is_dir() and f"cd {target}" in kept.stderr
    assert len(list(runs.iterdir())) == 1
