"""A run config, project config or user settings file that is wrong says where and how:
file, line, key path and what was expected, exit 1 and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git, run_fabro

from fabro_git.config.run_config import parse_layer
from fabro_git.errors import SourceError

GRAPH = """
digraph C {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    say [shape=parallelogram, script="echo hi"]
    start -> say -> exit
}
"""


def config_error(repo: Path, toml: str, *args: str) -> str:
    (repo / "workflow.fabro").write_text(GRAPH)
    (repo / "run.toml").write_text(toml)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "config")
    proc = run_fabro("run", "run.toml", *args, cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not git(repo, "for-each-ref", "refs/fabro").strip(), "a run was started"
    return proc.stderr


def test_unknown_key_names_file_line_and_key_path(repo: Path) -> None:
    err = config_error(
        repo, '_version = 1\n[run]\ngoal = "g"\n\n[run.model]\nname = "m"\nfalbacks = ["a"]\n'
    )
    assert "error: run.toml:7: run.model.falbacks: unknown key" in err


def test_wrong_type_says_what_was_expected(repo: Path) -> None:
    err = config_error(repo, '[run.model]\nname = "m"\nfallbacks = "openai"\n')
    assert "run.toml:3: run.model.fallbacks: expected a list, got a string" in err


def test_wrong_type_inside_a_table_names_the_key(repo: Path) -> None:
    err = config_error(repo, '[run.inputs]\nok = "yes"\ncount = 3\n')
    assert "run.toml:3: run.inputs.count: expected a string, got an integer" in err


def test_wrong_type_in_an_array_of_tables_names_the_entry(repo: Path) -> None:
    err = config_error(
        repo,
        '[[run.hooks]]\nevent = "stage_start"\ncommand = "a"\n'
        '[[run.hooks]]\nevent = "stage_start"\ncommand = "b"\nblocking = "yes"\n',
    )
    assert "run.toml:7: run.hooks[1].blocking: expected a boolean, got a string" in err


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            '[[run.hooks]]\nevent = "stage_begin"\ncommand = "x"\n',
            "run.toml:2: run.hooks[0].event: unknown event 'stage_begin'",
        ),
        (
            '[[run.hooks]]\nevent = "stage_start"\n',
            "run.toml:1: run.hooks[0]: a command hook needs `command`",
        ),
        ('[[run.hooks]]\nevent = "run_complete"\ntype = "http"\n', "a http hook needs `url`"),
        (
            '[[run.hooks]]\nevent = "stage_start"\ncommand = "x"\nmatcher = "(("\n',
            "run.toml:4: run.hooks[0].matcher: not a valid regular expression",
        ),
        (
            '[[run.prepare.steps]]\nscript = "a"\ncommand = ["b"]\n',
            "run.toml:1: run.prepare.steps[0]: a prepare step needs exactly one of",
        ),
        ("_version = 2\n", "run.toml:1: _version: unsupported schema version 2"),
        ("version = 1\n", "run.toml:1: version: unknown key"),
    ],
)
def test_structure_checks(repo: Path, toml: str, expected: str) -> None:
    assert expected in config_error(repo, toml)


def test_invalid_toml_names_line_and_column(repo: Path) -> None:
    err = config_error(repo, '[run]\ngoal = "g"\ninputs = {x = }\n')
    assert "error: run.toml:3:15: invalid TOML: Invalid value" in err


def test_missing_graph_file(repo: Path) -> None:
    err = config_error(repo, '[workflow]\ngraph = "nope.fabro"\n')
    assert (
        f"run.toml:2: [workflow] graph points at {repo / 'nope.fabro'}, which does not exist" in err
    )


def test_missing_default_graph_file(repo: Path) -> None:
    (repo / "runs").mkdir()
    (repo / "runs" / "ci.toml").write_text('[run]\ngoal = "g"\n')
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "config")
    proc = run_fabro("run", "runs/ci.toml", cwd=repo)
    assert proc.returncode == 1
    assert (
        f"runs/ci.toml: [workflow] graph points at {repo / 'runs' / 'workflow.fabro'}"
        in proc.stderr
    )


def test_error_in_project_config_names_that_file(repo: Path) -> None:
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text('[run.checkpoint]\nexclude_globs = "*.log"\n')
    err = config_error(repo, "[run]\n")
    assert (
        f"{repo / '.fabro' / 'project.toml'}:2: run.checkpoint.exclude_globs: expected a list"
        in err
    )


def test_user_settings_cannot_name_a_graph(repo: Path, hermetic_env: Path) -> None:
    settings = hermetic_env / ".config" / "git-fabro" / "settings.toml"
    settings.parent.mkdir(parents=True)
    settings.write_text('_version = 1\n[workflow]\ngraph = "x.fabro"\n')
    err = config_error(repo, "[run]\n")
    assert f"{settings}:2: [workflow] belongs in a run config" in err


def test_bad_user_settings_fail_a_plain_workflow_run_too(repo: Path, hermetic_env: Path) -> None:
    settings = hermetic_env / ".config" / "git-fabro" / "settings.toml"
    settings.parent.mkdir(parents=True)
    settings.write_text("[run\n")
    (repo / "workflow.fabro").write_text(GRAPH)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "wf")
    proc = run_fabro("run", "workflow.fabro", cwd=repo)
    assert proc.returncode == 1
    assert f"{settings}:1:5: invalid TOML" in proc.stderr


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            "[run.agent]\nrequest_retries = 21\n",
            "run.toml:2: run.agent.request_retries: expected a number from 0 to 20, got 21",
        ),
        (
            '[run.agent]\nrequest_retries = 2\nrequest_retry_delay = "soon"\n',
            "run.toml:3: run.agent.request_retry_delay: expected a duration such as 500ms or 2s",
        ),
    ],
)
def test_model_request_retry_settings_are_checked(tmp_path: Path, toml: str, expected: str) -> None:
    with pytest.raises(SourceError) as caught:
        parse_layer(toml, tmp_path / "run.toml", "run config", run_config=True)
    assert expected in str(caught.value)
    good = "[run.agent]\nrequest_retries = 0\nrequest_retry_delay = '0s'\n"
    layer = parse_layer(good, tmp_path / "run.toml", "run config", run_config=True)
    assert layer.data["run"]["agent"] == {"request_retries": 0, "request_retry_delay": "0s"}


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            '[run.agent.mcps.first]\ntype = "stdio"\ncommand = ["a"]\n'
            '[run.agent.mcps.second]\ntype = "stdio"\ncommand = ["b"]\nstartup = "5s"\n',
            "run.toml:7: run.agent.mcps.second.startup: unknown key",
        ),
        (
            '[[run.hooks]]\nevent = "stage_start"\ncommand = "a"\n'
            '[[run.hooks]]\nevent = "stage_start"\ncomand = "b"\n',
            "run.toml:6: run.hooks[1].comand: unknown key",
        ),
        (
            '[run.git.author]\nname = "A"\nmail = "a@b"\n',
            "run.toml:3: run.git.author.mail: unknown key",
        ),
    ],
)
def test_an_unknown_key_is_named_where_it_is(tmp_path: Path, toml: str, expected: str) -> None:
    """In a table of named tables (`[run.agent.mcps.<name>]`) the key is found in the
    table that holds it, not in the first one."""
    with pytest.raises(SourceError) as caught:
        parse_layer(toml, tmp_path / "run.toml", "run config", run_config=True)
    assert expected in str(caught.value)
