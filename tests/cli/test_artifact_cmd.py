"""Offloaded values per stage visit, conditions on them, and `git fabro artifact list|cp`
reading them back in a fresh clone."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import (
    fresh_clone,
    meta_bytes,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    write_workflow,
)

TWO_OUTPUTS = r"""
digraph Two {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    first [shape=parallelogram, script="seq 1 30000"]
    second [shape=parallelogram, script="seq 2 30001"]
    start -> first -> second -> exit
}
"""


def seq(first: int) -> str:
    return "".join(f"{n}\n" for n in range(first, first + 30_000))


def test_a_later_stage_setting_the_same_key_keeps_the_earlier_value(
    repo: Path, tmp_path: Path
) -> None:
    write_workflow(repo, TWO_OUTPUTS)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    clone, env = fresh_clone(repo, tmp_path)
    # Each visit's value in its own file; the key's current value where the spec's
    # layout puts it (`artifacts/<key>.json`), holding the later stage's.
    assert json.loads(meta_bytes(clone, run_id, "artifacts/first/command.output.json")) == seq(1)
    assert json.loads(meta_bytes(clone, run_id, "artifacts/second/command.output.json")) == seq(2)
    assert json.loads(meta_bytes(clone, run_id, "artifacts/command.output.json")) == seq(2)
    # Each stage's record points to its own value.
    for node in ("first", "second"):
        status = json.loads(meta_file(clone, run_id, f"nodes/{node}/status.json"))
        pointer = status["context_updates"]["command.output"]
        assert pointer.endswith(f"/artifacts/values/{node}/command.output.json")
    checkpoint = json.loads(meta_file(clone, run_id, "checkpoint.json"))
    assert checkpoint["context_values"]["command.output"].endswith(
        "/artifacts/values/command.output.json"
    )
    completed = next(e for e in run_events(run_id, repo) if e["event"] == "run.completed")
    assert completed["properties"]["artifact_count"] == 2

    listed = run_fabro("artifact", "list", run_id, cwd=clone, env=env)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split() == ["KIND", "STAGE", "RETRY", "SIZE", "PATH"]
    assert lines[0].split() == [
        "value",
        "first@1",
        "-",
        "198.9",
        "KB",
        "first/values/command.output.json",
    ]
    assert lines[1].split()[-1] == "second/values/command.output.json"
    one = tmp_path / "one"
    copied = run_fabro(
        "artifact", "cp", f"{run_id}:first/values/command.output.json", str(one), cwd=clone, env=env
    )
    assert copied.returncode == 0, copied.stderr
    assert json.loads((one / "command.output.json").read_text()) == seq(1)
    # Flat, the later stage's file of the same name wins and the loss is said.
    flat = tmp_path / "flat"
    copied = run_fabro("artifact", "cp", run_id, str(flat), cwd=clone, env=env)
    assert copied.returncode == 0, copied.stderr
    assert json.loads((flat / "command.output.json").read_text()) == seq(2)
    assert "1 earlier file of the same name left out" in copied.stdout
    tree = tmp_path / "tree"
    copied = run_fabro("artifact", "cp", run_id, str(tree), "--tree", cwd=clone, env=env)
    assert copied.returncode == 0, copied.stderr
    assert json.loads((tree / "first/values/command.output.json").read_text()) == seq(1)
    assert json.loads((tree / "second/values/command.output.json").read_text()) == seq(2)
    # `show` names the stage's offloaded value and how to fetch it.
    shown = run_fabro("show", run_id, "first", cwd=clone, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "value command.output.json (198.9 KB)" in shown.stdout
    assert f"git fabro artifact cp {run_id[:12]}:first/values/command.output.json ." in shown.stdout


def test_a_condition_on_an_offloaded_key_sees_the_value(repo: Path) -> None:
    write_workflow(
        repo,
        r"""
        digraph Cond {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            big [shape=parallelogram, script="seq 1 40000; echo ALL_TESTS_PASSED"]
            pointer [shape=parallelogram, script="echo wrong"]
            good [shape=parallelogram, script="echo right"]
            bad [shape=parallelogram, script="echo wrong"]
            start -> big
            big -> pointer [condition="command.output contains artifacts/values", weight=10]
            big -> good [condition="command.output contains ALL_TESTS_PASSED"]
            big -> bad
            pointer -> exit
            good -> exit
            bad -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["node_outcomes"]["big"]["context_updates"]["command.output"].startswith(
        "file://"
    )
    path = [e["node_id"] for e in run_events(run_id, repo) if e["event"] == "stage.completed"]
    assert path == ["start", "big", "good", "exit"]


def test_artifact_commands_explain_what_is_wrong(repo: Path, tmp_path: Path) -> None:
    write_workflow(
        repo,
        """
        digraph Plain {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            work [shape=parallelogram, script="echo hi"]
            start -> work -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    empty = run_fabro("artifact", "list", run_id, cwd=repo)
    assert empty.returncode == 0 and empty.stdout == ""
    assert f"no assets or offloaded values in run {run_id[:12]}" in empty.stderr
    nothing = run_fabro("artifact", "cp", run_id, str(tmp_path / "d"), cwd=repo)
    assert nothing.returncode == 1
    assert "no assets or offloaded values match" in nothing.stderr
    assert f"git fabro artifact list {run_id[:12]}" in nothing.stderr
    assert not (tmp_path / "d").exists()
    unknown = run_fabro("artifact", "list", run_id, "--node", "wrok", cwd=repo)
    assert unknown.returncode == 1
    assert "no stage 'wrok' in this run" in unknown.stderr and "work@1" in unknown.stderr
    missing = run_fabro("artifact", "list", "ZZZZZZ", cwd=repo)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
