"""JSONL event sinks (`[[run.events.sinks]]`): a file and a program get every event as
the line `git fabro logs` prints; a sink that fails is a notice, never a failed run; a
cloned repository's sink acts only once its project file is trusted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import git, pids_with_env, run_fabro, write_workflow

from fabro_git.engine.event_sinks import NOTICE_CODE, CommandSink
from fabro_git.events.catalogue import RunNotice
from fabro_git.events.envelope import encode_event, make_envelope

WORKFLOW = """\
digraph W {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    build [shape=parallelogram, script="echo built > built.txt"]
    start -> build -> exit
}
"""


def _run_with(repo: Path, config: Path, sinks: str, env: dict[str, str] | None = None) -> str:
    config.write_text(f'[workflow]\ngraph = "{repo / "wf.fabro"}"\n{sinks}')
    proc = run_fabro("run", str(config), "--json", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]


def _logs(repo: Path, run_id: str) -> str:
    proc = run_fabro("logs", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_file_and_a_program_get_every_event_as_logs_prints_it(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, WORKFLOW)
    received, environment = tmp_path / "received.jsonl", tmp_path / "sink-env"
    sinks = (
        '[[run.events.sinks]]\ntype = "file"\npath = "out/events.jsonl"\n'
        '[[run.events.sinks]]\ntype = "command"\n'
        # It reads to the end, then would stay: the run's end stops it.
        f'script = "env > {environment}; cat > {received}; exec env SINK_LEFT={tmp_path} sleep 600"\n'
    )
    (tmp_path / "out").mkdir()
    run_id = _run_with(
        repo, tmp_path / "run.toml", sinks, env={"SINK_TEST_API_KEY": "sk-not-for-sinks"}
    )
    assert pids_with_env(SINK_LEFT=str(tmp_path)) == []
    logs = _logs(repo, run_id)
    assert '"event":"run.completed"' in logs
    # A relative path is the run config's directory's.
    assert (tmp_path / "out" / "events.jsonl").read_text() == logs
    assert received.read_text() == logs
    # The program got a stage's environment: no secret-named variable, the run's mark.
    names = {line.split("=", 1)[0] for line in environment.read_text().splitlines()}
    assert "SINK_TEST_API_KEY" not in names and "FABRO_PROCESS_MARK" in names
    assert NOTICE_CODE not in logs


def test_a_failing_sink_is_a_notice_and_the_run_goes_on(repo: Path, tmp_path: Path) -> None:
    write_workflow(repo, WORKFLOW)
    sinks = (
        '[[run.events.sinks]]\ntype = "command"\ncommand = ["/no/such/program"]\n'
        f'[[run.events.sinks]]\ntype = "file"\npath = "{tmp_path}"\n'
    )
    config = tmp_path / "run.toml"
    config.write_text(f'[workflow]\ngraph = "{repo / "wf.fabro"}"\n{sinks}')
    proc = run_fabro("run", str(config), "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    # Told at the terminal too, though the failure comes before the run's display.
    assert "warning: event sink 1 (command /no/such/program) failed" in proc.stderr
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    events = [json.loads(line) for line in _logs(repo, run_id).splitlines()]
    notices = [
        e["properties"]["message"]
        for e in events
        if e["event"] == "run.notice" and e["properties"]["code"] == NOTICE_CODE
    ]
    assert len(notices) == 2, notices
    assert "event sink 1 (command /no/such/program) failed: cannot start it" in notices[0]
    assert f"event sink 2 (file {tmp_path}) failed" in notices[1]
    completed = [e for e in events if e["event"] == "run.completed"]
    assert [e["properties"]["status"] for e in completed] == ["succeeded"]


def test_a_clones_sink_acts_only_once_trusted(tmp_path: Path) -> None:
    author = tmp_path / "author"
    author.mkdir()
    git(author, "init", "-q", "-b", "main")
    (author / ".fabro").mkdir()
    spied = tmp_path / "spied.jsonl"
    (author / ".fabro" / "project.toml").write_text(
        f'[[run.events.sinks]]\ntype = "file"\npath = "{spied}"\n'
    )
    (author / "wf.fabro").write_text(WORKFLOW)
    git(author, "add", "-A")
    git(author, "commit", "-q", "-m", "a helpful repository")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(author), str(clone))

    refused = run_fabro("run", "wf.fabro", cwd=clone)
    assert refused.returncode != 0
    assert "run.events.sinks[0]" in refused.stderr
    assert f"appends every event of the run to `{spied}`" in refused.stderr
    assert not spied.exists()

    trusted = run_fabro("trust", "--yes", cwd=clone)
    assert trusted.returncode == 0, trusted.stderr
    proc = run_fabro("run", "wf.fabro", "--json", cwd=clone)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    assert spied.read_text() == _logs(clone, run_id)


def test_a_program_that_ends_early_is_reported_once(tmp_path: Path) -> None:
    notices: list[str] = []
    sink = CommandSink(
        1,
        ["true"],
        cwd=tmp_path,
        env=lambda: {"PATH": "/usr/bin:/bin"},
        stderr=tmp_path / "sink.stderr",
        notice=notices.append,
    )
    env = make_envelope("RUN", RunNotice(level="info", code="x", message="one"))
    sink.handle(env, encode_event(env))
    assert sink.process is not None
    sink.process.wait()
    sink.handle(env, encode_event(env))
    sink.handle(env, encode_event(env))
    sink.close()
    assert notices == [
        "event sink 1 (command true) failed: it exited with code 0 before the run ended; "
        "the run goes on without it"
    ]


def test_closing_lets_the_program_read_to_the_end(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    sink = CommandSink(
        1,
        ["sh", "-c", f"cat > {out}"],
        cwd=tmp_path,
        env=lambda: {"PATH": "/usr/bin:/bin"},
        stderr=tmp_path / "sink.stderr",
        notice=lambda message: subprocess.run(["false"], check=True),  # never called
    )
    lines = []
    for number in range(2000):
        env = make_envelope("RUN", RunNotice(level="info", code="x", message=f"event {number}"))
        lines.append(encode_event(env) + b"\n")
        sink.handle(env, encode_event(env))
    sink.close()
    assert out.read_bytes() == b"".join(lines)
