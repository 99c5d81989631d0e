"""The CI and Ray documents say what works: the GitHub Actions workflow passes
actionlint (with shellcheck on its scripts), every `git fabro` command line in
docs/ci.md, docs/ray.md, the README's Ray section and the example files parses against
the real CLI, and the KubeRay example is a RayJob that runs a batch on its cluster with
the keys from a Secret."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer.main
import yaml
from helpers import ROOT
from typer import _click  # the click that typer vendors, as app.py uses

from fabro_git.cli.app import app

DOCS = ROOT / "docs"
ACTIONS = DOCS / "examples" / "github-actions.yml"
RAYJOB = DOCS / "examples" / "rayjob.yaml"
CI = DOCS / "ci.md"
RAY = DOCS / "ray.md"
README = ROOT / "README.md"

# A `git fabro` command line, up to where the shell would end it: an unquoted `;`, `&`,
# `|`, `)`, `#`, or the quote or backtick around it.
COMMAND = re.compile(r"""git fabro(?:[^\n'`;&|)#"]|"[^"\n]*"|'[^'\n]*')*""")


# -- actionlint -------------------------------------------------------------------------


def _actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    actionlint, shellcheck = shutil.which("actionlint"), shutil.which("shellcheck")
    assert actionlint and shellcheck, (
        "actionlint and shellcheck come with the test extra: pip install -e '.[test]'"
    )
    return subprocess.run(
        [actionlint, "-no-color", "-shellcheck", shellcheck, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_actions_workflow_passes_actionlint() -> None:
    proc = _actionlint(ACTIONS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = ACTIONS.read_text()
    for setting in ("contents: write", "fetch-depth: 0", "secrets.ANTHROPIC_API_KEY"):
        assert setting in text, setting


@pytest.mark.parametrize(
    ("good", "broken", "said"),
    [
        # An expression naming a step that does not exist.
        ("steps.python.outputs", "steps.pyhton.outputs", '"pyhton" is not defined'),
        # A permission level GitHub does not have.
        ("contents: write", "contents: writ", '"writ"'),
        # A key a job does not have.
        ("runs-on: ubuntu-latest", "run-on: ubuntu-latest", '"run-on"'),
        # A script shellcheck finds fault with: an unquoted variable.
        ('fetch origin "$RUN_ID"', "fetch origin $RUN_ID", "SC2086"),
    ],
)
def test_actionlint_fails_a_broken_copy(tmp_path: Path, good: str, broken: str, said: str) -> None:
    text = ACTIONS.read_text()
    assert good in text, good
    copy = tmp_path / "broken.yml"
    copy.write_text(text.replace(good, broken, 1))
    proc = _actionlint(copy)
    assert proc.returncode == 1 and said in proc.stdout, proc.stdout + proc.stderr


# -- every command line against the CLI -------------------------------------------------


def _readme_ray_section() -> str:
    section = re.search(r"^## Batches on a Ray cluster\n(.*?)^## ", README.read_text(), re.M | re.S)
    assert section, "README.md has no section `Batches on a Ray cluster`"
    return section.group(1)


def _markdown_commands(text: str) -> list[tuple[str, bool]]:
    """(command line, whether it is whole): the lines of fenced code blocks are whole
    commands; an inline code span in a sentence may name a command without its
    arguments."""
    found: list[tuple[str, bool]] = []
    for block in re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S):
        joined = block.replace("\\\n", " ")
        found += [(m, True) for m in COMMAND.findall(joined)]
    prose = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        found += [(m, False) for m in COMMAND.findall(span)]
    return [(line, whole) for line, whole in found if line.strip() != "git fabro"]


def _yaml_commands(text: str) -> list[tuple[str, bool]]:
    """The command lines in a YAML file's string values (its comments are prose)."""

    def strings(node: object) -> list[str]:
        if isinstance(node, dict):
            return [s for value in node.values() for s in strings(value)]
        if isinstance(node, list):
            return [s for value in node for s in strings(value)]
        return [node] if isinstance(node, str) else []

    found = []
    for value in strings(yaml.safe_load(text)):
        found += COMMAND.findall(value.replace("\\\n", " "))
    return [(m, True) for m in found if m.strip() != "git fabro"]  # a bare name is prose


def _documented_commands() -> dict[str, list[tuple[str, bool]]]:
    return {
        "docs/ci.md": _markdown_commands(CI.read_text()),
        "docs/ray.md": _markdown_commands(RAY.read_text()),
        "README.md (Batches on a Ray cluster)": _markdown_commands(_readme_ray_section()),
        "docs/examples/github-actions.yml": _yaml_commands(ACTIONS.read_text()),
        "docs/examples/rayjob.yaml": _yaml_commands(RAYJOB.read_text()),
    }


def check_command(line: str, *, whole: bool) -> str:
    """Parse `line` (`git fabro ...`) as the real CLI would, without running it: the
    command's name (`batch`, `model test`). A click UsageError names what is wrong: an
    unknown command or option, an option without its value, an extra argument, or a
    missing one (only when the line is `whole`)."""
    words = shlex.split(line)[2:]
    command: _click.core.Command = typer.main.get_command(app)
    names: list[str] = []
    while getattr(command, "commands", None) and words and not words[0].startswith("-"):
        sub = command.commands.get(words[0])  # type: ignore[attr-defined]
        if sub is None or getattr(sub, "hidden", False):
            raise _click.exceptions.UsageError(f"no command {' '.join([*names, words[0]])!r}")
        command, names, words = sub, [*names, words[0]], words[1:]
    if getattr(command, "commands", None):  # `git fabro --version`: the group's own options
        known = {opt for param in command.params for opt in param.opts}
        for word in words:
            if word not in known:
                raise _click.exceptions.UsageError(
                    f"no option {word!r} of git fabro {' '.join(names)}"
                )
        return " ".join(names)
    try:
        command.make_context(" ".join(["git fabro", *names]), list(words))
    except _click.exceptions.MissingParameter:
        if whole:
            raise
    return " ".join(names)


def test_every_documented_command_line_parses_against_the_cli() -> None:
    used: dict[str, set[str]] = {}
    for where, commands in _documented_commands().items():
        assert commands, f"{where}: no git fabro command found"
        for line, whole in commands:
            try:
                name = check_command(line, whole=whole)
            except _click.exceptions.UsageError as err:
                pytest.fail(f"{where}: `{line}`: {err.format_message()}")
            used.setdefault(where, set()).add(name)
    # What each document is for is there, so the check above has something to hold.
    assert {"run", "resume", "fetch", "push", "trust"} <= used["docs/examples/github-actions.yml"]
    assert {"run", "resume", "fetch", "batch"} <= used["docs/ci.md"]
    assert {"batch", "fetch", "ps"} <= used["docs/ray.md"]
    assert used["docs/examples/rayjob.yaml"] == {"batch"}
    flags = " ".join(line for line, _ in _yaml_commands(ACTIONS.read_text()))
    assert flags.count("--push origin") == 2, flags  # the run and its resume replicate


@pytest.mark.parametrize(
    ("line", "whole", "said"),
    [
        ("git fabro rnu wf.fabro", True, "no command 'rnu'"),
        ("git fabro run wf.fabro --pussh origin", True, "--pussh"),
        ("git fabro batch flow.fabro --ray", False, "--ray"),
        ("git fabro resume 01J --pussh origin", False, "--pussh"),
        ("git fabro resume", True, "RUN"),
        ("git fabro rm", True, "RUN..."),
        ("git fabro fetch origin 01J one-too-many", True, "one-too-many"),
        ("git fabro model tset", False, "no command 'model tset'"),
        ("git fabro --versoin", False, "--versoin"),
    ],
)
def test_a_command_line_the_cli_would_refuse_is_caught(line: str, whole: bool, said: str) -> None:
    with pytest.raises(_click.exceptions.UsageError) as caught:
        check_command(line, whole=whole)
    assert said in caught.value.format_message()


def test_command_lines_are_found_in_code_and_not_in_prose() -> None:
    text = (
        "git fabro runs workflows.\n"
        "Use `git fabro fetch origin` first, then\n"
        "```sh\ngit fabro batch flow.fabro --inputs rows.jsonl \\\n"
        "    --remote origin   # a comment\n"
        "x=$(git fabro run hello --label 'a=b c' -d); echo\n```\n"
    )
    assert _markdown_commands(text) == [
        ("git fabro batch flow.fabro --inputs rows.jsonl      --remote origin   ", True),
        ("git fabro run hello --label 'a=b c' -d", True),
        ("git fabro fetch origin", False),
    ]
    entrypoint = "# git fabro in prose\nentrypoint: >-\n  bash -c 'cd r &&\n  git fabro batch f --ray auto'\n"
    assert _yaml_commands(entrypoint) == [("git fabro batch f --ray auto", True)]


# -- the KubeRay RayJob -------------------------------------------------------------------


def _env(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


def test_the_rayjob_runs_a_batch_on_its_cluster_with_keys_from_a_secret() -> None:
    job = yaml.safe_load(RAYJOB.read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    entrypoint = shlex.split(spec["entrypoint"])
    assert entrypoint[:2] == ["bash", "-c"]
    script = entrypoint[2]
    assert "git fabro batch" in script and "--ray auto" in script and "--remote origin" in script
    assert "runtimeEnvYAML" not in spec  # a key there would be written in the manifest
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    workers = [g["template"]["spec"]["containers"][0] for g in cluster["workerGroupSpecs"]]
    assert workers and all(c["image"] == head["image"] for c in workers)

    head_env = _env(head)
    for key in ("ANTHROPIC_API_KEY", "GIT_TOKEN"):
        assert "value" not in head_env[key], key  # from the Secret, never written here
        assert head_env[key]["valueFrom"]["secretKeyRef"] == {"name": "fabro-keys", "key": key}
    for container in [head, *workers]:
        env = _env(container)
        assert env["GIT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "fabro-keys"
        assert env["GIT_CONFIG_KEY_0"]["value"] == "credential.helper"
        assert "$GIT_TOKEN" in env["GIT_CONFIG_VALUE_0"]["value"]
        # Provider keys reach the tasks through Ray's runtime environment, not the pods.
        assert container is head or "ANTHROPIC_API_KEY" not in env
