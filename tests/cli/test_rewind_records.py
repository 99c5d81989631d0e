"""`git fabro rewind` records on the source run as every snapshot is recorded: through
the run's recorder, so with its snapshot events and with secrets masked in the commit
message it writes, not only in the files."""

from __future__ import annotations

from pathlib import Path

from helpers import git, run_events, run_fabro, run_json, write_workflow

THREE = """\
digraph Three {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    s1 [shape=parallelogram, script="echo one >> log.txt"]
    s2 [shape=parallelogram, script="echo two >> log.txt"]
    start -> s1 -> s2 -> exit
}
"""

# A value with a secret's name in the environment of the rewind only; the workflow's
# file name (so its slug, a trailer of every meta commit) happens to be that value.
SECRET = "hunter2hunter2"


def _snapshot_starts(events: list[dict]) -> list[str]:
    return [e["properties"]["phase"] for e in events if e["event"] == "metadata.snapshot.started"]


def test_rewind_writes_its_snapshot_through_the_recorder(repo: Path) -> None:
    write_workflow(repo, THREE, name=f"{SECRET}.fabro")
    proc, result = run_json("run", f"{SECRET}.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    before = _snapshot_starts(run_events(run_id, repo))

    rewound = run_fabro("rewind", run_id, "s1", cwd=repo, env={"DEPLOY_TOKEN": SECRET})
    assert rewound.returncode == 0, rewound.stderr
    new_id = rewound.stdout.strip()

    message = git(repo, "log", "-1", "--format=%B", f"refs/fabro/meta/{run_id}")
    assert message.startswith(f"superseded by {new_id}\n")
    assert f"Fabro-Superseded-By: {new_id}" in message
    assert SECRET not in message and "Fabro-Workflow: ***ter2" in message
    events = run_events(run_id, repo)
    assert _snapshot_starts(events) == [*before, "finalize"]
    assert events[-1]["event"] == "run.notice" and events[-1]["properties"]["code"] == "superseded"
