"""`[[run.hooks]]` entries that cannot fire are refused before the run exists, naming
the file, line and key; hook lists add up across layers, replacing by id."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git, run_fabro

from fabro_git.config.run_config import merge_hooks

GRAPH = """
digraph C {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    say [shape=parallelogram, script="echo hi"]
    start -> say -> exit
}
"""


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            '[[run.hooks]]\nevent = "stage_start"\ncommand = "a"\nscript = "b"\n',
            "run.toml:4: run.hooks[0].script: give `command` or `script`, not both",
        ),
        (
            '[[run.hooks]]\nevent = "stage_start"\nscript = "a"\ntimeout = "soon"\n',
            "run.toml:4: run.hooks[0].timeout: expected a duration such as 500ms, 30s or 2m",
        ),
        (
            '[[run.hooks]]\nevent = "run_complete"\nurl = "ftp://example.org/x"\n',
            "run.toml:3: run.hooks[0].url: expected an http:// or https:// URL",
        ),
        (
            '[[run.hooks]]\nevent = "run_complete"\nurl = "http://example.org/x"\n',
            'run.toml:3: run.hooks[0].url: a plain http:// URL needs `tls = "off"`',
        ),
    ],
)
def test_hooks_that_cannot_fire_are_refused(repo: Path, toml: str, expected: str) -> None:
    (repo / "workflow.fabro").write_text(GRAPH)
    (repo / "run.toml").write_text(toml)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "config")
    proc = run_fabro("run", "run.toml", cwd=repo)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert expected in proc.stderr
    assert not git(repo, "for-each-ref", "refs/fabro").strip(), "a run was started"


def test_hook_lists_replace_by_id_then_name_and_append_the_rest() -> None:
    lower = [
        {"id": "notify", "event": "run_complete", "command": "old"},
        {"name": "lint", "event": "stage_start", "command": "lint-old"},
        {"event": "run_start", "command": "anonymous"},
    ]
    higher = [
        {"event": "run_start", "command": "anonymous"},
        {"name": "lint", "event": "stage_start", "command": "lint-new"},
        {"id": "notify", "event": "run_failed", "command": "new"},
    ]
    assert merge_hooks(lower, higher) == [
        {"id": "notify", "event": "run_failed", "command": "new"},
        {"name": "lint", "event": "stage_start", "command": "lint-new"},
        {"event": "run_start", "command": "anonymous"},
        {"event": "run_start", "command": "anonymous"},
    ]
