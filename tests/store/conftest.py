"""What the store's tests share: a `GitRepo` opened on the `repo` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fabro_git.store.repo import GitRepo


@pytest.fixture
def grepo(repo: Path) -> Iterator[GitRepo]:
    """`repo` opened as the store opens a repository, closed after the test."""
    r = GitRepo.discover(repo)
    yield r
    r.close()
