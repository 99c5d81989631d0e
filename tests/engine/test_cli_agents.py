"""Agent stages with `backend="cli"`, end to end through `git fabro run`.

A small fake agent CLI of our own stands in for `claude`, `codex` and `gemini` (and for
a custom program): a Python script on PATH under each name. It checks that it was
called the way its profile says, reads its prompt (stdin, or `-p` for gemini), does
what the test's plan file says (write files, commit, hang), and prints its reply in
its profile's output format. Every event of every run here is checked against the
events contract.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    events_named,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    trust_project,
    wait_until,
    write_workflow,
)

FAKE_AGENT = r"""
import json, os, subprocess, sys, time

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
plan = json.load(open(os.environ["FAKE_AGENT_PLAN"]))

def expect(ok, what):
    if not ok:
        sys.stderr.write(f"{name}: bad invocation ({what}): {args}\n")
        sys.exit(2)

if name == "claude":
    expect(args[:1] == ["-p"] and "--output-format" in args, "claude -p --output-format")
    expect(args[args.index("--output-format") + 1] in ("json", "stream-json"), "format")
    prompt = sys.stdin.read()
elif name == "codex":
    expect(args[:2] == ["exec", "--json"] and args[-1] == "-", "codex exec --json -")
    prompt = sys.stdin.read()
elif name == "gemini":
    expect("-p" in args and "--output-format" in args, "gemini -p --output-format")
    expect(args[args.index("--output-format") + 1] == "json", "format")
    prompt = args[args.index("-p") + 1]
else:
    prompt = sys.stdin.read()

with open(plan["log"], "a") as log:
    log.write(json.dumps({"name": name, "argv": args, "prompt": prompt, "cwd": os.getcwd()}) + "\n")

for path, text in plan.get("write", {}).items():
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
for path in plan.get("delete", []):
    os.remove(path)
if plan.get("fail"):
    sys.stderr.write(plan["fail"] + "\n")
    sys.exit(3)
dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True).stdout
if plan.get("commit") and dirty:
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", plan["commit"]], check=True)
if plan.get("hang"):
    child = subprocess.Popen(["sleep", "600"])
    with open(plan["hang"] + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {child.pid}\n")
    os.rename(plan["hang"] + ".tmp", plan["hang"])
    time.sleep(600)

reply = plan["reply"]
if name == "claude":
    result = {
        "type": "result", "subtype": "success", "is_error": False, "result": reply,
        "num_turns": 2, "session_id": "s1", "total_cost_usd": 0.0123,
        "usage": {"input_tokens": 100, "cache_read_input_tokens": 20,
                  "cache_creation_input_tokens": 0, "output_tokens": 30},
        "modelUsage": {"claude-sonnet-4-6": {"inputTokens": 100}},
    }
    print(json.dumps(result))
elif name == "codex":
    for line in (
        {"type": "thread.started", "thread_id": "t1"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "i0", "type": "reasoning", "text": "hm"}},
        {"type": "item.completed", "item": {"id": "i1", "type": "file_change", "changes": []}},
        {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": reply}},
        {"type": "turn.completed",
         "usage": {"input_tokens": 200, "cached_input_tokens": 50, "output_tokens": 40}},
    ):
        print(json.dumps(line))
elif name == "gemini":
    print(json.dumps({
        "response": reply,
        "stats": {"models": {"gemini-2.5-pro": {"tokens": {
            "prompt": 300, "candidates": 50, "total": 360, "cached": 0, "thoughts": 10}}},
            "tools": {"totalCalls": 3}},
    }))
else:
    print(reply)
"""

ROUTED = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, backend="cli"%s, prompt="Improve {{ goal }}"]
    ship [shape=parallelogram, script="echo shipped > shipped.txt"]
    redo [shape=parallelogram, script="echo redo > redo.txt"]
    start -> work
    work -> ship [label="Ship"]
    work -> redo [label="Redo"]
    ship -> exit
    redo -> exit
}
"""

SIMPLE = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, backend="cli"%s, prompt="Work on {{ goal }}"]
    start -> work -> exit
}
"""


@pytest.fixture
def agent_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_agent(tmp_path, monkeypatch)


def install_fake_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on PATH holding the fake agent under every profile's name."""
    bindir = tmp_path / "agent-bin"
    bindir.mkdir()
    script = bindir / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    for name in ("claude", "codex", "gemini", "myagent"):
        launcher = bindir / name
        # The fake reads its own name from argv[0]: exec it under that name.
        launcher.write_text(
            f"#!{sys.executable}\n"
            "import os, sys\n"
            f"sys.argv[0] = {name!r}\n"
            f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))\n"
        )
        launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    return bindir


def _plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **plan: object) -> Path:
    log = tmp_path / "agent-log.jsonl"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"log": str(log), **plan}))
    monkeypatch.setenv("FAKE_AGENT_PLAN", str(path))
    return log


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _project(repo: Path, text: str, *, trusted: bool = True) -> None:
    (repo / ".fabro").mkdir(exist_ok=True)
    (repo / ".fabro" / "project.toml").write_text(text)
    git(repo, "add", ".fabro/project.toml")
    git(repo, "commit", "-q", "-m", "project config")
    if trusted:
        trust_project(repo)


@pytest.mark.parametrize(
    ("provider", "program", "usage"),
    [
        ("anthropic", "claude", {"input_tokens": 120, "output_tokens": 30, "cost": 0.0123}),
        ("openai", "codex", {"input_tokens": 200, "output_tokens": 40}),
        ("gemini", "gemini", {"input_tokens": 300, "output_tokens": 60}),
    ],
)
def test_each_profile_runs_its_cli_and_routes_on_the_reply(
    repo: Path,
    agent_bin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
    program: str,
    usage: dict,
) -> None:
    (repo / "notes.md").write_text("old notes\n")
    git(repo, "add", "notes.md")
    git(repo, "commit", "-q", "-m", "notes")
    write_workflow(repo, ROUTED % f', provider="{provider}"')
    reply = 'Rewrote the notes.\n{"outcome": "success", "preferred_next_label": "Redo"}'
    log = _plan(
        tmp_path,
        monkeypatch,
        write={"notes.md": "new notes\n", "docs/added.md": "added\n"},
        reply=reply,
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "the notes", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]

    [call] = _calls(log)
    assert call["name"] == program
    assert "Improve the notes" in call["prompt"] and "Goal: the notes" in call["prompt"]
    # The reply's directive routed the graph: redo ran, ship did not.
    assert git(repo, "show", f"fabro/run/{run_id}:redo.txt") == "redo\n"
    assert git(repo, "show", f"fabro/run/{run_id}:notes.md") == "new notes\n"
    assert meta_file(repo, run_id, "nodes/work/response.md") == reply
    assert "Improve the notes" in meta_file(repo, run_id, "nodes/work/prompt.md")
    status = json.loads(meta_file(repo, run_id, "nodes/work/status.json"))
    assert status["files_touched"] == ["docs/added.md", "notes.md"]
    assert status["preferred_label"] == "Redo"

    events = run_events(run_id, repo)
    [completed] = events_named(events, "stage.completed", "work")
    props = completed["properties"]
    assert props["files_touched"] == ["docs/added.md", "notes.md"]
    assert props["status"] == "succeeded"
    for key, value in usage.items():
        assert props["usage"][key] == value
    assert props["context_updates"]["last_response"] == reply[:200]
    [message] = events_named(events, "agent.message", "work")
    assert message["properties"]["text"] == reply
    names = [e["event"] for e in events]
    for name in ("agent.session.started", "agent.processing.end", "agent.session.ended"):
        assert name in names
    assert not events_named(events, "stage.completed", "ship")


def test_a_cli_that_commits_itself_has_its_commit_adopted(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workflow(
        repo,
        SIMPLE.replace(
            "start -> work -> exit",
            'review [shape=box, backend="cli", prompt="Review"]\n    start -> work -> review -> exit',
        )
        % "",
    )
    log = _plan(
        tmp_path,
        monkeypatch,
        write={"feature.py": "print('hi')\n"},
        commit="agent: add the feature",
        reply="Committed the feature.",
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    subjects = git(repo, "log", "--format=%s", f"fabro/run/{run_id}").splitlines()
    assert "agent: add the feature" in subjects
    # The checkpoint commit of the stage goes on top of the agent's own.
    assert (
        subjects.index("agent: add the feature")
        == subjects.index(
            next(s for s in subjects if "work" in s and s != "agent: add the feature")
        )
        + 1
    )
    events = run_events(run_id, repo)
    [completed] = events_named(events, "stage.completed", "work")
    assert completed["properties"]["files_touched"] == ["feature.py"]
    notices = [e["properties"].get("code") for e in events_named(events, "run.notice")]
    assert "stage_commits_adopted" in notices
    # The next stage's preamble lists the files the CLI stage touched.
    review = _calls(log)[-1]["prompt"]
    assert "**work**: succeeded" in review and "Files: feature.py" in review


def test_a_cli_that_is_not_installed_is_refused_clearly(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "empty-bin"
    bindir.mkdir()
    # git and the fabro under test stay reachable; no agent CLI does.
    for tool in ("git", "git-fabro", "sh", "bash"):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if found:
            (bindir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{Path(sys.executable).parent}")
    write_workflow(repo, SIMPLE % ', provider="openai"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "'codex'" in proc.stderr and "not installed" in proc.stderr
    assert 'backend="api"' in proc.stderr and "--dry-run" in proc.stderr
    # Refused before the run exists.
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


def test_a_cli_gone_by_the_time_its_stage_runs_fails_the_stage_clearly(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_BIN", str(agent_bin))
    write_workflow(
        repo,
        """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    uninstall [shape=parallelogram, script="rm \\"$AGENT_BIN/codex\\""]
    work [shape=box, backend="cli", provider="openai", prompt="Work"]
    start -> uninstall -> work -> exit
}
""",
    )
    log = _plan(tmp_path, monkeypatch, reply="never")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert not (agent_bin / "codex").exists() and _calls(log) == []
    [completed] = events_named(run_events(result["run_id"], repo), "stage.completed", "work")
    props = completed["properties"]
    assert props["status"] == "failed" and props["failure_class"] == "deterministic"
    assert "'codex'" in props["error"] and "not installed" in props["error"]
    assert 'backend="api"' in props["error"]


def test_a_cli_that_fails_fails_the_stage_with_its_message(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workflow(repo, SIMPLE % "")
    _plan(tmp_path, monkeypatch, fail="error: not logged in, run claude login", reply="")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    events = run_events(result["run_id"], repo)
    [completed] = events_named(events, "stage.completed", "work")
    props = completed["properties"]
    assert props["status"] == "failed" and props["failure_class"] == "deterministic"
    assert "claude exited with status 3: error: not logged in" in props["error"]
    [error] = events_named(events, "agent.error", "work")
    assert "not logged in" in error["properties"]["error"]["message"]
    assert "not logged in" in meta_file(repo, result["run_id"], "nodes/work/cli-stderr.log")


def test_a_provider_without_a_cli_profile_is_refused_at_its_node(
    repo: Path, agent_bin: Path
) -> None:
    write_workflow(repo, SIMPLE % ', provider="kimi"')
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        "wf.fabro:4" in proc.stderr and "no built-in agent CLI for provider 'kimi'" in proc.stderr
    )
    assert "cli_command" in proc.stderr


def test_the_model_goes_to_the_cli_even_one_the_catalogue_lacks(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workflow(repo, SIMPLE % ', provider="openai", model="codex-internal-9"')
    log = _plan(tmp_path, monkeypatch, reply="ok")
    proc, _ = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [call] = _calls(log)
    assert call["argv"][call["argv"].index("--model") + 1] == "codex-internal-9"
    # An alias resolves through the catalogue; with no provider named, a typo is refused.
    write_workflow(repo, SIMPLE % ', model="sonnet"', name="alias.fabro")
    proc, _ = run_json("run", "alias.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    call = _calls(log)[-1]
    assert call["name"] == "claude" and call["argv"][call["argv"].index("--model") + 1] != "sonnet"
    write_workflow(repo, SIMPLE % ', model="sonet"', name="typo.fabro")
    proc = run_fabro("run", "typo.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1 and "typo.fabro:4" in proc.stderr and "sonnet" in proc.stderr


def test_a_custom_command_template_runs_any_cli(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(
        repo,
        '[run.agent]\ncli_command = ["myagent", "--prompt-file", "{prompt_file}", '
        '"--node", "{node_id}"]\n',
    )
    write_workflow(repo, SIMPLE % "")
    log = _plan(tmp_path, monkeypatch, write={"out.txt": "x\n"}, reply="done by myagent")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [call] = _calls(log)
    assert call["name"] == "myagent"
    assert call["argv"][:1] == ["--prompt-file"] and call["argv"][2:] == ["--node", "work"]
    assert Path(call["argv"][1]).read_text() == call["prompt"]
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "nodes/work/response.md") == "done by myagent"
    events = run_events(run_id, repo)
    [completed] = events_named(events, "stage.completed", "work")
    assert completed["properties"]["files_touched"] == ["out.txt"]
    assert completed["properties"].get("usage") is None  # a text CLI reports none
    [message] = events_named(events, "agent.message", "work")
    assert message["properties"]["text"] == "done by myagent"


@pytest.mark.parametrize(
    ("provider", "level", "flags"),
    [
        ("anthropic", "read-only", ["--permission-mode", "plan"]),
        ("openai", "read-only", ["--sandbox", "read-only"]),
        ("gemini", "full", ["--approval-mode", "yolo"]),
    ],
)
def test_a_cli_agent_gets_its_clis_own_flags_for_its_permission_level(
    repo: Path,
    agent_bin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
    level: str,
    flags: list[str],
) -> None:
    write_workflow(repo, SIMPLE % f', provider="{provider}", permissions="{level}"')
    log = _plan(tmp_path, monkeypatch, reply="looked")
    proc, _result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [call] = _calls(log)
    argv = call["argv"]
    assert any(argv[i : i + 2] == flags for i in range(len(argv))), argv
    for other in ("acceptEdits", "--full-auto", "auto_edit"):
        assert other not in argv


def test_a_custom_cli_is_run_with_a_notice_that_its_level_cannot_be_enforced(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(repo, '[run.agent]\ncli_command = ["myagent", "{prompt_file}"]\n')
    write_workflow(repo, SIMPLE % ', permissions="read-only"')
    log = _plan(tmp_path, monkeypatch, reply="done by myagent")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert len(_calls(log)) == 1
    notices = [
        e["properties"]
        for e in events_named(run_events(result["run_id"], repo), "run.notice")
        if e["properties"]["code"] == "permissions_not_enforced"
    ]
    [notice] = notices
    assert "read-only" in notice["message"] and "myagent" in notice["message"]


def test_a_bad_placeholder_in_the_command_template_is_refused(repo: Path, agent_bin: Path) -> None:
    _project(repo, '[run.agent]\ncli_command = ["myagent", "{promt}"]\n', trusted=False)
    write_workflow(repo, SIMPLE % "")
    proc = run_fabro("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1
    assert "project.toml:2" in proc.stderr and "{promt}" in proc.stderr
    assert "Traceback" not in proc.stderr


HOSTILE = "$(touch pwned-subst); touch pwned-semi; rm -rf notes `touch pwned-tick`"


@pytest.mark.parametrize("profile", ["gemini", "custom"])
def test_a_hostile_prompt_is_never_run_as_shell(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    (repo / "notes").mkdir()
    (repo / "notes" / "keep.md").write_text("keep\n")
    git(repo, "add", "notes")
    git(repo, "commit", "-q", "-m", "notes")
    if profile == "custom":
        # The prompt as one argv item: still never a shell word.
        _project(repo, '[run.agent]\ncli_command = ["myagent", "--say", "{prompt}"]\n')
        attr = ""
    else:
        attr = ', provider="gemini"'  # gemini gets the prompt in -p
    write_workflow(repo, SIMPLE % attr)
    log = _plan(tmp_path, monkeypatch, reply="ok")
    proc, result = run_json("run", "wf.fabro", "--goal", HOSTILE, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [call] = _calls(log)
    assert HOSTILE in call["prompt"]
    if profile == "custom":
        assert any(HOSTILE in item for item in call["argv"])
    run_id = result["run_id"]
    # Nothing ran: no file appeared anywhere (the run's branch holds the worktree as it
    # was left), and nothing was removed.
    assert not list(tmp_path.rglob("pwned-*"))
    tree = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
    assert not [path for path in tree if "pwned" in path]
    assert git(repo, "show", f"fabro/run/{run_id}:notes/keep.md") == "keep\n"


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its parent is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _wait_dead(pids: list[int]) -> bool:
    return wait_until(lambda: all(_dead(pid) for pid in pids), limit=20, what="the CLI's end")


def _sessions_closed(events: list[dict]) -> None:
    """Every agent session that started ended, once."""
    started = [e["session_id"] for e in events if e["event"] == "agent.session.started"]
    ended = [e["session_id"] for e in events if e["event"] == "agent.session.ended"]
    assert started and sorted(started) == sorted(ended)


def test_ctrl_c_kills_the_cli_and_everything_it_started(
    repo: Path, agent_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pidfile = tmp_path / "agent.pids"
    write_workflow(repo, SIMPLE % "")
    _plan(tmp_path, monkeypatch, hang=str(pidfile), reply="never")
    proc = start_fabro(
        ["run", "wf.fabro", "--goal", "g"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_until(pidfile.exists, process=proc, limit=60, what="the CLI's pid file")
    pids = [int(p) for p in pidfile.read_text().split()]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert _wait_dead(pids)
    run_id = re.findall(r"git fabro resume ([0-9A-Z]{26})", err.decode())[-1]
    # The cut-off session is closed.
    _sessions_closed(run_events(run_id, repo))

    # Resumed, the stage runs its CLI again from the start.
    log = _plan(tmp_path, monkeypatch, write={"after.txt": "a\n"}, reply="Finished.")
    log.unlink()
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert [call["name"] for call in _calls(log)] == ["claude"]
    assert meta_file(repo, run_id, "nodes/work/response.md") == "Finished."
    assert git(repo, "show", f"fabro/run/{run_id}:after.txt") == "a\n"


def test_doctor_lists_the_agent_clis_on_path(repo: Path, agent_bin: Path) -> None:
    proc = run_fabro("doctor", "--json", cwd=repo)
    [check] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "agent CLIs"]
    assert check["status"] == "ok"
    for program in ("claude", "codex", "gemini"):
        assert f"{program} ({agent_bin / program})" in check["message"]
