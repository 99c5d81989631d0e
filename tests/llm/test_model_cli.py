"""`git fabro model list|test` end to end: the installed command, the real SDKs, and the
local server standing in for each provider through the `*_BASE_URL` variables."""

from __future__ import annotations

import json
import re

from helpers import run_fabro
from llm_server import Fault, LlmServer, Reply, provider_env, server_error, unauthorized


def test_model_list_prints_the_catalogue() -> None:
    proc = run_fabro("model", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["MODEL", "PROVIDER", "ALIASES"]
    sonnet = next(line for line in lines if line.startswith("claude-sonnet-4-6 "))
    assert re.search(r"anthropic\s+sonnet, claude-sonnet\s+200K\s+\$3\.00\s+\$15\.00$", sonnet)
    assert any(line.startswith("gemini-3.1-pro-preview ") for line in lines)
    assert any(line.startswith("glm-4.7 ") and "203K" in line for line in lines)
    spark = next(line for line in lines if line.startswith("gpt-5.3-codex-spark "))
    assert spark.split()[-2:] == ["n/a", "n/a"]


def test_model_list_for_one_provider_and_as_json() -> None:
    proc = run_fabro("model", "list", "--provider", "anthropic")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()[1:]
    assert rows and all(row.split()[1] == "anthropic" for row in rows)
    assert any(row.startswith("claude-opus-4-7 ") for row in rows)

    proc = run_fabro("model", "list", "--provider", "openai", "--json")
    assert proc.returncode == 0, proc.stderr
    models = json.loads(proc.stdout)
    assert {model["provider"] for model in models} == {"openai"}
    gpt54 = next(model for model in models if model["id"] == "gpt-5.4")
    assert gpt54 == {
        "id": "gpt-5.4",
        "provider": "openai",
        "aliases": ["gpt54"],
        "context_window": 1_000_000,
        "input_price": 2.5,
        "output_price": 15.0,
    }


def test_model_list_unknown_provider_suggests() -> None:
    proc = run_fabro("model", "list", "--provider", "antropic")
    assert proc.returncode == 1
    assert "unknown provider 'antropic'" in proc.stderr and "did you mean anthropic?" in proc.stderr
    assert "Traceback" not in proc.stderr


def _report(stdout: str) -> dict[str, str]:
    """provider/model -> the rest of its line."""
    rows = {}
    for line in stdout.splitlines():
        target, _, rest = line.partition("  ")
        rows[target.strip()] = rest.strip()
    return rows


def test_model_test_reaches_every_configured_provider(llm_server: LlmServer) -> None:
    env = provider_env(llm_server)
    del env["OLLAMA_BASE_URL"]
    proc = run_fabro("model", "test", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = _report(proc.stdout)
    assert set(report) == {
        "anthropic/claude-sonnet-4-6",
        "openai/gpt-5.4",
        "gemini/gemini-3-flash-preview",
        "kimi/kimi-k2.5",
    }
    for line in report.values():
        assert re.match(r"ok\s+\d+\.\d\ds\s+'ok' \(12 in, 5 out tokens\)$", line), line
    by_api = {(request.api, request.body["model"]) for request in llm_server.requests}
    assert by_api == {
        ("anthropic", "claude-sonnet-4-6"),
        ("responses", "gpt-5.4"),
        ("chat", "gemini-3-flash-preview"),
        ("chat", "kimi-k2.5"),
    }
    paths = sorted(request.path for request in llm_server.requests)
    assert paths == [
        "/kimi/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1beta/openai/chat/completions",
    ]


def test_model_test_one_provider_or_model(llm_server: LlmServer) -> None:
    env = provider_env(llm_server)
    proc = run_fabro("model", "test", "--provider", "openai", env=env)
    assert proc.returncode == 0, proc.stderr
    assert list(_report(proc.stdout)) == ["openai/gpt-5.4"]

    proc = run_fabro("model", "test", "--model", "sonnet", env=env)
    assert proc.returncode == 0, proc.stderr
    assert list(_report(proc.stdout)) == ["anthropic/claude-sonnet-4-6"]
    assert llm_server.requests[-1].body["model"] == "claude-sonnet-4-6"


def test_model_test_a_local_openai_compatible_server(llm_server: LlmServer) -> None:
    env = {"OLLAMA_BASE_URL": llm_server.url + "/ollama/v1"}
    llm_server.script(Reply(text="ok from llama"))
    proc = run_fabro("model", "test", "--provider", "ollama", "--model", "llama3.2", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'ok from llama'" in _report(proc.stdout)["ollama/llama3.2"]
    [request] = llm_server.requests
    assert request.path == "/ollama/v1/chat/completions" and request.body["model"] == "llama3.2"

    # Without a model, the configured local server is skipped with how to test it.
    proc = run_fabro("model", "test", env=env)
    assert proc.returncode == 1
    assert "ollama: skipped" in proc.stderr and "--provider ollama --model NAME" in proc.stderr


def test_model_test_reports_the_failing_provider_and_exits_1(llm_server: LlmServer) -> None:
    env = {
        key: value
        for key, value in provider_env(llm_server).items()
        if key.startswith(("ANTHROPIC", "OPENAI"))
    }
    # Both probes run at once; route the fault by protocol, not by arrival order.
    llm_server.script_for("anthropic", unauthorized())
    proc = run_fabro("model", "test", env=env)
    assert proc.returncode == 1
    report = _report(proc.stdout)
    assert report["openai/gpt-5.4"].startswith("ok")
    failed = report["anthropic/claude-sonnet-4-6"]
    assert failed.startswith("FAILED")
    assert "(HTTP 401): Incorrect API key provided" in failed and "ANTHROPIC_API_KEY" in failed
    assert "1 of 2 providers failed: anthropic" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_model_test_does_not_retry(llm_server: LlmServer) -> None:
    llm_server.script(server_error())
    proc = run_fabro("model", "test", "--provider", "gemini", env=provider_env(llm_server))
    assert proc.returncode == 1
    assert "(HTTP 500): The server had an internal error" in proc.stdout
    assert len(llm_server.requests) == 1


def test_model_test_shows_a_providers_error_body_escaped(llm_server: LlmServer) -> None:
    """The error body is the endpoint's words (a proxy's, a hosted server's): its escapes
    are shown, as `run` shows the same error, never sent to the terminal."""
    hostile = "bad thing \x1b]52;c;TExN\x07\x1b[31mRED\x1b[0m\u202eRTL\x9b2J\x08\rOVER"
    llm_server.script(Fault(400, "server", hostile))
    proc = run_fabro("model", "test", "--provider", "openai", env=provider_env(llm_server))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for char in ("\x1b", "\x07", "\u202e", "\x9b", "\x08"):
        assert char not in proc.stdout + proc.stderr, repr(char)
    failed = _report(proc.stdout)["openai/gpt-5.4"]
    assert failed.startswith("FAILED"), failed
    shown = "bad thing \\x1b]52;c;TExN\\x07\\x1b[31mRED\\x1b[0m\\u202eRTL\\x9b2J\\x08\\rOVER"
    assert f"(HTTP 400): {shown}" in failed


def test_model_test_with_nothing_configured() -> None:
    proc = run_fabro("model", "test")
    assert proc.returncode == 1
    assert "no model provider is configured" in proc.stderr
    assert "ANTHROPIC_API_KEY" in proc.stderr and "Using a real model" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_model_test_a_named_provider_without_its_key() -> None:
    proc = run_fabro("model", "test", "--provider", "openai")
    assert proc.returncode == 1
    assert "no API key for provider 'openai': set OPENAI_API_KEY" in proc.stdout
