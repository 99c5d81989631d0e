"""The local wire-format server, one per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llm_server import LlmServer


@pytest.fixture
def llm_server() -> Iterator[LlmServer]:
    server = LlmServer().start()
    try:
        yield server
    finally:
        server.stop()
