"""A run's recorded configuration (`settings.config` in its manifest) is read back as
the typed `[run]` table, by this version or a later one, on this machine or another.

A manifest a later version wrote may hold keys this version does not know: they are
ignored, and the rest acts. One whose values do not fit (a hostile fetched run, or an
older version's) loses those values, with a notice naming them, and no traceback. The
unit tests read many shapes in process; the end-to-end ones rewrite a real run's
manifest on its meta ref and resume it through the real command.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import msgspec
import pytest
from helpers import (
    events_named,
    git,
    run_events,
    run_fabro,
    run_json,
    trust_project,
    write_workflow,
)

from fabro_git.config.recorded import read_recorded
from fabro_git.config.run_config import AgentConfig, RunSection, SandboxConfig
from fabro_git.engine.checkpoint import (
    Manifest,
    RecordedOptions,
    decode_manifest,
    encode,
    read_options,
)
from fabro_git.jsondata import JsonObject


def test_keys_this_version_does_not_know_are_ignored_at_every_depth() -> None:
    recorded = read_recorded(
        {
            "goal": "g",
            "from_the_future": {"anything": [1, 2]},
            "agent": {"stream_idle_timeout": "5s", "new_knob": True},
            "hooks": [{"event": "stage_start", "command": "true", "retries": 3}],
            "sandbox": {"env": {"A": "1"}, "image": "x"},
        }
    )
    assert recorded.unreadable == ()
    run = recorded.run
    assert run.goal == "g"
    assert run.agent == AgentConfig(stream_idle_timeout="5s")
    assert [hook.command for hook in run.hooks] == ["true"]
    assert run.sandbox == SandboxConfig(env={"A": "1"})


@pytest.mark.parametrize(
    ("raw", "unreadable", "kept"),
    [
        (None, [], RunSection()),
        ([1, 2], ["run: expected a table"], RunSection()),
        ("text", ["run: expected a table"], RunSection()),
        (
            {"goal": 3, "labels": {"a": "b"}},
            ["run.goal: expected a string, got an integer"],
            RunSection(labels={"a": "b"}),
        ),
        (
            {"max_cost": -1, "agent": {"request_retries": "many"}},
            [
                "run.max_cost: expected `float` > 0.0",
                "run.agent.request_retries: expected an integer, got a string",
            ],
            RunSection(),
        ),
        (
            {"hooks": [{"event": 7}, {"event": "run_start", "command": "b"}, "x"]},
            [
                "run.hooks[0].event: expected a string, got an integer",
                "run.hooks[2]: expected a table, got a string",
            ],
            msgspec.convert({"hooks": [{"event": "run_start", "command": "b"}]}, RunSection),
        ),
        (
            {"agent": {"mcps": {"s": {"type": "wasm"}}}, "sandbox": []},
            [
                "run.agent.mcps.s.type: invalid enum value 'wasm'",
                "run.sandbox: expected a table, got a list",
            ],
            RunSection(),
        ),
    ],
)
def test_values_that_do_not_fit_are_left_out_and_named(
    raw: object, unreadable: list[str], kept: RunSection
) -> None:
    recorded = read_recorded(raw)
    assert list(recorded.unreadable) == unreadable
    assert recorded.run == kept


@pytest.mark.parametrize(
    ("settings", "options"),
    [
        ({}, RecordedOptions()),
        (
            {"dry_run": True, "retro": False, "model": "m", "setup_commands": ["make"]},
            RecordedOptions(dry_run=True, retro=False, model="m", setup_commands=("make",)),
        ),
        (
            {"dry_run": "yes", "model": 5, "exclude_globs": ["*.log", 1], "provider": "p"},
            RecordedOptions(
                provider="p",
                unreadable=(
                    "settings.dry_run: expected `bool`, got `str`",
                    "settings.model: expected `str | null`, got `int`",
                    "settings.exclude_globs: expected `str`, got `int` - at `$[1]`",
                ),
            ),
        ),
    ],
)
def test_the_options_a_run_started_with_read_back_typed_and_leniently(
    settings: JsonObject, options: RecordedOptions
) -> None:
    assert read_options(settings) == options


def test_the_manifest_reads_its_config_once_and_writes_the_same_bytes(tmp_path: Path) -> None:
    settings = {"dry_run": False, "config": {"goal": "g", "later": 1}, "config_sources": []}
    manifest = Manifest(
        run_id="01J0000000000000000000000",
        workflow_name="W",
        workflow_slug="w",
        workflow_path=None,
        goal="g",
        inputs={},
        labels={},
        base_sha="0" * 40,
        base_branch=None,
        run_branch=None,
        meta_ref="refs/fabro/meta/01J0000000000000000000000",
        created_at="2026-01-01T00:00:00Z",
        source_directory=str(tmp_path),
        origin_url=None,
        in_place=False,
        settings=settings,
        tool_version="0",
    )
    before = encode(manifest)
    assert manifest.run_config.goal == "g"
    assert manifest.run_config is manifest.run_config
    assert encode(manifest) == before
    assert decode_manifest(before).run_config == manifest.run_config


# -- through the real command ----------------------------------------------------------------

FAILING = """
digraph W {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    build [shape=parallelogram, script="test -f GO"]
    start -> build -> exit
}
"""


def _failed_run(repo: Path, tmp_path: Path, marker: Path) -> str:
    """A run whose `build` fails until `tmp_path/go` exists, with a hook that appends
    to `marker` at every stage start."""
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text(
        f'[[run.hooks]]\nevent = "stage_start"\ncommand = "echo x >> {marker}"\n'
    )
    write_workflow(repo, FAILING.replace("GO", str(tmp_path / "go")))
    trust_project(repo)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    return str(result["run_id"])


def _rewrite_recorded_config(repo: Path, run_id: str, config: object, **settings: object) -> None:
    """A new commit on the run's meta ref whose manifest records `config` (and the other
    `settings` given), every other file and the message as they were."""
    ref = f"refs/fabro/meta/{run_id}"
    manifest = json.loads(git(repo, "show", f"{ref}:manifest.json"))
    manifest["settings"]["config"] = config
    manifest["settings"].update(settings)
    data = json.dumps(manifest, indent=2).encode()
    blob = (
        subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=repo,
            input=data,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    listing = [
        line if not line.endswith("\tmanifest.json") else f"100644 blob {blob}\tmanifest.json"
        for line in git(repo, "ls-tree", ref).splitlines()
    ]
    tree = subprocess.run(
        ["git", "mktree"],
        cwd=repo,
        input="\n".join(listing) + "\n",
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    tip = git(repo, "rev-parse", ref).strip()
    message = git(repo, "log", "-1", "--format=%B", tip)
    commit = subprocess.run(
        ["git", "commit-tree", tree, "-p", tip, "-F", "-"],
        cwd=repo,
        input=message,
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    git(repo, "update-ref", ref, commit, tip)


def _resume_trusted(repo: Path, run_id: str) -> subprocess.CompletedProcess[str]:
    trusted = run_fabro("trust", "--run", run_id, "--yes", cwd=repo)
    assert trusted.returncode == 0, trusted.stderr
    return run_fabro("resume", run_id, cwd=repo)


def test_a_manifest_with_keys_of_a_later_version_resumes_and_its_hooks_fire(
    repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "hooked"
    run_id = _failed_run(repo, tmp_path, marker)
    config = json.loads(git(repo, "show", f"refs/fabro/meta/{run_id}:manifest.json"))["settings"][
        "config"
    ]
    config["hooks"][0]["retries"] = 2
    config["from_the_future"] = {"knob": True}
    _rewrite_recorded_config(repo, run_id, config)
    before = marker.read_text().count("x")
    (tmp_path / "go").write_text("")
    resumed = _resume_trusted(repo, run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert marker.read_text().count("x") > before
    assert not [
        e
        for e in events_named(run_events(run_id, repo), "run.notice")
        if e["properties"]["code"] in ("config_unreadable", "hook_unreadable")
    ]


def test_a_hostile_recorded_config_loses_what_does_not_fit_and_says_so(
    repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "hooked"
    run_id = _failed_run(repo, tmp_path, marker)
    hook = {"event": "stage_start", "command": f"echo x >> {marker}"}
    _rewrite_recorded_config(
        repo,
        run_id,
        {
            "hooks": [{"event": 7}, hook],
            "agent": {"mcps": "none", "cli_command": [1]},
            "sandbox": ["A=1"],
            "max_cost": "lots",
        },
        dry_run="yes",
        setup_commands="rm -rf /",
    )
    before = marker.read_text().count("x")
    (tmp_path / "go").write_text("")
    resumed = _resume_trusted(repo, run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert marker.read_text().count("x") > before  # the hook that fits still fires
    notices = [
        e["properties"]["message"]
        for e in events_named(run_events(run_id, repo), "run.notice")
        if e["properties"]["code"] == "config_unreadable"
    ]
    named = [message.split(": ")[1] for message in notices]
    assert named == [
        "run.hooks[0].event",
        "run.agent.mcps",
        "run.sandbox",
        "run.max_cost",
        "settings.dry_run",
        "settings.setup_commands",
    ]
