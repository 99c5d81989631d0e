"""`--model` alone over a run configuration that names a provider: the flag names the
model as a whole, so a lower layer's provider does not pair with a model it does not
serve; a model the catalogue does not know keeps the configured provider."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import git, run_fabro, run_json, write_workflow
from llm_server import LlmServer

PROMPT = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    ask [shape=tab, prompt="Ask"]
    start -> ask -> exit
}
"""


def _project(repo: Path, toml: str) -> None:
    (repo / ".fabro").mkdir(exist_ok=True)
    (repo / ".fabro" / "project.toml").write_text(toml)
    git(repo, "add", ".fabro")
    write_workflow(repo, PROMPT)


@pytest.mark.parametrize(
    ("config", "flag", "sent"),
    [
        ('name = "gpt-5.4"\nprovider = "openai"', "sonnet", ("anthropic", "claude-sonnet-4-6")),
        ('provider = "anthropic"', "openai/gpt-5.4", ("responses", "gpt-5.4")),
        ('name = "gpt-5.4"\nprovider = "openai"', "gpt54", ("responses", "gpt-5.4")),
        ('name = "llama3.2"\nprovider = "ollama"', "qwen3", ("chat", "qwen3")),
    ],
)
def test_the_model_flag_alone_brings_its_own_provider(
    repo: Path, llm_server: LlmServer, config: str, flag: str, sent: tuple[str, str]
) -> None:
    _project(repo, f"[run.model]\n{config}\n")
    proc, result = run_json("run", "wf.fabro", "--goal", "g", "--model", flag, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    [request] = llm_server.requests
    assert (request.api, request.body["model"]) == sent
    if sent[0] == "chat":
        assert request.path.startswith("/ollama/")


def test_model_and_provider_flags_that_disagree_are_still_refused(
    repo: Path, llm_server: LlmServer
) -> None:
    _project(repo, '[run.model]\nname = "gpt-5.4"\n')
    proc = run_fabro(
        "run", "wf.fabro", "--goal", "g", "--model", "sonnet", "--provider", "openai", cwd=repo
    )
    assert proc.returncode == 1
    assert "served by 'anthropic', not 'openai'" in proc.stderr
    assert llm_server.requests == []
