"""`ps` shows labels and narrows by `--filter status=…`, `workflow=…`, `label=NAME=VALUE`."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_fabro, write_workflow

FAILS = """\
digraph Fails {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    boom [shape=parallelogram, script="exit 1"]
    start -> boom -> exit
}
"""


def _ids(proc) -> list[str]:  # type: ignore[no-untyped-def]
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line)["run_id"] for line in proc.stdout.splitlines()]


def _start(repo: Path, *args: str) -> str:
    proc = run_fabro("run", *args, "--json", cwd=repo)
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def test_ps_filters_and_labels(repo: Path) -> None:
    write_workflow(repo, FAILS, name="fails.fabro")
    core = _start(repo, "hello", "--label", "team=core")
    web = _start(repo, "hello", "--label", "team=web")
    failed = _start(repo, "fails.fabro", "--label", "team=core")
    everything = _ids(run_fabro("ps", "--json", cwd=repo))
    assert set(everything) == {core, web, failed}
    assert _ids(run_fabro("ps", "--json", "--filter", "status=failed", cwd=repo)) == [failed]
    assert set(
        _ids(run_fabro("ps", "--json", "--filter", "status=failed,succeeded", cwd=repo))
    ) == {core, web, failed}
    assert set(_ids(run_fabro("ps", "--json", "--filter", "workflow=hel", cwd=repo))) == {core, web}
    assert set(_ids(run_fabro("ps", "--json", "--filter", "label=team=core", cwd=repo))) == {
        core,
        failed,
    }
    both = run_fabro(
        "ps", "--json", "--filter", "label.team=core", "--filter", "status=succeeded", cwd=repo
    )
    assert _ids(both) == [core]
    row = json.loads(run_fabro("ps", "--json", "--filter", "label=team=web", cwd=repo).stdout)
    assert row["labels"] == {"team": "web"}
    table = run_fabro("ps", cwd=repo).stdout.splitlines()
    assert table[0].split()[-1] == "LABELS"
    assert any(line.startswith(web) and line.endswith("team=web") for line in table)
    none = run_fabro("ps", "--filter", "label=team=nobody", cwd=repo)
    assert none.returncode == 0 and none.stdout == "" and "no run matches" in none.stderr
    for bad in ("colour=red", "status", "label=team"):
        proc = run_fabro("ps", "--filter", bad, cwd=repo)
        assert proc.returncode == 1 and "--filter" in proc.stderr and "Traceback" not in proc.stderr


def test_an_unknown_status_is_refused_with_the_statuses_there_are(repo: Path) -> None:
    """A typo (`fialed`) would match no run and say nothing: refused, as `prune
    --status` refuses it."""
    succeeded = _start(repo, "hello")
    for bad, said in (
        ("status=fialed", "unknown status 'fialed'; did you mean 'failed'?"),
        ("status=succeeded,runing", "unknown status 'runing'; did you mean 'running'?"),
        ("status=,", "no status given"),
    ):
        proc = run_fabro("ps", "--filter", bad, cwd=repo)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stdout == ""
        assert f"error: --filter '{bad}': {said}" in proc.stderr, proc.stderr
        assert (
            "hint: use one or more of running, succeeded, partially_succeeded, failed, "
            "interrupted, superseded, separated by commas" in proc.stderr
        )
        assert "Traceback" not in proc.stderr
    spaced = run_fabro("ps", "--json", "--filter", "status=failed, succeeded", cwd=repo)
    assert _ids(spaced) == [succeeded]
