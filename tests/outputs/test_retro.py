"""Retros: every run end writes `retro.json` to the meta ref, `inspect --retro` reads it
back (in a clone too), and `--no-retro` keeps it out, through resume as well."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import (
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    wait_until,
    write_workflow,
)
from llm_server import LlmServer, Reply

from fabro_git.outputs import retro

# A command that times out on its first attempt (a transient failure, retried), one that
# writes files, and a final one that fails until $HOME/fixed exists.
RUN = """\
digraph R {
    graph [goal="look back"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    flaky [shape=parallelogram, timeout="300ms", max_retries=1, retry_policy="standard",
           script="if [ -f .attempted ]; then echo second > out.txt; else touch .attempted; sleep 5; fi"]
    build [shape=parallelogram, label="Build it", script="echo hi > a.txt; mkdir -p src; echo x > src/b.txt"]
    check [shape=parallelogram, script="test -f \\"$HOME/fixed\\" || { echo 'not fixed' >&2; exit 3; }"]
    start -> flaky -> build -> check -> exit
}
"""


def _retro(repo: Path, run_id: str) -> dict:
    return json.loads(meta_file(repo, run_id, "retro.json"))


def _by_stage(document: dict) -> dict[str, dict]:
    return {stage["stage_id"]: stage for stage in document["stages"]}


def test_a_failed_run_and_its_resume_each_leave_a_retro(repo: Path, hermetic_env: Path) -> None:
    write_workflow(repo, RUN)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = result["run_id"]
    failed = _retro(repo, run_id)
    assert failed["status"] == "failed" and "check failed" in failed["error"]
    stages = _by_stage(failed)
    assert list(stages) == ["flaky@1", "build@1", "check@1"]  # start and exit are no stages
    flaky, build, check = stages["flaky@1"], stages["build@1"], stages["check@1"]
    assert (flaky["status"], flaky["attempts"], flaky["retries"]) == ("succeeded", 2, 1)
    assert flaky["attempt_failures"] == [
        {"attempt": 1, "error": "command timed out after 0.3s", "failure_class": "transient_infra"}
    ]
    assert flaky["duration_ms"] >= 300
    assert build["label"] == "Build it" and build["files_touched"] == ["a.txt", "src/b.txt"]
    assert check["status"] == "failed" and check["failure_class"] == "deterministic"
    assert "exited with status 3: not fixed" in check["failure_reason"]
    total = failed["aggregate"]
    assert total["stages"] == 3 and total["stages_failed"] == 1 and total["total_retries"] == 1
    assert total["by_status"] == {"failed": 1, "succeeded": 2}
    assert total["files_touched"] == [".attempted", "a.txt", "out.txt", "src/b.txt"]
    assert [f["stage_id"] for f in total["failures"]] == ["check@1"]
    assert total["total_duration_ms"] == sum(s["duration_ms"] for s in failed["stages"])

    (hermetic_env / "fixed").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    done = _retro(repo, run_id)
    assert done["status"] == "succeeded" and done["error"] is None
    assert done["finished_at"] is not None
    # The retro covers the whole run: the failed attempt before the resume, and its rerun.
    checks = [s for s in done["stages"] if s["node_id"] == "check"]
    assert [s["status"] for s in checks] == ["failed", "succeeded"]
    assert done["aggregate"]["total_retries"] == 1


def test_the_retro_is_derived_from_the_recorded_events_alone(repo: Path) -> None:
    write_workflow(repo, RUN.replace('test -f \\"$HOME/fixed\\" ||', "true ||"))
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    stored = meta_file(repo, run_id, "retro.json").encode()
    events = run_fabro("logs", run_id, cwd=repo).stdout.encode()
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    again = retro.derive(
        events,
        run_id=run_id,
        workflow="wf",
        goal="look back",
        status="succeeded",
        error=None,
        started_at=checkpoint["started_at"],
        finished_at=checkpoint["finished_at"],
        duration_ms=checkpoint["active_ms"],
    )
    assert retro.encode(again) == stored


def test_inspect_retro_reads_it_back_in_a_fresh_clone(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, RUN.replace('test -f \\"$HOME/fixed\\" ||', "true ||"))
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(remote))
    pushed = run_fabro("push", str(remote), run_id, cwd=repo)
    assert pushed.returncode == 0, pushed.stderr
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(remote), str(clone))
    fetched = run_fabro("fetch", "origin", run_id, cwd=clone)
    assert fetched.returncode == 0, fetched.stderr
    shown = run_fabro("inspect", run_id[:12], "--retro", cwd=clone)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "status     succeeded" in out and "goal       look back" in out
    assert "stages     3 (3 succeeded)" in out and "retries    1" in out
    assert "files      4 touched: .attempted, a.txt, out.txt, src/b.txt" in out
    table = out[out.index("STAGE") :].split("\n\n")[0].splitlines()
    assert table[0].split() == ["STAGE", "STATUS", "DURATION", "RETRIES", "COST", "FILES"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert list(rows) == ["flaky@1", "build@1", "check@1"]
    assert rows["flaky@1"][1] == "succeeded" and rows["flaky@1"][3] == "1"
    assert rows["build@1"][5] == "2"  # files touched
    assert "flaky@1 attempt 1: command timed out after 0.3s" in out
    as_json = run_fabro("inspect", run_id, "--retro", "--json", cwd=clone)
    assert json.loads(as_json.stdout) == _retro(repo, run_id)


def test_no_retro_is_written_with_no_retro_even_after_resume(
    repo: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, RUN)
    proc, result = run_json("run", "wf.fabro", "--no-retro", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = result["run_id"]
    files = git(repo, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}")
    assert "checkpoint.json" in files and "retro.json" not in files
    (hermetic_env / "fixed").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    files = git(repo, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}")
    assert "retro.json" not in files
    shown = run_fabro("inspect", run_id, "--retro", cwd=repo)
    assert shown.returncode == 1
    assert f"run {run_id} has no retro: it ran with --no-retro" in shown.stderr
    assert "Traceback" not in shown.stderr


HELD = """\
digraph H {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    first [shape=parallelogram, script="echo one > one.txt"]
    hold  [shape=parallelogram, script="touch \\"$HOME/holding\\"; while [ ! -e \\"$HOME/go\\" ]; do sleep 0.02; done"]
    start -> first -> hold -> exit
}
"""


def test_an_interrupted_run_has_a_retro_naming_the_stage_it_stopped_in(
    repo: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, HELD)
    proc = start_fabro(
        ["run", "wf.fabro", "--json"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The stage itself says when it is running.
    wait_until((hermetic_env / "holding").exists, process=proc, what="the stage's start")
    run_id = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])["run_id"]
    assert run_fabro("interrupt", run_id, cwd=repo).returncode == 0
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    document = _retro(repo, run_id)
    assert document["status"] == "interrupted"
    stages = _by_stage(document)
    assert stages["first@1"]["status"] == "succeeded"
    assert stages["hold@1"]["status"] == "interrupted"
    assert document["aggregate"]["stages_completed"] == 1
    (hermetic_env / "go").write_text("")
    assert run_fabro("resume", run_id, cwd=repo).returncode == 0
    assert _by_stage(_retro(repo, run_id))["hold@1"]["status"] == "succeeded"


def test_an_llm_stage_brings_its_usage_and_cost(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(
        repo,
        """\
digraph L {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    review [shape=tab, prompt="Review it", model="claude-sonnet-4-6"]
    start -> review -> exit
}
""",
    )
    llm_server.script(Reply(text="Looks fine.", input_tokens=1200, output_tokens=300))
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    document = _retro(repo, run_id)
    review = _by_stage(document)["review@1"]
    assert review["usage"]["model"] == "claude-sonnet-4-6"
    assert (review["usage"]["input_tokens"], review["usage"]["output_tokens"]) == (1200, 300)
    assert review["cost"] > 0
    total = document["aggregate"]
    assert total["total_cost"] == pytest.approx(review["cost"])
    assert (total["input_tokens"], total["output_tokens"]) == (1200, 300)
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert total["total_cost"] == pytest.approx(checkpoint["total_cost"])
    shown = run_fabro("inspect", run_id, "--retro", cwd=repo).stdout
    assert "(1200 tokens in, 300 out)" in shown


NARRATED = """\
digraph N {
    graph [goal="greet the world"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hello [shape=parallelogram, script="echo hello > hello.txt"]
    start -> hello -> exit
}
"""

NARRATIVE_REPLY = """Here is the retrospective.
```json
{"smoothness": "Smooth", "intent": "Greet the world.", "outcome": "hello.txt was written.",
 "learnings": [{"category": "workflow", "text": "One stage is enough."}],
 "friction_points": [{"kind": "retry", "description": "none really", "stage_id": "hello@1"}],
 "open_items": [{"kind": "test_gap", "description": "Nothing checks hello.txt."},
                {"kind": "follow_up"}]}
```"""


def test_retro_narrative_asks_the_model_once_and_keeps_its_reading(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, NARRATED)
    llm_server.script(Reply(text=NARRATIVE_REPLY, input_tokens=900, output_tokens=120))
    proc, result = run_json(
        "run", "wf.fabro", "--retro-narrative", "--model", "claude-sonnet-4-6", cwd=repo
    )
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    [request] = llm_server.requests
    sent = json.dumps(request.body)
    assert "greet the world" in sent and "hello@1" in sent and "smoothness" in sent
    narrative = _retro(repo, run_id)["narrative"]
    assert narrative["smoothness"] == "smooth" and narrative["model"] == "claude-sonnet-4-6"
    assert narrative["intent"] == "Greet the world."
    assert narrative["learnings"] == [{"category": "workflow", "text": "One stage is enough."}]
    assert narrative["friction_points"][0]["stage_id"] == "hello@1"
    # An item without its text is dropped.
    assert narrative["open_items"] == [
        {"kind": "test_gap", "description": "Nothing checks hello.txt."}
    ]
    assert narrative["usage"]["input_tokens"] == 900 and narrative["usage"]["cost"] > 0
    shown = run_fabro("inspect", run_id, "--retro", cwd=repo).stdout
    assert "smoothness smooth (by claude-sonnet-4-6)" in shown
    assert "  [test_gap] Nothing checks hello.txt." in shown


def test_without_the_flag_no_model_is_asked(repo: Path, llm_server: LlmServer) -> None:
    write_workflow(repo, NARRATED)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert llm_server.requests == []
    assert "narrative" not in _retro(repo, result["run_id"])


def test_a_reply_with_no_narrative_leaves_the_retro_without_one(
    repo: Path, llm_server: LlmServer
) -> None:
    write_workflow(repo, NARRATED)
    llm_server.script(Reply(text="I would rather not."))
    proc, result = run_json(
        "run", "wf.fabro", "--retro-narrative", "--model", "claude-sonnet-4-6", cwd=repo
    )
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    document = _retro(repo, run_id)
    assert "narrative" not in document and document["status"] == "succeeded"
    notices = [e["properties"] for e in run_events(run_id, repo) if e["event"] == "run.notice"]
    assert any(n["code"] == "retro_narrative_failed" for n in notices)
