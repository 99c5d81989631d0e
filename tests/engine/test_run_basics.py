"""`git fabro run` end to end: the run branch, the meta ref, the JSON result, ps/logs/inspect."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import (
    assert_fsck_clean,
    fabro_exe,
    fresh_clone,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    wait_until,
    write_workflow,
)

HELLO = """
digraph Hello {
    graph [goal="greet"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    write [shape=parallelogram, script="echo hello > greeting.txt && echo wrote"]
    check [shape=parallelogram, script="grep -q hello greeting.txt && cat greeting.txt"]
    start -> write -> check -> exit
}
"""


def test_run_commits_each_stage_with_trailers(repo: Path) -> None:
    write_workflow(repo, HELLO)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", run_id)
    assert result["status"] == "succeeded"
    assert result["run_branch"] == f"fabro/run/{run_id}"
    assert result["meta_ref"] == f"refs/fabro/meta/{run_id}"
    tip = git(repo, "rev-parse", f"fabro/run/{run_id}").strip()
    assert result["final_git_commit_sha"] == tip

    subjects = git(repo, "log", "--format=%s", f"main..fabro/run/{run_id}").split("\n")
    assert [s for s in subjects if s] == [
        f"fabro({run_id}): exit (succeeded)",
        f"fabro({run_id}): check (succeeded)",
        f"fabro({run_id}): write (succeeded)",
        f"fabro({run_id}): start (succeeded)",
    ]
    # The work product is on the run branch, and the user's checkout is untouched.
    assert git(repo, "show", f"fabro/run/{run_id}:greeting.txt") == "hello\n"
    assert not (repo / "greeting.txt").exists()
    assert git(repo, "status", "--porcelain") == ""

    body = git(repo, "log", "-1", "--format=%B", f"fabro/run/{run_id}")
    trailers = dict(re.findall(r"^(Fabro-[A-Za-z]+): (.+)$", body, re.M))
    assert trailers["Fabro-Run"] == run_id
    assert trailers["Fabro-Completed"] == "4"
    checkpoint_sha = trailers["Fabro-Checkpoint"]
    # The trailer names a snapshot on the meta ref.
    meta_history = git(repo, "log", "--format=%H %s", f"refs/fabro/meta/{run_id}").splitlines()
    assert any(
        line.startswith(checkpoint_sha) and "checkpoint exit@1" in line for line in meta_history
    )
    assert meta_history[0].endswith("finalize succeeded")
    assert meta_history[-1].endswith("init")
    # `git log fabro/meta/<id>` works through git's ref lookup rules.
    assert git(repo, "log", "--oneline", f"fabro/meta/{run_id}").count("\n") == len(meta_history)
    assert_fsck_clean(repo)


def test_meta_tree_layout(repo: Path) -> None:
    write_workflow(repo, HELLO)
    _, result = run_json("run", "wf.fabro", cwd=repo)
    run_id = result["run_id"]
    files = git(repo, "ls-tree", "-r", "--name-only", f"refs/fabro/meta/{run_id}").split()
    for expected in (
        "manifest.json",
        "graph.fabro",
        "checkpoint.json",
        "nodes/write/status.json",
        "nodes/write/stdout.log",
        "nodes/check/status.json",
        "events/000/000001.jsonl",
    ):
        assert expected in files
    manifest = json.loads(meta_file(repo, run_id, "manifest.json"))
    assert manifest["run_id"] == run_id
    assert manifest["goal"] == "greet"
    assert manifest["base_branch"] == "main"
    assert manifest["base_sha"] == git(repo, "rev-parse", "main").strip()
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["status"] == "succeeded"
    assert checkpoint["completed_nodes"] == ["start", "write", "check", "exit"]
    assert checkpoint["context_values"]["command.output"] == "hello\n"
    assert meta_file(repo, run_id, "nodes/write/stdout.log") == "wrote\n"
    status = json.loads(meta_file(repo, run_id, "nodes/check/status.json"))
    assert status["status"] == "succeeded"
    # Event segments are append-only: every snapshot adds one, none is rewritten.
    segments = [f for f in files if f.startswith("events/")]
    assert segments == sorted(segments) and len(segments) >= 5
    first = git(repo, "rev-list", "--reverse", f"refs/fabro/meta/{run_id}").split()[1]
    assert git(repo, "show", f"{first}:events/000/000001.jsonl") == meta_file(
        repo, run_id, "events/000/000001.jsonl"
    )


def test_events_cover_the_run(repo: Path) -> None:
    write_workflow(repo, HELLO)
    _, result = run_json("run", "wf.fabro", cwd=repo)
    events = run_events(result["run_id"], repo)
    names = [e["event"] for e in events]
    assert names[0] == "run.created"
    assert names.count("run.completed") == 1
    assert names.count("stage.completed") == 4
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids))
    assert ids == sorted(ids), "UUID v7 ids are time-ordered"
    edges = [
        (e["properties"]["from_node"], e["properties"]["to_node"])
        for e in events
        if e["event"] == "edge.selected"
    ]
    assert edges == [("start", "write"), ("write", "check"), ("check", "exit")]
    completed = next(
        e for e in events if e["event"] == "stage.completed" and e["node_id"] == "write"
    )
    assert completed["stage_id"] == "write@1"
    assert completed["properties"]["status"] == "succeeded"
    assert completed["properties"]["files_touched"] == ["greeting.txt"]


def test_ps_logs_inspect(repo: Path) -> None:
    write_workflow(repo, HELLO)
    _, result = run_json("run", "wf.fabro", cwd=repo)
    run_id = result["run_id"]
    ps = run_fabro("ps", cwd=repo)
    assert ps.returncode == 0
    row = next(line for line in ps.stdout.splitlines() if line.startswith(run_id))
    assert "wf" in row and "succeeded" in row and "exit" in row
    rows = [json.loads(line) for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()]
    assert rows[0]["run_id"] == run_id and rows[0]["status"] == "succeeded"

    pretty = run_fabro("logs", run_id[:10], "--pretty", cwd=repo)
    assert pretty.returncode == 0
    assert "stage.completed" in pretty.stdout and "write -> check" in pretty.stdout

    inspect = run_fabro("inspect", run_id[:8], "--json", cwd=repo)
    doc = json.loads(inspect.stdout)
    assert doc["status"] == "succeeded"
    assert doc["manifest"]["workflow_name"] == "Hello"
    assert doc["checkpoint"]["current_node"] == "exit"
    text = run_fabro("inspect", run_id, cwd=repo).stdout
    assert "start -> write -> check -> exit" in text


def test_failed_stage_fails_the_run_and_resume_retries_it(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph F {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            gate [shape=parallelogram, script="test -f $HOME/allow || { echo 'not yet' >&2; exit 7; }"]
            start -> gate -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 1
    assert result["status"] == "failed"
    assert "exited with status 7: not yet" in proc.stderr
    assert "Traceback" not in proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    failed = next(e for e in events if e["event"] == "stage.failed")
    assert failed["properties"]["failure_class"] == "deterministic"
    assert failed["properties"]["will_retry"] is False
    assert [e for e in events if e["event"] == "run.failed"]

    (Path(os.environ["HOME"]) / "allow").write_text("")
    proc2, result2 = run_json("resume", run_id[:12], cwd=repo)
    assert proc2.returncode == 0, proc2.stderr
    assert result2["status"] == "succeeded"
    log = git(repo, "log", "--format=%s", f"fabro/run/{run_id}")
    assert f"fabro({run_id}): gate (succeeded)" in log


def test_inputs_and_goal_reach_commands(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph I {
            graph [goal="default goal"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            say [shape=parallelogram, script="echo '{{ goal }} / {{ inputs.name }}' > said.txt"]
            start -> say -> exit
        }
        """,
    )
    missing = run_fabro("run", "wf.fabro", cwd=repo)
    assert missing.returncode == 1
    assert "inputs.name" in missing.stderr and "-V" in missing.stderr
    assert "Traceback" not in missing.stderr
    goal_file = repo.parent / "goal.txt"
    goal_file.write_text("from a file\n")
    proc, result = run_json(
        "run",
        "wf.fabro",
        "--goal-file",
        str(goal_file),
        "-V",
        "name=Ada",
        "--label",
        "team=core",
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:said.txt") == "from a file / Ada\n"
    manifest = json.loads(meta_file(repo, result["run_id"], "manifest.json"))
    assert manifest["labels"] == {"team": "core"}
    assert manifest["inputs"] == {"name": "Ada"}


def test_refuses_invalid_workflow(repo: Path) -> None:
    write_workflow(repo, "digraph X { start [shape=Mdiamond]; a -> b }")
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 1
    assert "terminal_node" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""


def test_uncommitted_changes_warn_and_stay_out(repo: Path) -> None:
    write_workflow(repo, HELLO)
    (repo / "README.md").write_text("local edit\n")
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0
    assert "uncommitted change" in proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:README.md") == "hello\n"
    assert (repo / "README.md").read_text() == "local edit\n"


def test_in_place_runs_in_the_checkout_without_run_commits(repo: Path) -> None:
    write_workflow(repo, HELLO)
    proc, result = run_json("run", "wf.fabro", "--in-place", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / "greeting.txt").read_text() == "hello\n"
    assert git(repo, "for-each-ref", "refs/heads/fabro") == ""
    assert result["run_branch"] is None
    checkpoint = json.loads(meta_file(repo, result["run_id"], "checkpoint.json"))
    assert checkpoint["status"] == "succeeded"


def test_shipped_example_by_name(repo: Path) -> None:
    proc, result = run_json("run", "hello", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    unknown = run_fabro("run", "no-such-example", cwd=repo)
    assert unknown.returncode == 1 and "hello" in unknown.stderr


def test_llm_stage_without_dry_run_is_refused_before_the_run(repo: Path) -> None:
    proc = run_fabro("run", "plan-implement-review", cwd=repo)
    assert proc.returncode == 1
    assert "no API key for provider 'anthropic': set ANTHROPIC_API_KEY" in proc.stderr
    assert "Using a real model" in proc.stderr and "--dry-run" in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""


def test_command_output_is_bounded_in_memory_and_context(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph Big {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            big [shape=parallelogram, script="head -c 120000000 /dev/zero | tr '\\\\0' x; echo; echo done"]
            start -> big -> exit
        }
        """,
    )
    # The peak is read in a fresh process that only runs `git fabro`: this test
    # process's own children high-water mark holds every earlier test's.
    measure = (
        "import json, resource, subprocess, sys\n"
        "proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps({'rc': proc.returncode, 'peak': peak, 'out': proc.stdout,"
        " 'err': proc.stderr}))\n"
    )
    wrapped = subprocess.run(
        [sys.executable, "-c", measure, *fabro_exe(), "run", "wf.fabro", "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(wrapped.stdout)
    assert report["rc"] == 0, report["err"]
    peak_kib = report["peak"]
    # A run's own peak is about 50 MB: one that held the output would pass 120 MB.
    assert peak_kib < 100_000, f"peak RSS {peak_kib} KiB for a 120 MB output"
    result = json.loads(report["out"].splitlines()[-1])
    checkpoint = json.loads(meta_file(repo, result["run_id"], "checkpoint.json"))
    # The context points to the artifact; the artifact holds the meta ref's capped copy.
    assert checkpoint["context_values"]["command.output"].startswith("file:///")
    output = json.loads(meta_file(repo, result["run_id"], "artifacts/command.output.json"))
    assert len(output) < 1_100_000
    assert "bytes omitted" in output and output.rstrip().endswith("done")


def test_checkpoint_events_carry_the_stage_diff(repo: Path) -> None:
    write_workflow(repo, HELLO)
    _, result = run_json("run", "wf.fabro", cwd=repo)
    events = run_events(result["run_id"], repo)
    by_node = {
        e["node_id"]: e["properties"] for e in events if e["event"] == "checkpoint.completed"
    }
    diff = by_node["write"]["diff"]
    assert "diff --git a/greeting.txt b/greeting.txt" in diff
    assert "+hello" in diff
    # A stage that changed nothing has no diff at all.
    assert "diff" not in by_node["check"]
    sha = by_node["write"]["git_commit_sha"]
    assert git(repo, "show", "--format=", "--stat", sha).strip().startswith("greeting.txt")


def test_an_in_place_run_resumes_only_in_the_checkout_it_ran_in(repo: Path, tmp_path: Path) -> None:
    """The manifest's source_directory is run data: a fetched run's says whatever its
    author wrote, so it never picks the directory stages run in."""
    write_workflow(
        repo,
        """
        digraph P {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            work [shape=parallelogram, script="echo here > placed.txt; exit 1"]
            start -> work -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--in-place", cwd=repo)
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    (repo / "placed.txt").unlink()
    clone, env = fresh_clone(repo, tmp_path)
    resumed = run_fabro("resume", run_id, cwd=clone, env=env)
    assert resumed.returncode == 1
    assert f"run {run_id} ran in place in '{repo}'" in resumed.stderr
    assert f"git fabro fork {run_id}" in resumed.stderr
    assert not (repo / "placed.txt").exists() and not (clone / "placed.txt").exists()


HOLDING_IN_PLACE = """\
digraph Hold {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="echo one >> log.txt; touch \\"$HOME/started\\"; while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done"]
    start -> hold -> exit
}
"""


def test_a_second_in_place_run_in_one_checkout_is_refused(repo: Path, hermetic_env: Path) -> None:
    """Two in-place runs would work in the same files, each recording the other's
    writes as its own: the second is refused while the first holds the checkout."""
    write_workflow(repo, HOLDING_IN_PLACE)
    first = start_fabro(
        ["run", "wf.fabro", "--in-place"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: (hermetic_env / "started").exists(), process=first, what="the hold")
        second = run_fabro("run", "wf.fabro", "--in-place", cwd=repo)
        assert second.returncode == 1, second.stderr
        assert f"another run works in place in {repo}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert len(git(repo, "for-each-ref", "refs/fabro/meta").splitlines()) == 1
    finally:
        (hermetic_env / "go").write_text("")
        first.communicate(timeout=120)
    assert first.returncode == 0
    assert (repo / "log.txt").read_text() == "one\n"
    # The checkout is free again.
    assert run_fabro("run", "wf.fabro", "--in-place", cwd=repo).returncode == 0
