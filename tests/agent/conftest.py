"""The agent under test: a real worktree, the local wire-format server, a real event bus.

Every event a session emits goes through `EventBus` into a list sink, stamped the way a
stage would stamp it; at teardown each one is checked against the events contract, so
no test can pass while emitting an event the seed does not allow.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from event_contract.check import check_event
from event_contract.seed import load_contract
from llm_server import LlmServer, Recorded, provider_env

from fabro_git.agent.session import AgentResult, AgentSession
from fabro_git.events.bus import EventBus, MemorySink
from fabro_git.events.envelope import Envelope, EventProps
from fabro_git.llm.client import NO_RETRIES
from fabro_git.llm.types import Target

TARGETS = {
    "anthropic": Target("anthropic", "claude-sonnet-4-6"),
    "openai": Target("openai", "gpt-5.4"),
    "gemini": Target("gemini", "gemini-3.1-pro-preview"),
}
SESSION_ID = "ses_test"
UNSCOPED = {"agent.session.started", "agent.session.ended"}


class Harness:
    def __init__(self, server: LlmServer, worktree: Path) -> None:
        self.server = server
        self.worktree = worktree
        self.sink = MemorySink()
        self.bus = EventBus("01JAGENTTEST", [self.sink])
        self.on_event: Any = None

    def emit(self, props: EventProps) -> None:
        if props.NAME in UNSCOPED:
            self.bus.emit(props, session_id=SESSION_ID)
        else:
            self.bus.emit(
                props, node_id="work", node_label="Work", stage_id="work@1", session_id=SESSION_ID
            )
        if self.on_event is not None:
            self.on_event(props)

    def session(self, provider: str = "anthropic", **options: Any) -> AgentSession:
        options.setdefault("env", {**provider_env(self.server), "FABRO_TEST_SETTING": "kept"})
        options.setdefault("retry_policy", NO_RETRIES)
        options.setdefault("skill_dirs", [])
        return AgentSession(
            self.worktree,
            target=TARGETS[provider],
            emit=self.emit,
            session_id=SESSION_ID,
            **options,
        )

    def run(self, prompt: str, provider: str = "anthropic", **options: Any) -> AgentResult:
        session = self.session(provider, **options)
        return trio.run(session.run, prompt)

    @property
    def names(self) -> list[str]:
        return self.sink.names

    def of(self, name: str) -> list[dict[str, Any]]:
        """The properties of every `name` event, as the log holds them."""
        return [
            json.loads(line)["properties"]
            for env, line in zip(self.sink.envelopes, self.sink.lines, strict=True)
            if env.event == name
        ]

    def envelopes(self, name: str) -> list[Envelope]:
        return self.sink.of(name)

    def requests(self, api: str) -> list[Recorded]:
        return [request for request in self.server.requests if request.api == api]

    def contract_problems(self) -> list[str]:
        catalogue = load_contract()
        problems: list[str] = []
        for line in self.sink.lines:
            problems += check_event(json.loads(line), catalogue)
        return problems


@pytest.fixture
def llm_server() -> Iterator[LlmServer]:
    server = LlmServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    path = tmp_path / "worktree"
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "a.txt").write_text("alpha\nbeta\ngamma\n")
    return path


@pytest.fixture
def agent(llm_server: LlmServer, worktree: Path) -> Iterator[Harness]:
    harness = Harness(llm_server, worktree)
    yield harness
    assert harness.contract_problems() == []
