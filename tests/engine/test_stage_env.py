"""The environment of what a run starts, end to end through `git fabro run`: secret-named
variables are kept from command stages, setup commands, the agent's shell tool, worktree
hooks, MCP stdio servers and agent CLIs; `[run.sandbox.env]` passes a variable on; a
script that mentions a variable it will not get is told of in a `run.notice`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers import git, meta_file, run_events, run_fabro, run_json, write_workflow
from llm_server import LlmServer, Reply, ToolUse

SECRETS = {
    "MY_API_KEY": "key-value-0001",
    "GITHUB_TOKEN": "token-value-0002",
    "SOME_SECRET": "secret-value-0003",
    "DB_PASSWORD": "password-value-0004",
}
SHOWN = ("MY_API_KEY", "GITHUB_TOKEN", "SOME_SECRET", "DB_PASSWORD", "MY_SETTING")

# Prints, for each variable, whether it is set (never its value).
SAY_SET = " ".join(f"${{{name}+{name}}}" for name in SHOWN)

COMMAND = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    show [shape=parallelogram, script="echo set: %s"]
    start -> show -> exit
}
"""


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MY_SETTING", "plain")


def _run_config(repo: Path, text: str) -> None:
    (repo / "run.toml").write_text(f'[workflow]\ngraph = "wf.fabro"\n\n{text}')


def _notices(events: list[dict]) -> list[str]:
    return [
        e["properties"]["message"]
        for e in events
        if e["event"] == "run.notice" and e["properties"]["code"] == "env_stripped"
    ]


def test_a_command_stage_gets_no_secret_named_variable(repo: Path, secrets: None) -> None:
    write_workflow(repo, COMMAND % SAY_SET)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "nodes/show/stdout.log") == "set: MY_SETTING\n"
    # The script asked for four variables it did not get: a notice names them.
    [notice] = _notices(run_events(run_id, repo))
    assert "DB_PASSWORD, GITHUB_TOKEN, MY_API_KEY, SOME_SECRET" in notice
    assert "[run.sandbox.env]" in notice
    assert not any(value in notice for value in SECRETS.values())


def test_a_command_stages_git_works_on_the_run_whatever_git_variables_the_host_has(
    repo: Path, tmp_path: Path
) -> None:
    """Run from a git hook or a shell that set them, variables that point git at other
    objects, another common dir or a ref namespace, or hold it in a push's quarantine,
    would have the stage's own git commit elsewhere or not at all: the stage gets none
    of them, as git fabro's own git gets none."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "objects").mkdir(parents=True)
    host = {
        "GIT_OBJECT_DIRECTORY": str(elsewhere / "objects"),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(elsewhere / "objects"),
        "GIT_COMMON_DIR": str(elsewhere),
        "GIT_NAMESPACE": "elsewhere",
        "GIT_QUARANTINE_PATH": str(elsewhere / "objects"),
    }
    shown = " ".join(f"${{{name}+{name}}}" for name in host)
    write_workflow(
        repo,
        COMMAND.replace(
            "echo set: %s", f"echo got: {shown}; git commit -q --allow-empty -m staged"
        ),
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in host.items():
            patch.setenv(name, value)
        proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "nodes/show/stdout.log") == "got:\n"
    log = git(repo, "log", "--format=%s", f"fabro/run/{run_id}")
    assert "staged" in log.splitlines()
    assert not any((elsewhere / "objects").iterdir())


def test_the_run_config_passes_a_variable_on(repo: Path, secrets: None) -> None:
    write_workflow(repo, COMMAND % SAY_SET)
    _run_config(
        repo,
        '[run.sandbox.env]\nGITHUB_TOKEN = "{{ env.GITHUB_TOKEN }}"\n'
        'LITERAL_TOKEN = "written-out-0005"\n',
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    out = meta_file(repo, run_id, "nodes/show/stdout.log")
    assert out == "set: GITHUB_TOKEN MY_SETTING\n"
    [notice] = _notices(run_events(run_id, repo))
    assert "GITHUB_TOKEN" not in notice and "MY_API_KEY" in notice


def test_an_unset_reference_fails_the_stage_naming_the_field(repo: Path) -> None:
    write_workflow(repo, COMMAND % SAY_SET)
    _run_config(repo, '[run.sandbox.env]\nGITHUB_TOKEN = "{{ env.NOT_SET_ANYWHERE }}"\n')
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode != 0
    events = run_events(result["run_id"], repo)
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert "run.sandbox.env.GITHUB_TOKEN" in failed["properties"]["error"]
    assert "NOT_SET_ANYWHERE" in failed["properties"]["error"]


def test_a_worktree_hook_gets_the_stage_environment(
    repo: Path, secrets: None, tmp_path: Path
) -> None:
    seen = tmp_path / "hook-env.txt"
    write_workflow(repo, COMMAND % "")
    _run_config(
        repo,
        '[run.sandbox.env]\nGITHUB_TOKEN = "{{ env.GITHUB_TOKEN }}"\n'
        '[[run.hooks]]\nevent = "stage_start"\n'
        f'command = "echo set: {SAY_SET} > {seen}"\n',
    )
    proc, _ = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "set: GITHUB_TOKEN MY_SETTING\n"


AGENT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="claude-sonnet-4-6", permissions="full", prompt="Look around"]
    start -> work -> exit
}
"""

ENV_SERVER = """\
import os

from mcp.server.mcpserver import MCPServer

app = MCPServer("env")


@app.tool()
def which(names: str) -> str:
    \"\"\"The given variables that are set.\"\"\"
    return "set: " + " ".join(n for n in names.split() if n in os.environ)


app.run()
"""


def test_the_shell_tool_and_an_mcp_server_get_the_stage_environment(
    repo: Path, secrets: None, llm_server: LlmServer, tmp_path: Path
) -> None:
    server = tmp_path / "env_server.py"
    server.write_text(ENV_SERVER)
    seen = tmp_path / "shell-env.txt"
    write_workflow(repo, AGENT)
    _run_config(
        repo,
        '[run.sandbox.env]\nSOME_SECRET = "{{ env.SOME_SECRET }}"\n'
        '[run.agent.mcps.env]\ntype = "stdio"\n'
        f"command = {json.dumps([sys.executable, str(server)])}\n"
        '[run.agent.mcps.env.env]\nDB_PASSWORD = "{{ env.DB_PASSWORD }}"\n',
    )
    llm_server.script(
        Reply(
            text="Looking.",
            tool_calls=(
                ToolUse("shell", {"command": f"echo set: {SAY_SET} > {seen}"}, id="s1"),
                ToolUse("mcp__env__which", {"names": " ".join(SHOWN)}, id="m1"),
            ),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "set: SOME_SECRET MY_SETTING\n"
    results = [
        e["properties"]
        for e in run_events(result["run_id"], repo)
        if e["event"] == "agent.tool.completed" and e["properties"]["tool_name"].startswith("mcp")
    ]
    [answer] = results
    # The server's own env adds DB_PASSWORD; the run config's sandbox env SOME_SECRET.
    assert "set: SOME_SECRET DB_PASSWORD MY_SETTING" in json.dumps(answer)


FAKE_CLI = """\
import json, os, sys
sys.stdin.read()
names = json.loads(os.environ["CLI_NAMES"])
with open(os.environ["CLI_SEEN"], "w") as fh:
    fh.write(" ".join(n for n in names if n in os.environ))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": "done", "usage": {"input_tokens": 1, "output_tokens": 1}}))
"""


def test_an_agent_cli_gets_its_own_providers_key_only(
    repo: Path, secrets: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "cli-bin"
    bindir.mkdir()
    claude = bindir / "claude"
    claude.write_text(f"#!{sys.executable}\n{FAKE_CLI}")
    claude.chmod(0o755)
    seen = tmp_path / "cli-env.txt"
    keys = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY")
    for key in keys:
        monkeypatch.setenv(key, f"{key.lower()}-value-0006")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CLI_NAMES", json.dumps([*keys, *SHOWN]))
    monkeypatch.setenv("CLI_SEEN", str(seen))
    write_workflow(
        repo,
        AGENT.replace('model="claude-sonnet-4-6"', 'backend="cli", provider="anthropic"'),
    )
    proc, _ = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "ANTHROPIC_API_KEY MY_SETTING"


def test_a_setup_command_gets_the_stage_environment_and_is_told_of(
    repo: Path, secrets: None, tmp_path: Path
) -> None:
    seen = tmp_path / "setup-env.txt"
    write_workflow(repo, COMMAND % "")
    _run_config(
        repo,
        f'[[run.prepare.steps]]\nscript = "echo set: {SAY_SET} > {seen}"\n',
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == "set: MY_SETTING\n"
    [notice] = _notices(run_events(result["run_id"], repo))
    assert notice.startswith("setup command 1 mentions DB_PASSWORD")


def test_the_secret_name_rule_is_the_redactors() -> None:
    from fabro_git.engine.stage_env import mentioned_stripped, stage_environment, stripped_names

    host = {
        "PATH": "/bin",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
        "PASSWORD_STORE_DIR": "/home/u/.pass",
        "AWS_SECRET_ACCESS_KEY": "x" * 20,
        "NPM_CONFIG_CACHE": "kept: no secret name",
        # npm's `_auth`, a user and password: `*_AUTH` is a secret name.
        "NPM_CONFIG__AUTH": "dXNlcjpwYXNzd29yZA==",
        "GIT_DIR": "/elsewhere/.git",
        "SERVICE_CREDENTIAL": "c" * 10,
        "my_token": "lower-case",
    }
    env = stage_environment(host, sandbox={"PASSED": "a-{{ env.my_token }}"}, mark="m.stage.1")
    assert env == {
        "PATH": "/bin",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
        "PASSWORD_STORE_DIR": "/home/u/.pass",
        "NPM_CONFIG_CACHE": "kept: no secret name",
        "PASSED": "a-lower-case",
        "FABRO_PROCESS_MARK": "m.stage.1",
    }
    assert stripped_names(host) == [
        "AWS_SECRET_ACCESS_KEY",
        "NPM_CONFIG__AUTH",
        "SERVICE_CREDENTIAL",
        "my_token",
    ]
    script = 'echo "$AWS_SECRET_ACCESS_KEY ${SERVICE_CREDENTIAL:-none} $PATH $UNSET_TOKEN"'
    assert mentioned_stripped(script, host) == ["AWS_SECRET_ACCESS_KEY", "SERVICE_CREDENTIAL"]
    assert mentioned_stripped(script, host, {"SERVICE_CREDENTIAL": "x"}) == [
        "AWS_SECRET_ACCESS_KEY"
    ]


def test_a_run_config_names_a_bad_sandbox_variable_and_its_line(repo: Path) -> None:
    write_workflow(repo, COMMAND % "")
    _run_config(repo, '[run.sandbox.env]\nBAD = "{{ inputs.x }}"\n')
    proc = run_fabro("run", "run.toml", cwd=repo)
    assert proc.returncode != 0
    assert "run.toml:5: run.sandbox.env.BAD" in proc.stderr


def test_doctor_names_what_stages_do_not_get_never_its_value(repo: Path, secrets: None) -> None:
    proc = run_fabro("doctor", "--json", cwd=repo)
    [check] = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "stage environment"]
    for name in SECRETS:
        assert name in check["message"]
    assert "MY_SETTING" not in check["message"]
    assert not any(value in proc.stdout for value in SECRETS.values())
