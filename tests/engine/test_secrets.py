"""Secrets never reach git: keys a run sees are masked in every object it writes.

Keys reach the run four ways here: the environment of `git fabro` (printed by `env`),
literal key shapes in a command's output, the goal and inputs (one by its shape, one
by its name). Afterwards not one git
object of the repository holds any of them in full, while the masked form (`***` and
the last four characters) is there; `git fabro logs`, the live tail and the terminal
show the masked form too.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import subprocess
from pathlib import Path

from helpers import git, run_fabro

ALNUM = string.ascii_letters + string.digits


def _token(n: int, alphabet: str = ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _keys() -> dict[str, str]:
    return {
        # Environment: one of a known shape, one that only its name marks as secret
        # (with a quote and a backslash, which JSON escapes).
        "anthropic": "sk-ant-api03-" + _token(40),
        "service": "svc" + _token(12) + '"q\\' + _token(8),
        # Literal shapes printed by the command.
        "github": "ghp_" + _token(36),
        "aws": "AKIA" + _token(16, string.ascii_uppercase + string.digits),
        # The goal and an input.
        "goal": "sk-proj-" + _token(32),
        "input": "xoxb-" + _token(12, string.digits) + "-" + _token(24),
        # An input of no known shape, whose name marks it as secret.
        "named_input": "plain" + _token(16),
    }


def _forms(key: str) -> list[bytes]:
    """The key as raw bytes and as it appears inside a JSON string."""
    return [key.encode(), json.dumps(key)[1:-1].encode()]


def _masked(key: str) -> bytes:
    return json.dumps("***" + key[-4:])[1:-1].encode()


def _all_objects(repo: Path) -> bytes:
    proc = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    )
    return proc.stdout


def _leaks(data: bytes, keys: dict[str, str]) -> list[str]:
    return [name for name, key in keys.items() if any(form in data for form in _forms(key))]


def _workflow(tmp_path: Path, keys: dict[str, str], *, fail: bool = False) -> Path:
    # Kept outside the repository: a key written into a committed file would be the
    # user's own doing, not ours.
    script = f"env; echo {keys['github']}; echo key: {keys['aws']}"
    if fail:
        script = 'test -f \\"$HOME/ok\\" || { echo \\"$MY_SERVICE_TOKEN\\" >&2; exit 1; }'
    path = tmp_path / "secrets.fabro"
    path.write_text(
        f"""
        digraph Secrets {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            show  [shape=parallelogram, script="{script}"]
            start -> show -> exit
        }}
        """
    )
    # Stages get no secret-named variable the run config does not pass on.
    config = tmp_path / "secrets.toml"
    config.write_text(
        '[workflow]\ngraph = "secrets.fabro"\n[run.sandbox.env]\n'
        'ANTHROPIC_API_KEY = "{{ env.ANTHROPIC_API_KEY }}"\n'
        'MY_SERVICE_TOKEN = "{{ env.MY_SERVICE_TOKEN }}"\n'
    )
    return config


def _env(keys: dict[str, str]) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": keys["anthropic"], "MY_SERVICE_TOKEN": keys["service"]}


def test_keys_a_run_sees_are_in_no_git_object(repo: Path, tmp_path: Path) -> None:
    keys = _keys()
    env = _env(keys)
    workflow = _workflow(tmp_path, keys)
    proc = run_fabro(
        "run",
        str(workflow),
        "--goal",
        f"use {keys['goal']}",
        "-V",
        f"key={keys['input']}",
        "-V",
        f"api_token={keys['named_input']}",
        "--json",
        cwd=repo,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    assert _leaks((proc.stdout + proc.stderr).encode(), keys) == []

    # The command did see and print every key (so the masking below is not vacuous).
    scratch = next((Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*"))
    printed = (scratch / "output" / "stdout.log").read_bytes()
    assert _leaks(printed, {k: keys[k] for k in ("anthropic", "service", "github", "aws")}) == [
        "anthropic",
        "service",
        "github",
        "aws",
    ]

    objects = _all_objects(repo)
    assert _leaks(objects, keys) == []
    for name, key in keys.items():
        assert _masked(key) in objects, f"the masked {name} key is in no object"

    # Where each kind landed, masked: the command's log, the manifest, the context.
    meta = f"refs/fabro/meta/{run_id}"
    stdout_log = git(repo, "show", f"{meta}:nodes/show/stdout.log")
    assert f"ANTHROPIC_API_KEY=***{keys['anthropic'][-4:]}" in stdout_log
    assert f"***{keys['github'][-4:]}" in stdout_log
    manifest = json.loads(git(repo, "show", f"{meta}:manifest.json"))
    assert manifest["goal"] == f"use ***{keys['goal'][-4:]}"
    assert manifest["inputs"] == {
        "key": f"***{keys['input'][-4:]}",
        "api_token": f"***{keys['named_input'][-4:]}",
    }
    checkpoint = json.loads(git(repo, "show", f"{meta}:checkpoint.json"))
    assert (
        f"MY_SERVICE_TOKEN=***{keys['service'][-4:]}"
        in checkpoint["context_values"]["command.output"]
    )

    # What people read: the event log (durable and live) in both forms.
    for args in ([], ["--pretty"]):
        logs = run_fabro("logs", run_id, *args, cwd=repo)
        assert logs.returncode == 0, logs.stderr
        assert _leaks(logs.stdout.encode(), keys) == []
    tail = (scratch / "events.jsonl").read_bytes()
    assert _leaks(tail, keys) == []
    started = next(
        json.loads(line) for line in tail.splitlines() if json.loads(line)["event"] == "run.started"
    )
    assert started["properties"]["goal"] == f"use ***{keys['goal'][-4:]}"
    completed = [json.loads(line) for line in tail.splitlines() if b'"stage.completed"' in line]
    assert any(_masked(keys["aws"]).decode() in json.dumps(e) for e in completed)


def test_a_failing_commands_key_is_masked_in_its_error_and_resume_works(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """The error names the command's last stderr line; the terminal shows it masked.
    The goal held a key: git keeps it masked, and resume (which reads the run from git)
    goes on with the masked goal."""
    keys = _keys()
    env = _env(keys)
    workflow = _workflow(tmp_path, keys, fail=True)
    goal = f"use {keys['goal']}"
    proc = run_fabro("run", str(workflow), "--goal", goal, "--json", cwd=repo, env=env)
    assert proc.returncode == 1
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    assert f"***{keys['service'][-4:]}" in proc.stderr
    assert _leaks((proc.stdout + proc.stderr).encode(), keys) == []
    assert _leaks(_all_objects(repo), keys) == []

    (hermetic_env / "ok").write_text("")
    resumed = run_fabro("resume", run_id, "--json", cwd=repo, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert _leaks((resumed.stdout + resumed.stderr).encode(), keys) == []
    assert _leaks(_all_objects(repo), keys) == []
    logs = run_fabro("logs", run_id, cwd=repo)
    goals = [
        e["properties"].get("goal")
        for e in map(json.loads, logs.stdout.splitlines())
        if e["event"] == "run.started"
    ]
    assert goals == [f"use ***{keys['goal'][-4:]}"] * 2


def test_short_or_ordinary_values_are_left_alone(repo: Path, tmp_path: Path) -> None:
    """A short secret-named value would mask ordinary words; a non-secret name is not
    a secret however long."""
    path = tmp_path / "plain.fabro"
    path.write_text(
        """
        digraph Plain {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            show  [shape=parallelogram, script="echo a risk-assessment-of-everything-here; echo $PLAIN_SETTING"]
            start -> show -> exit
        }
        """
    )
    env = {"SHORT_KEY": "a", "PLAIN_SETTING": "an-ordinary-long-value-0123456789"}
    proc = run_fabro("run", str(path), "--json", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    out = git(repo, "show", f"refs/fabro/meta/{run_id}:nodes/show/stdout.log")
    assert out == "a risk-assessment-of-everything-here\nan-ordinary-long-value-0123456789\n"


def test_a_key_where_a_long_log_is_cut_is_not_cut_in_half(repo: Path, tmp_path: Path) -> None:
    """Logs over the limit keep their head and tail; a key printed across the cut would
    be half a key nothing recognises. The cuts fall on line ends instead."""
    token = "svc" + _token(29)
    # 100-byte lines; the token's line spans byte 500,000, the meta copy's head cut.
    code = (
        "import os, sys; out = sys.stdout.buffer; line = b'x' * 99 + bytes([10]); "
        "out.write(line * 4999 + b'y' * 80 + os.environb[b'MY_SERVICE_TOKEN'] + bytes([10])); "
        "out.write(line * 12000)"
    )
    path = tmp_path / "long.fabro"
    path.write_text(
        "digraph Long {\n"
        "  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        f'  show [shape=parallelogram, language=python, script="{code}"]\n'
        "  start -> show -> exit\n}\n"
    )
    config = tmp_path / "long.toml"
    config.write_text(
        '[workflow]\ngraph = "long.fabro"\n'
        '[run.sandbox.env]\nMY_SERVICE_TOKEN = "{{ env.MY_SERVICE_TOKEN }}"\n'
    )
    proc = run_fabro("run", str(config), "--json", cwd=repo, env={"MY_SERVICE_TOKEN": token})
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    scratch = next((Path(os.environ["FABRO_HOME"]) / "runs").glob(f"{run_id}-*"))
    printed = (scratch / "nodes" / "show" / "stdout.log").read_bytes()
    assert printed.index(token.encode()) < 500_000 < printed.index(token.encode()) + len(token)
    # The meta ref keeps the whole log (masked); the context keeps the cut excerpt.
    stored = git(repo, "show", f"refs/fabro/meta/{run_id}:nodes/show/stdout.log")
    assert stored.count("x" * 99 + "\n") == 4999 + 12000
    excerpt = git(repo, "show", f"refs/fabro/meta/{run_id}:artifacts/command.output.json")
    assert "bytes omitted" in excerpt
    objects = _all_objects(repo)
    assert token[:12].encode() not in objects and token[-12:-4].encode() not in objects


def test_a_value_the_run_config_passes_under_a_secret_name_stays_masked_on_resume(
    repo: Path, tmp_path: Path
) -> None:
    """`[run.sandbox.env]` hands a stage a secret under a secret-looking name from a
    host variable whose own name looks harmless: the resume masks it as the run did."""
    value = "plain-looking-" + secrets.token_hex(8)
    go = tmp_path / "go"
    (repo / "pw.fabro").write_text(
        "digraph P {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        f'  show [shape=parallelogram, script="echo pw=$DB_PASSWORD; test -f {go}"]\n'
        "  start -> show -> exit\n}\n"
    )
    git(repo, "add", "pw.fabro")
    git(repo, "commit", "-q", "-m", "pw")
    config = tmp_path / "pw.toml"
    config.write_text(
        f'[workflow]\ngraph = "{repo / "pw.fabro"}"\n'
        '[run.sandbox.env]\nDB_PASSWORD = "{{ env.SERVICE_SETTING }}"\n'
    )
    env = {"SERVICE_SETTING": value}
    proc = run_fabro("run", str(config), "--json", cwd=repo, env=env)
    assert proc.returncode == 1, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    go.write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert git(repo, "show", f"refs/fabro/meta/{run_id}:nodes/show-2/stdout.log").startswith(
        "pw=***"
    )
    assert value[-12:-4].encode() not in _all_objects(repo)
