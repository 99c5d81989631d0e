"""files_touched of a stage told from two snapshots of the worktree's dirty set."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import git

from fabro_git.store.touched import WorktreeSnapshot, take_snapshot, touched_paths


def _touched(repo: Path, before: WorktreeSnapshot) -> list[str]:
    return touched_paths(repo, before, take_snapshot(repo), limit=100)


def test_only_what_changed_between_the_snapshots_counts(repo: Path) -> None:
    (repo / "a.txt").write_text("a\n")
    (repo / "b.txt").write_text("b\n")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    # Dirty before the stage: left alone, it is not the stage's doing.
    (repo / "a.txt").write_text("a, edited earlier\n")
    (repo / "old-untracked.txt").write_text("x\n")
    (repo / "gone-before.txt").write_text("y\n")
    before = take_snapshot(repo)

    (repo / "b.txt").write_text("b, edited\n")  # clean -> dirty
    (repo / "new" / "deep").mkdir(parents=True)
    (repo / "new" / "deep" / "c.txt").write_text("c\n")  # untracked, in a new dir
    (repo / "debug.log").write_text("ignored\n")  # ignored: never counted
    (repo / "README.md").unlink()  # tracked file deleted
    (repo / "gone-before.txt").unlink()  # untracked file deleted
    assert _touched(repo, before) == ["README.md", "b.txt", "gone-before.txt", "new/deep/c.txt"]


def test_an_already_dirty_file_counts_when_its_content_changes(repo: Path) -> None:
    (repo / "README.md").write_text("dirty\n")
    before = take_snapshot(repo)
    (repo / "README.md").write_text("DIRTY\n")  # same size, new bytes
    assert _touched(repo, before) == ["README.md"]


def test_a_new_mtime_on_the_same_bytes_is_not_a_change(repo: Path) -> None:
    (repo / "README.md").write_text("dirty\n")
    st = os.stat(repo / "README.md")
    os.utime(repo / "README.md", ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))
    before = take_snapshot(repo)
    (repo / "README.md").write_text("dirty\n")
    assert _touched(repo, before) == []


def test_a_dirty_file_put_back_and_commits_of_the_stage_count(repo: Path) -> None:
    (repo / "README.md").write_text("dirty\n")
    before = take_snapshot(repo)
    git(repo, "checkout", "--", "README.md")  # reverted: dirty -> clean
    (repo / "committed.txt").write_text("c\n")
    git(repo, "add", "committed.txt")
    git(repo, "commit", "-q", "-m", "stage commit")  # clean before and after
    assert _touched(repo, before) == ["README.md", "committed.txt"]


def test_a_new_directory_is_found_whatever_the_untracked_cache_says(repo: Path) -> None:
    """git's untracked cache can say a directory is unchanged when it is not (a new
    directory made in a directory of tracked files soon after a scan was missed by git
    2.39, now and then). Here the cache is made to lie for certain: a filesystem monitor
    that reports no change lets git trust it outright. The snapshot reads the
    directories themselves."""
    (repo / "src").mkdir()
    (repo / "src" / "a.txt").write_text("a\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    monitor = repo.parent / "no-change-monitor"
    monitor.write_text("#!/bin/sh\nprintf 'token\\0'\n")
    monitor.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(monitor))
    git(repo, "config", "core.fsmonitorHookVersion", "2")
    git(repo, "update-index", "--untracked-cache")
    cached_status = ("-c", "core.untrackedCache=true", "-c", "status.showUntrackedFiles=all")
    before = take_snapshot(repo)
    # Scans that fill the cache, as a `git status` in the worktree does.
    for _ in range(2):
        git(repo, *cached_status, "status")
    (repo / "src" / "new").mkdir()
    (repo / "src" / "new" / "c.txt").write_text("c\n")
    cached = git(repo, *cached_status, "status", "--porcelain")
    assert "src/new/c.txt" not in cached  # the cache does lie
    assert _touched(repo, before) == ["src/new/c.txt"]
