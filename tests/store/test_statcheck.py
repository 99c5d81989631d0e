"""The in-process change check may only say "unchanged" when git would agree."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers import git

from fabro_git.store import statcheck


@pytest.fixture
def staged(repo: Path) -> tuple[Path, tuple[int, int] | None]:
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("a = 1\n")
    (repo / "run.sh").write_text("echo hi\n")
    time.sleep(0.01)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "files")
    time.sleep(0.01)
    # git refreshes racily-clean entries on the next status; do what the engine does.
    git(repo, "add", "-A")
    return repo, statcheck.index_stamp(repo)


def test_unchanged_tree_is_recognised(staged: tuple[Path, tuple[int, int] | None]) -> None:
    repo, stamp = staged
    assert stamp is not None
    assert statcheck.unchanged(repo, stamp)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: (r / "src" / "a.py").write_text("a = 2\n"),
        lambda r: (r / "src" / "new.py").write_text(""),
        lambda r: (r / "run.sh").unlink(),
        lambda r: os.chmod(r / "run.sh", 0o755),
        lambda r: (r / "src" / "deep").mkdir() or (r / "src" / "deep" / "x").write_text("x"),
        lambda r: os.symlink("run.sh", r / "link"),
    ],
    ids=["modified", "added", "deleted", "chmod", "nested-added", "symlink"],
)
def test_any_change_is_noticed(staged: tuple[Path, tuple[int, int] | None], change) -> None:  # type: ignore[no-untyped-def]
    repo, stamp = staged
    change(repo)
    assert not statcheck.unchanged(repo, stamp)
    assert git(repo, "status", "--porcelain") != ""


def test_same_size_rewrite_is_noticed(staged: tuple[Path, tuple[int, int] | None]) -> None:
    repo, stamp = staged
    (repo / "src" / "a.py").write_text("b = 1\n")  # same length
    assert not statcheck.unchanged(repo, stamp)


def test_a_rewritten_index_invalidates_the_stamp(
    staged: tuple[Path, tuple[int, int] | None],
) -> None:
    repo, stamp = staged
    time.sleep(0.01)
    (repo / "other").write_text("x")
    git(repo, "add", "other")
    assert not statcheck.unchanged(repo, stamp)
    assert not statcheck.unchanged(repo, None)


def test_linked_worktree_index_is_found(
    staged: tuple[Path, tuple[int, int] | None], tmp_path: Path
) -> None:
    repo, _ = staged
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "--detach", str(wt))
    git(wt, "add", "-A")
    path = statcheck.index_path(wt)
    assert path is not None and path.name == "index" and "worktrees" in str(path)
    time.sleep(0.01)
    git(wt, "add", "-A")
    assert statcheck.unchanged(wt, statcheck.index_stamp(wt))
