"""Lifecycle hooks (`[[run.hooks]]`) fired by real runs: `git fabro run run.toml` in a
real repository, hooks that are shell commands writing what they were given into a
directory the test reads, and webhooks POSTing to a server the test runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import (
    git,
    meta_file,
    pids_with_env,
    run_events,
    run_fabro,
    run_json,
    start_fabro,
    tail_has,
    trust_project,
    wait_until,
)
from llm_server import LlmServer, Recorded, Reply, ToolUse

PIPELINE = """\
digraph H {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    build [shape=parallelogram, script="echo built > built.txt"]
    deploy [shape=parallelogram, script="echo deployed > deployed.txt"]
    start -> build -> deploy -> exit
}
"""

# Writes what a hook was given: the payload from stdin, FABRO_* variables, the cwd.
RECORDER = """\
d="$1"
mkdir -p "$d"
n="$d/$FABRO_EVENT.$$"
cat > "$n.json.part"
env | grep '^FABRO_' | sort > "$n.env"
env | grep -c '^SECRET_HOOK_TOKEN=' > "$n.secret" || true
pwd -P > "$n.pwd"
mv "$n.json.part" "$n.json"
"""


@pytest.fixture
def log(tmp_path: Path) -> Path:
    directory = tmp_path / "hooklog"
    directory.mkdir()
    return directory


def record_cmd(tmp_path: Path, log: Path) -> str:
    script = tmp_path / "record.sh"
    script.write_text(RECORDER)
    return f"sh {script} {log}"


def configure(repo: Path, hooks: str, workflow: str = PIPELINE) -> None:
    (repo / "wf.fabro").write_text(workflow)
    (repo / "run.toml").write_text('[workflow]\ngraph = "wf.fabro"\n' + hooks)
    git(repo, "add", "wf.fabro", "run.toml")
    git(repo, "commit", "-q", "-m", "workflow and run config")


def hook(event: str, command: str, **extra: object) -> str:
    lines = ["[[run.hooks]]", f"event = {json.dumps(event)}", f"command = {json.dumps(command)}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def records(log: Path) -> list[dict]:
    """What each hook firing wrote: its payload, FABRO_* env, cwd."""
    out = []
    for payload in sorted(log.glob("*.json")):
        stem = str(payload)[: -len(".json")]
        env = dict(
            line.split("=", 1) for line in Path(stem + ".env").read_text().splitlines() if line
        )
        out.append(
            {
                "payload": json.loads(payload.read_text()),
                "env": env,
                "pwd": Path(stem + ".pwd").read_text().strip(),
                "secret": Path(stem + ".secret").read_text().strip() == "1",
            }
        )
    return out


def notices(events: list[dict], code: str) -> list[dict]:
    return [e for e in events if e["event"] == "run.notice" and e["properties"]["code"] == code]


def branch_has(repo: Path, run_id: str, path: str) -> bool:
    proc = subprocess.run(
        ["git", "cat-file", "-e", f"fabro/run/{run_id}:{path}"], cwd=repo, check=False
    )
    return proc.returncode == 0


def test_command_hooks_get_each_run_and_stage_event_with_its_payload_and_env(
    repo: Path, tmp_path: Path, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_HOOK_TOKEN", "s3cr3t-value-for-hooks")
    cmd = record_cmd(tmp_path, log)
    events = (
        "sandbox_ready",
        "run_start",
        "stage_start",
        "stage_complete",
        "edge_selected",
        "checkpoint_saved",
        "run_complete",
        "sandbox_cleanup",
    )
    toml = "".join(hook(event, cmd) for event in events)
    toml += hook("run_complete", cmd.replace("hooklog", "hostlog"), sandbox=False)
    configure(repo, toml)
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    got = records(log)
    by_event: dict[str, list[dict]] = {}
    for record in got:
        payload = record["payload"]
        assert record["env"]["FABRO_EVENT"] == payload["event"]
        assert record["env"]["FABRO_RUN_ID"] == payload["run_id"] == run_id
        assert record["env"]["FABRO_WORKFLOW"] == payload["workflow_name"] == "H"
        assert record["env"]["FABRO_HOOK_CONTEXT"].endswith(".json")
        assert record["env"].get("FABRO_NODE_ID") == payload.get("node_id")
        # A hook in the worktree never sees secret-named variables.
        assert record["secret"] is False
        assert record["pwd"].endswith("/worktree") and record["pwd"] == payload["cwd"]
        by_event.setdefault(payload["event"], []).append(payload)
    assert set(by_event) == set(events)
    for once in ("sandbox_ready", "run_start", "run_complete", "sandbox_cleanup"):
        assert len(by_event[once]) == 1, once
    stages = ["start", "build", "deploy", "exit"]
    assert sorted(p["node_id"] for p in by_event["stage_start"]) == sorted(stages)
    build = next(p for p in by_event["stage_start"] if p["node_id"] == "build")
    assert build["handler_type"] == "command" and build["attempt"] == 1
    assert "edge_from" not in build  # fields that do not apply are left out
    assert sorted(p["node_id"] for p in by_event["stage_complete"]) == sorted(stages)
    assert {p["status"] for p in by_event["stage_complete"]} == {"succeeded"}
    edges = {(p["edge_from"], p["edge_to"]) for p in by_event["edge_selected"]}
    assert edges == {("start", "build"), ("build", "deploy"), ("deploy", "exit")}
    saved = {p["node_id"]: p["git_commit_sha"] for p in by_event["checkpoint_saved"]}
    assert set(saved) == set(stages)
    assert saved["exit"] == git(repo, "rev-parse", f"fabro/run/{run_id}").strip()
    assert by_event["run_complete"][0]["status"] == "succeeded"
    # A host hook runs in the user's checkout, with the user's environment.
    [host] = records(tmp_path / "hostlog")
    assert host["pwd"] == str(repo.resolve()) and host["secret"] is True
    # Nothing a hook was given or wrote reached git.
    assert not branch_has(repo, run_id, "hooklog")
    assert notices(run_events(run_id, repo), "hook_failed") == []


def test_stage_failed_and_run_failed_hooks_get_the_failure(
    repo: Path, tmp_path: Path, log: Path
) -> None:
    cmd = record_cmd(tmp_path, log)
    configure(
        repo,
        hook("stage_failed", cmd) + hook("run_failed", cmd) + hook("run_complete", cmd),
        PIPELINE.replace("echo built > built.txt", "echo broken >&2; exit 3"),
    )
    proc, _ = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode != 0
    got = {r["payload"]["event"]: r["payload"] for r in records(log)}
    assert set(got) == {"stage_failed", "run_failed"}
    assert got["stage_failed"]["node_id"] == "build"
    assert got["stage_failed"]["handler_type"] == "command"
    assert "status 3" in got["stage_failed"]["failure_reason"]
    assert "build" in got["run_failed"]["failure_reason"]


def test_a_matcher_picks_stages_by_node_id_or_handler_type(
    repo: Path, tmp_path: Path, log: Path
) -> None:
    cmd = record_cmd(tmp_path, log)
    configure(
        repo,
        hook("stage_start", cmd, matcher="^deploy$")
        + hook("stage_complete", cmd, matcher="^command$")
        + hook("run_start", cmd, matcher="never-matches-anything"),
    )
    proc, _ = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    fired = sorted((r["payload"]["event"], r["payload"].get("node_id")) for r in records(log))
    # run_start takes no matcher: it fires whatever the matcher says.
    assert fired == [
        ("run_start", None),
        ("stage_complete", "build"),
        ("stage_complete", "deploy"),
        ("stage_start", "deploy"),
    ]


def test_a_blocking_stage_start_hook_that_exits_2_fails_the_stage_unrun(repo: Path) -> None:
    configure(
        repo,
        hook("stage_start", "echo 'deploys are frozen' >&2; exit 2", matcher="deploy"),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 1
    run_id = result["run_id"]
    assert result["status"] == "failed"
    assert branch_has(repo, run_id, "built.txt")
    assert not branch_has(repo, run_id, "deployed.txt")
    events = run_events(run_id, repo)
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert failed["node_id"] == "deploy"
    assert "deploys are frozen" in failed["properties"]["error"]
    [run_failed] = [e for e in events if e["event"] == "run.failed"]
    assert "deploys are frozen" in run_failed["properties"]["error"]


def test_what_a_hook_changes_in_the_repository_between_stages_is_not_the_next_stages(
    repo: Path,
) -> None:
    """A stage's look before it may be taken early, at the previous checkpoint, but not
    across a hook: a `checkpoint_saved` hook that sets a config key leaves it set, and
    the stage after it is not failed for the change."""
    configure(
        repo,
        hook("checkpoint_saved", 'git config "fabro.saved-$FABRO_NODE_ID" yes', blocking=True),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    for node in ("start", "build", "deploy"):
        assert git(repo, "config", "--get", f"fabro.saved-{node}").strip() == "yes"
    events = run_events(result["run_id"], repo)
    assert not notices(events, "repository_changed")


def test_a_run_start_hook_that_fails_blocks_the_run_before_any_stage(repo: Path) -> None:
    configure(repo, hook("run_start", "exit 7"))
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 1
    events = run_events(result["run_id"], repo)
    assert [e for e in events if e["event"] == "stage.started"] == []
    [failed] = [e for e in events if e["event"] == "run.failed"]
    assert "hook exited with code 7" in failed["properties"]["error"]
    assert notices(events, "hook_failed")


def test_a_skip_decision_skips_the_stage_and_the_run_goes_on(repo: Path) -> None:
    decide = (
        'if [ "$FABRO_NODE_ID" = deploy ]; then '
        'echo \'{"decision": "skip", "reason": "no deploys on Fridays"}\'; fi'
    )
    configure(repo, hook("stage_start", decide))
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert branch_has(repo, run_id, "built.txt")
    assert not branch_has(repo, run_id, "deployed.txt")
    status = json.loads(meta_file(repo, run_id, "nodes/deploy/status.json"))
    assert status["status"] == "skipped"
    assert "no deploys on Fridays" in status["notes"]


def test_an_edge_selected_override_redirects_the_walk(repo: Path) -> None:
    workflow = PIPELINE.replace(
        "start -> build -> deploy -> exit",
        'rollback [shape=parallelogram, script="echo rolled > rolled.txt"]\n'
        "    start -> build -> deploy -> exit\n    rollback -> exit",
    )
    decide = (
        'if [ "$(sed -n \'s/.*"edge_to":"\\([a-z]*\\)".*/\\1/p\')" = deploy ]; then '
        'echo \'{"decision": "override", "edge_to": "rollback"}\'; fi'
    )
    configure(repo, hook("edge_selected", decide), workflow)
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert branch_has(repo, run_id, "rolled.txt")
    assert not branch_has(repo, run_id, "deployed.txt")
    assert notices(run_events(run_id, repo), "hook_override")


def test_a_hook_that_times_out_is_a_notice_and_the_run_goes_on(repo: Path, tmp_path: Path) -> None:
    never = tmp_path / "never-created"
    pid_file = tmp_path / "hook.pid"
    waiter = f"echo $$ > {pid_file}; while [ ! -e {never} ]; do sleep 0.05; done"
    configure(repo, hook("stage_start", waiter, matcher="^build$", timeout_ms=500))
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert branch_has(repo, run_id, "built.txt")
    [notice] = notices(run_events(run_id, repo), "hook_timeout")
    assert notice["properties"]["level"] == "warn"
    assert "timed out after 0.5s" in notice["properties"]["message"]
    # The hook was stopped, not left waiting.
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_non_blocking_hooks_run_beside_the_run_and_are_waited_for_at_its_end(
    repo: Path, tmp_path: Path
) -> None:
    # The build stage's hook waits for a file the deploy stage makes: were it awaited,
    # deploy could never start and the hook would time out.
    go, done = tmp_path / "go", tmp_path / "done"
    waiter = f"while [ ! -e {go} ]; do sleep 0.05; done; echo finished > {done}"
    configure(
        repo,
        hook("stage_complete", waiter, matcher="^build$", timeout_ms=60_000),
        PIPELINE.replace(
            "echo deployed > deployed.txt", f"echo deployed > deployed.txt; touch {go}"
        ),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert done.read_text() == "finished\n"
    assert notices(run_events(result["run_id"], repo), "hook_timeout") == []


def test_hooks_merge_by_id_across_user_project_and_run_config(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()

    def mark(name: str) -> str:
        return f"touch {marks / name}"

    user = hermetic_env / ".config" / "git-fabro" / "settings.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        hook("run_start", mark("user-notify"), id="notify") + hook("run_start", mark("user-own"))
    )
    (repo / ".fabro").mkdir()
    (repo / ".fabro" / "project.toml").write_text(
        hook("run_start", mark("project-notify"), id="notify")
    )
    git(repo, "add", ".fabro")
    trust_project(repo)
    configure(repo, hook("run_start", mark("run-config")))
    proc, _ = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in marks.iterdir()) == ["project-notify", "run-config", "user-own"]


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, dict, dict]]
    status = 200
    answer = b""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        self.received.append((self.path, dict(self.headers), body))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[type[_Receiver]]:
    handler = type("Receiver", (_Receiver,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.port = server.server_address[1]  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def http_hook(event: str, url: str, **extra: object) -> str:
    lines = [
        "[[run.hooks]]",
        f"event = {json.dumps(event)}",
        'type = "http"',
        f"url = {json.dumps(url)}",
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items() if key != "headers"]
    if "headers" in extra:
        lines.append("[run.hooks.headers]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra["headers"].items()]  # type: ignore[attr-defined]
    return "\n".join(lines) + "\n"


def test_http_hooks_post_the_event_with_allowed_variables_in_headers(
    repo: Path, webhook: type[_Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_TOKEN", "tok-12345")
    monkeypatch.setenv("OTHER_VAR", "not-allowed")
    url = f"http://127.0.0.1:{webhook.port}/done"  # type: ignore[attr-defined]
    configure(
        repo,
        http_hook(
            "stage_complete",
            url,
            tls="off",
            allowed_env_vars=["HOOK_TOKEN"],
            headers={"Authorization": "Bearer $HOOK_TOKEN", "X-Other": "${OTHER_VAR}"},
        ),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    nodes = sorted(body["node_id"] for _path, _headers, body in webhook.received)
    assert nodes == ["build", "deploy", "exit", "start"]
    path, headers, body = webhook.received[0]
    assert path == "/done"
    assert headers["Authorization"] == "Bearer tok-12345"
    assert headers["X-Other"] == "${OTHER_VAR}"
    assert body["run_id"] == result["run_id"] and body["event"] == "stage_complete"


def test_a_failing_http_hook_is_a_notice_and_fails_open(
    repo: Path, webhook: type[_Receiver]
) -> None:
    webhook.status = 500
    url = f"http://127.0.0.1:{webhook.port}/gate"  # type: ignore[attr-defined]
    configure(repo, http_hook("stage_start", url, tls="off", matcher="^build$"))
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert len(webhook.received) == 1
    assert branch_has(repo, result["run_id"], "built.txt")
    [notice] = notices(run_events(result["run_id"], repo), "hook_failed")
    assert "answered 500" in notice["properties"]["message"]


def test_an_http_hook_can_block_with_a_json_decision(repo: Path, webhook: type[_Receiver]) -> None:
    webhook.answer = b'{"decision": "block", "reason": "change freeze"}'
    url = f"http://127.0.0.1:{webhook.port}/gate"  # type: ignore[attr-defined]
    configure(repo, http_hook("stage_start", url, tls="off", matcher="^deploy$"))
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 1
    assert not branch_has(repo, result["run_id"], "deployed.txt")
    events = run_events(result["run_id"], repo)
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert failed["node_id"] == "deploy"
    assert "change freeze" in failed["properties"]["error"]


def test_a_plain_http_url_needs_tls_off(repo: Path) -> None:
    configure(repo, http_hook("run_complete", "http://127.0.0.1:9/x"))
    proc = run_fabro("run", "run.toml", cwd=repo)
    assert proc.returncode == 1
    assert "run.toml:6: run.hooks[0].url" in proc.stderr and 'tls = "off"' in proc.stderr


AGENT = """\
digraph A {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="sonnet", permissions="full", prompt="Clean up"]
    start -> work -> exit
}
"""


def test_a_pre_tool_use_hook_blocks_the_agents_shell_and_post_hooks_see_the_rest(
    repo: Path, tmp_path: Path, log: Path, llm_server: LlmServer
) -> None:
    cmd = record_cmd(tmp_path, log)
    configure(
        repo,
        hook("pre_tool_use", "echo 'no shell for agents' >&2; exit 2", matcher="^shell$")
        + hook("post_tool_use", cmd, matcher="write_file|edit_file")
        + hook("pre_tool_use", cmd, matcher="^shell$"),
        AGENT,
    )
    llm_server.script(
        Reply(
            text="Cleaning.",
            tool_calls=(
                ToolUse("shell", {"command": "touch pwned.txt"}, id="s1"),
                ToolUse("write_file", {"path": "clean.txt", "content": "ok\n"}, id="w1"),
            ),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "tidy", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert not branch_has(repo, run_id, "pwned.txt")
    assert git(repo, "show", f"fabro/run/{run_id}:clean.txt") == "ok\n"
    # The model was told why its call did not run.
    sent = json.dumps(llm_server.requests[1].body["messages"])
    assert "not run" in sent and "no shell for agents" in sent
    # The first pre_tool_use hook blocked: the second never fired. post_tool_use saw the write.
    fired = [r["payload"] for r in records(log)]
    assert [p["event"] for p in fired] == ["post_tool_use"]
    [post] = fired
    assert post["tool_name"] == "write_file" and post["tool_call_id"] == "w1"
    assert post["node_id"] == "work" and "tool_output" in post
    events = run_events(run_id, repo)
    [shell] = [
        e
        for e in events
        if e["event"] == "agent.tool.completed" and e["properties"]["tool_name"] == "shell"
    ]
    assert shell["properties"]["is_error"] is True


def test_tool_hook_payloads_carry_the_input_and_the_error(
    repo: Path, tmp_path: Path, log: Path, llm_server: LlmServer
) -> None:
    cmd = record_cmd(tmp_path, log)
    configure(
        repo,
        hook("pre_tool_use", cmd, matcher="write_file")
        + hook("post_tool_use_failure", cmd)
        + hook("post_tool_use", cmd, matcher="^shell$"),
        AGENT,
    )
    llm_server.script(
        Reply(
            text="Writing.",
            tool_calls=(
                ToolUse("write_file", {"path": "a.txt", "content": "a\n"}, id="w1"),
                ToolUse("read_file", {"path": "missing.txt"}, id="r1"),
            ),
        ),
        Reply(text="Done."),
    )
    proc, result = run_json("run", "run.toml", "--goal", "tidy", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:a.txt") == "a\n"
    got = {r["payload"]["event"]: r["payload"] for r in records(log)}
    assert set(got) == {"pre_tool_use", "post_tool_use_failure"}
    pre = got["pre_tool_use"]
    assert pre["tool_name"] == "write_file" and pre["node_id"] == "work"
    assert pre["tool_input"] == {"path": "a.txt", "content": "a\n"}
    failure = got["post_tool_use_failure"]
    assert failure["tool_name"] == "read_file" and failure["tool_call_id"] == "r1"
    assert "missing.txt" in failure["error_message"] and "tool_output" not in failure


def test_a_failing_hooks_output_reaches_git_only_redacted(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hooksecret-" + "q7" * 12
    monkeypatch.setenv("DEPLOY_SERVICE_TOKEN", secret)
    # On the host, a hook sees the user's environment, and may well print a key.
    configure(
        repo,
        hook("run_complete", 'echo "token was $DEPLOY_SERVICE_TOKEN" >&2; exit 1', sandbox=False),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    [notice] = notices(run_events(result["run_id"], repo), "hook_failed")
    assert "exited with code 1" in notice["properties"]["message"]
    assert "***" + secret[-4:] in notice["properties"]["message"]
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    assert secret.encode() not in objects


FAN_OUT = """\
digraph P {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    a     [shape=parallelogram, script="echo a > a.txt"]
    b     [shape=parallelogram, script="exit 1"]
    join  [shape=tripleoctagon]
    start -> fan
    fan -> a
    fan -> b
    a -> join
    b -> join
    join -> exit
}
"""


def test_parallel_hooks_fire_around_the_fan_out_and_stage_hooks_in_branches(
    repo: Path, tmp_path: Path, log: Path
) -> None:
    cmd = record_cmd(tmp_path, log)
    configure(
        repo,
        hook("parallel_start", cmd, matcher="ignored")
        + hook("parallel_complete", cmd)
        + hook("stage_failed", cmd),
        FAN_OUT,
    )
    proc, _ = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    got = {r["payload"]["event"]: r["payload"] for r in records(log)}
    assert set(got) == {"parallel_start", "parallel_complete", "stage_failed"}
    assert got["parallel_start"]["node_id"] == "fan"
    assert got["parallel_start"]["branch_count"] == 2
    assert (
        got["parallel_complete"]["success_count"],
        got["parallel_complete"]["failure_count"],
    ) == (1, 1)
    assert got["stage_failed"]["node_id"] == "b"


def test_a_stage_retrying_hook_can_stop_the_retries(repo: Path, tmp_path: Path) -> None:
    tries, never = tmp_path / "tries", tmp_path / "never-created"
    # A stage that always times out: a transient failure, which is retried.
    wait = f"echo x >> {tries}; while [ ! -e {never} ]; do sleep 0.05; done"
    workflow = PIPELINE.replace(
        'script="echo built > built.txt"',
        f'script="{wait}", timeout="300ms", max_retries=2, retry_policy="linear"',
    )
    configure(
        repo,
        hook("stage_retrying", "echo 'flaky build, giving up' >&2; exit 2", blocking=True),
        workflow,
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 1
    assert tries.read_text() == "x\n"  # one attempt, no retry
    events = run_events(result["run_id"], repo)
    assert [e for e in events if e["event"] == "stage.retrying"] == []
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert failed["node_id"] == "build" and failed["properties"]["will_retry"] is False
    assert "flaky build, giving up" in failed["properties"]["error"]


def model_hook(event: str, kind: str, prompt: str, **extra: object) -> str:
    lines = [
        "[[run.hooks]]",
        f"event = {json.dumps(event)}",
        f"type = {json.dumps(kind)}",
        f"prompt = {json.dumps(prompt)}",
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def asked(request: Recorded, prompt: str) -> tuple[str, dict]:
    """The text of the request's message that carries `prompt`, and the event JSON the
    hook put after it."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str) and prompt in value:
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(request.body)
    [text] = found
    return text, json.loads(text[text.index("{") :])


def test_a_blocking_prompt_hook_whose_model_says_block_fails_the_stage_unrun(
    repo: Path, llm_server: LlmServer
) -> None:
    configure(
        repo,
        model_hook("stage_start", "prompt", "May this stage run today?", matcher="deploy"),
    )
    llm_server.script(
        Reply(text='Looking at it.\n```json\n{"ok": false, "reason": "deploys are frozen"}\n```')
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = result["run_id"]
    assert branch_has(repo, run_id, "built.txt")
    assert not branch_has(repo, run_id, "deployed.txt")
    # One call: the hook's prompt and the event's JSON, as a command hook reads it.
    [request] = llm_server.requests
    _text, payload = asked(request, "May this stage run today?")
    assert payload["event"] == "stage_start" and payload["node_id"] == "deploy"
    assert payload["run_id"] == run_id and payload["workflow_name"] == "H"
    events = run_events(run_id, repo)
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert failed["node_id"] == "deploy"
    assert "deploys are frozen" in failed["properties"]["error"]


def test_a_prompt_hook_that_allows_lets_the_stage_run_and_a_non_blocking_block_is_heard_of(
    repo: Path, llm_server: LlmServer
) -> None:
    configure(
        repo,
        model_hook("stage_start", "prompt", "Gate: may it run?", matcher="deploy")
        + model_hook("stage_complete", "prompt", "Review: was it good?", matcher="build"),
    )
    llm_server.script_when("Gate: may it run?", Reply(text='{"ok": true}'))
    llm_server.script_when(
        "Review: was it good?",
        Reply(text='{"decision": "block", "reason": "the build log is thin"}'),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert branch_has(repo, run_id, "deployed.txt")
    assert len(llm_server.requests) == 2
    events = run_events(run_id, repo)
    [heard] = notices(events, "hook_not_blocking")
    assert "the build log is thin" in heard["properties"]["message"]
    # The hooks' model calls are the run's spending.
    [completed] = [e for e in events if e["event"] == "run.completed"]
    usage = completed["properties"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (24, 10)


def test_an_agent_hook_reads_the_worktree_with_its_tools_then_decides(
    repo: Path, llm_server: LlmServer
) -> None:
    configure(
        repo,
        model_hook(
            "stage_start",
            "agent",
            "Check the build output before the deploy.",
            matcher="deploy",
            max_tool_rounds=2,
        ),
    )
    llm_server.script(
        Reply(text="Reading.", tool_calls=(ToolUse("read_file", {"path": "built.txt"}, id="r1"),)),
        Reply(text='The build is there.\n{"ok": true}'),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert branch_has(repo, result["run_id"], "deployed.txt")
    first, second = llm_server.requests
    _text, payload = asked(first, "Check the build output before the deploy.")
    assert payload["node_id"] == "deploy"
    # The tool ran in the run's worktree: the model read the build stage's file.
    assert "built" in json.dumps(second.body["messages"][-1])


def test_a_model_hook_whose_model_cannot_be_reached_stops_the_run_before_it_starts(
    repo: Path,
) -> None:
    # Model hooks fail open: an unknown model would only let every event through.
    configure(
        repo,
        model_hook("stage_start", "prompt", "Is it safe?", name="guard", model="no-such-model-x"),
    )
    proc = run_fabro("run", "run.toml", cwd=repo)
    assert proc.returncode != 0
    assert "guard" in proc.stderr and "no-such-model-x" in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro/meta") == ""


def test_a_resumed_run_fires_the_hooks_its_manifest_recorded(
    repo: Path, tmp_path: Path, log: Path
) -> None:
    ready = tmp_path / "ready"
    configure(
        repo,
        hook("run_start", record_cmd(tmp_path, log)),
        PIPELINE.replace("echo built > built.txt", f"test -e {ready} && echo built > built.txt"),
    )
    proc, result = run_json("run", "run.toml", cwd=repo)
    assert proc.returncode == 1
    # The run config changes after the run started: the resume keeps the recorded hooks.
    (repo / "run.toml").write_text('[workflow]\ngraph = "wf.fabro"\n')
    ready.touch()
    proc = run_fabro("resume", result["run_id"], cwd=repo)
    assert proc.returncode == 0, proc.stderr
    starts = [r["payload"] for r in records(log)]
    assert sorted(p.get("resumed", False) for p in starts) == [False, True]


# `nap` waits far longer than any test unless $HOME/quick exists (for the resume).
NAPPING = PIPELINE.replace(
    'script="echo deployed > deployed.txt"',
    'script="if [ ! -f \\"$HOME/quick\\" ]; then sleep 600; fi; echo deployed > deployed.txt"',
)


@pytest.fixture
def silent_endpoint() -> Iterator[tuple[str, threading.Event]]:
    """A URL that takes a POST and never answers, and an Event set once one arrived."""
    server = socket.create_server(("127.0.0.1", 0))
    arrived, done = threading.Event(), threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                arrived.set()
                done.wait(120)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hook", arrived
    finally:
        done.set()
        server.close()
        thread.join(5)


def _start_run(repo: Path, err: Path) -> subprocess.Popen:
    """`git fabro run run.toml` in the background, in its own session (a signal sent to
    it reaches it alone), its stderr in `err`."""
    with err.open("wb") as stderr:
        return start_fabro(
            ["run", "run.toml"],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def _in_deploy_once(
    repo: Path,
    proc: subprocess.Popen,
    ready: Callable[[], bool],
    said: Callable[[], object],
) -> str:
    """Wait until `ready()` and the run (`proc`, `NAPPING`) is in its `deploy` stage;
    returns the run's id. `said` tells what the run printed, should it end first."""
    run_id = ""
    deadline = time.monotonic() + 60
    while not (ready() and run_id and tail_has(run_id, "stage.started", "deploy")):
        assert proc.poll() is None, said()
        assert time.monotonic() < deadline, "the run never got to deploy with its hooks"
        if not run_id:
            ids = git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta")
            run_id = ids.split()[0] if ids.split() else ""
        time.sleep(0.05)
    return run_id


def _kill_leftovers(proc: subprocess.Popen, run_id: str) -> None:
    """After a test: the run and its stage_complete hooks, if anything is left of them."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="stage_complete") if run_id else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_stopped_run_stops_its_non_blocking_hooks_instead_of_waiting_for_them(
    repo: Path,
    tmp_path: Path,
    hermetic_env: Path,
    silent_endpoint: tuple[str, threading.Event],
    sig: signal.Signals,
) -> None:
    url, posted = silent_endpoint
    pid_file = tmp_path / "hook.pid"
    configure(
        repo,
        hook(
            "stage_complete",
            f"echo $$ > {pid_file}.part; mv {pid_file}.part {pid_file}; sleep 600",
            name="slow-notify",
            matcher="^build$",
            timeout_ms=600_000,
        )
        + http_hook(
            "stage_complete",
            url,
            name="silent-webhook",
            matcher="^build$",
            tls="off",
            timeout_ms=600_000,
        ),
        NAPPING,
    )
    proc = start_fabro(
        ["run", "run.toml"],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    run_id = ""
    try:
        # Both hooks are running beside the run, and the run is in its next stage.
        run_id = _in_deploy_once(
            repo, proc, lambda: pid_file.exists() and posted.is_set(), proc.communicate
        )
        hook_pids = pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="stage_complete")
        assert int(pid_file.read_text()) in hook_pids
        sent = time.monotonic()
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        _kill_leftovers(proc, run_id)
    assert proc.returncode == 130, stderr
    assert took < 30, f"took {took:.1f}s to stop"
    assert "Traceback" not in stderr
    # The hook's shell and its sleep are gone.
    assert [
        p
        for p in hook_pids
        if p in pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="stage_complete")
    ] == []
    events = run_events(run_id, repo)
    [stopped] = notices(events, "hooks_stopped")
    assert "slow-notify" in stopped["properties"]["message"]
    assert "silent-webhook" in stopped["properties"]["message"]
    assert notices(events, "hook_timeout") == []

    (hermetic_env / "quick").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert branch_has(repo, run_id, "deployed.txt")


def test_a_dry_run_fires_no_hooks_and_says_so(
    repo: Path, tmp_path: Path, log: Path, webhook: type[_Receiver]
) -> None:
    url = f"http://127.0.0.1:{webhook.port}/hook"  # type: ignore[attr-defined]
    cmd = record_cmd(tmp_path, log)
    configure(
        repo,
        hook("run_start", cmd, name="announce")
        + hook("stage_complete", cmd, name="notify")
        + hook("run_complete", cmd, sandbox=False)
        + http_hook("run_complete", url, name="webhook", tls="off"),
    )
    proc, result = run_json("run", "run.toml", "--dry-run", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert records(log) == [] and webhook.received == []
    run_id = result["run_id"]
    assert branch_has(repo, run_id, "deployed.txt")  # the run itself went on
    [notice] = notices(run_events(run_id, repo), "hooks_skipped")
    assert notice["properties"]["level"] == "info"
    message = notice["properties"]["message"]
    assert "--dry-run" in message
    for name in ("announce", "notify", "run_complete-command-3", "webhook"):
        assert name in message


def test_a_hook_running_when_git_fabro_is_killed_dies_with_it(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    # A non-blocking hook still running (and a process it put in the background) when
    # the run is killed outright: the run's watcher kills its whole group.
    pid_file = tmp_path / "hook.pid"
    configure(
        repo,
        hook(
            "stage_complete",
            f"(sleep 600) & echo $! > {pid_file}.part; mv {pid_file}.part {pid_file}; wait",
            name="slow-notify",
            matcher="^build$",
            timeout_ms=600_000,
        ),
        NAPPING,
    )
    err = tmp_path / "run.err"
    proc = _start_run(repo, err)
    run_id, hook_pids = "", []
    try:
        run_id = _in_deploy_once(repo, proc, pid_file.exists, err.read_text)
        hook_pids = pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="stage_complete")
        background = int(pid_file.read_text())
        assert background in hook_pids
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(
            lambda: not pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="stage_complete"),
            limit=10,
            what="the hook's end",
        )
    finally:
        _kill_leftovers(proc, run_id)
        # The stage git fabro was running when killed (`sleep 600`) goes with it too.
        (hermetic_env / "quick").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert branch_has(repo, run_id, "deployed.txt")


def test_asking_again_while_the_run_finishes_cuts_its_blocking_hooks_short(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    # Ctrl-C stops the stage; the finish then runs a blocking cleanup hook that would
    # hold the exit for its whole timeout. A second Ctrl-C stops that hook (its process
    # group killed) and the run ends, its final snapshot written.
    pid_file = tmp_path / "cleanup.pid"
    configure(
        repo,
        hook(
            "sandbox_cleanup",
            f"echo $$ > {pid_file}.part; mv {pid_file}.part {pid_file}; "
            '[ -f "$HOME/quick" ] || sleep 600',
            name="slow-cleanup",
            blocking=True,
            timeout_ms=600_000,
        ),
        NAPPING,
    )
    err = tmp_path / "run.err"
    proc = _start_run(repo, err)
    run_id = ""
    try:
        run_id = _in_deploy_once(repo, proc, lambda: True, err.read_text)
        os.kill(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the cleanup hook never started"
            time.sleep(0.02)
        cleanup = int(pid_file.read_text())
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        _kill_leftovers(proc, run_id)
        for pid in (
            pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="sandbox_cleanup") if run_id else []
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, err.read_text()
    assert took < 30, f"took {took:.1f}s to stop"
    assert "Traceback" not in err.read_text()
    assert pids_with_env(FABRO_RUN_ID=run_id, FABRO_EVENT="sandbox_cleanup") == []
    assert not Path(f"/proc/{cleanup}").exists() or cleanup not in pids_with_env(
        FABRO_RUN_ID=run_id
    )
    events = run_events(run_id, repo)
    assert any(
        "asked again" in n["properties"]["message"] and "slow-cleanup" in n["properties"]["message"]
        for n in notices(events, "hooks_stopped")
    ), notices(events, "hooks_stopped")
    (hermetic_env / "quick").write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert branch_has(repo, run_id, "deployed.txt")


def test_an_http_hook_follows_no_redirect_with_its_headers(
    repo: Path, webhook: type[_Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redirect is the answer, not a new address: followed, the hook's headers (the
    token in them) would go where the trusted configuration never said."""
    monkeypatch.setenv("HOOK_TOKEN", "tok-12345")
    elsewhere: list[str] = []

    class Redirecting(webhook):  # type: ignore[misc,valid-type]
        def do_POST(self) -> None:
            if self.path != "/hook":
                elsewhere.append(self.headers.get("Authorization", ""))
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{webhook.port}/elsewhere")  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    Redirecting.port = server.server_address[1]  # type: ignore[attr-defined]
    webhook.port = Redirecting.port  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{Redirecting.port}/hook"  # type: ignore[attr-defined]
        configure(
            repo,
            http_hook(
                "stage_start",
                url,
                tls="off",
                matcher="^build$",
                allowed_env_vars=["HOOK_TOKEN"],
                headers={"Authorization": "Bearer $HOOK_TOKEN"},
            ),
        )
        proc, result = run_json("run", "run.toml", cwd=repo)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr
    assert elsewhere == []
    [notice] = notices(run_events(result["run_id"], repo), "hook_failed")
    assert "answered 302" in notice["properties"]["message"]
