"""Hermetic test environment shared by every test.

Each test gets its own HOME, XDG dirs, FABRO_HOME and git identity, so nothing leaks in
from the machine's own configuration, and a fresh repository fixture made by real `git`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import git
from llm_server import LlmServer, provider_env

from fabro_git.llm.catalogue import PROVIDERS

# Provider keys and endpoints: a test sets the ones it means, never inherits a real key.
PROVIDER_VARS = frozenset(
    {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"}
    | {var for info in PROVIDERS.values() for var in (*info.key_env, info.base_url_env)}
)


# The longest single tests, started first: the workers share the rest out as they free
# up, so none is left running one of these alone at the end (mypy's cold start alone
# takes a minute of a loaded machine, and its file would otherwise come near the end).
LONGEST_FIRST = (
    "tests/test_batch_ray.py::",  # one worker's two minutes: the Ray cluster's group
    "tests/test_code_quality.py::test_tree_is_clean[mypy]",
    "tests/test_code_quality.py::",
    "tests/cli/test_workflows_by_name.py::test_exec_",
    "tests/engine/test_hostile_services.py::test_an_mcp_server_offering_thousands",
    "tests/engine/test_agent_event_coverage.py::",
)


# Tests that share one costly module fixture and so must run on one worker: the Ray
# cluster's (three workers would start three clusters). xdist's own `xdist_group` mark
# does this by renaming each test's node id, which pytest 9.2 no longer lets it do, so
# the grouping is declared here, by node id prefix, and done by the scheduler below.
ONE_WORKER = ("tests/test_batch_ray.py::",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        """Each test is its own unit of work, but those of a `ONE_WORKER` prefix are one."""

        def _split_scope(self, nodeid: str) -> str:
            return next((group for group in ONE_WORKER if nodeid.startswith(group)), nodeid)

    return Grouped(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        found = [n for n, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)]
        return found[0] if found else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    return _hermetic(tmp_path_factory.mktemp("home"), monkeypatch)


def _hermetic(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in list(os.environ):
        if var.startswith(("GIT_", "FABRO_")) or var in PROVIDER_VARS or var.endswith("_BASE_URL"):
            monkeypatch.delenv(var, raising=False)
    # The `git-fabro` under test is the one installed beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("FABRO_HOME", str(home / "fabro"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Test Author")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "author@example.com")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Test Committer")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "committer@example.com")
    monkeypatch.setenv("GIT_EDITOR", "false")
    # Pinned commit dates: the same commit is the same object in every run of a test.
    for kind in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{kind}_DATE", "2026-01-01T00:00:00+00:00")
    # The terminal too: what the shell running pytest has (TERM=dumb, a narrow window,
    # another locale) must not change what a test sees.
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("LANG", "C.UTF-8")
    for var in ("LINES", "LANGUAGE", "FORCE_COLOR", "CLICOLOR_FORCE"):
        monkeypatch.delenv(var, raising=False)
    # No `git maintenance run --auto` after each of the suite's commits: a process each
    # (about a thousand in all), for repositories that live a few seconds.
    (home / ".gitconfig").write_text(
        "[init]\n\tdefaultBranch = main\n[user]\n\tname = Test User\n\temail = test@example.com\n"
        "[maintenance]\n\tauto = false\n"
    )
    return home


# The repository every `repo` starts as, made once per worker for each identity and
# date the environment pins (the same commit object a fresh `git init` would give):
# copying it costs a third of making it again.
_IDENTITY_VARS = tuple(
    f"GIT_{who}_{what}" for who in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL", "DATE")
)
_repo_templates: dict[tuple[str | None, ...], Path] = {}


def _repo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tuple(os.environ.get(var) for var in _IDENTITY_VARS)
    if key not in _repo_templates:
        path = tmp_path_factory.mktemp("repo-template") / "repo"
        path.mkdir()
        git(path, "init", "-q", "-b", "main")
        (path / "README.md").write_text("hello\n")
        git(path, "add", "README.md")
        git(path, "commit", "-q", "-m", "initial")
        _repo_templates[key] = path
    return _repo_templates[key]


@pytest.fixture
def repo(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh repository with one commit on `main`."""
    path = tmp_path / "repo"
    shutil.copytree(_repo_template(tmp_path_factory), path, symlinks=True)
    # The copies have new inodes and ctimes: the index learns them now, as a fresh
    # repository's index would hold them.
    git(path, "update-index", "-q", "--refresh")
    yield path


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The hermetic environment of a module's shared fixtures, for the module's life.

    A module-scoped fixture is made before any test's own `hermetic_env`: this one gives
    it the same kind of environment (its own HOME and FABRO_HOME), which each test's
    `hermetic_env` then replaces while it runs."""
    with pytest.MonkeyPatch.context() as patch:
        yield _hermetic(tmp_path_factory.mktemp("module-home"), patch)


@pytest.fixture(scope="module")
def module_repo(module_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh repository for a module's fixtures to make runs in once, for its tests
    to read, or to copy (`helpers.copy_repo`) where they change it."""
    path = tmp_path_factory.mktemp("module-repo") / "repo"
    shutil.copytree(_repo_template(tmp_path_factory), path, symlinks=True)
    git(path, "update-index", "-q", "--refresh")
    return path


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LlmServer]:
    """The local wire-format LLM server, with every provider's base URL and a key
    pointed at it in the environment the tests' `git fabro` runs inherit."""
    server = LlmServer().start()
    for var, value in provider_env(server).items():
        monkeypatch.setenv(var, value)
    try:
        yield server
    finally:
        server.stop()
