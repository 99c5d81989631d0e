"""The pieces of the repository guard, in process: what a config change is called,
and that the push refusal holds against the ways a user's config routes pushes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import bare_remote, git

from fabro_git.engine.repo_guard import push_environment
from fabro_git.store.repo_state import StateReader, config_changes


def test_config_changes_name_each_key() -> None:
    before = b"[core]\n\tbare = false\n[user]\n\temail = a@b\n"
    after = b'[core]\n\tbare = true\n\thooksPath = /x\n[alias]\n\tst = !touch p\n[remote "o"]\n\turl = u\n'
    assert config_changes(before, after) == [
        "core.bare changed",
        "user.email removed",
        "core.hooksPath added",
        "alias.st added",
        "remote.o.url added",
    ]
    assert config_changes(before, before) == []
    assert config_changes(before, b"[core\n") == [
        "the file was rewritten so that git cannot read it"
    ]


def test_a_state_sees_a_ref_rewritten_in_place(repo: Path) -> None:
    reader = StateReader(repo / ".git")
    git(repo, "branch", "topic")
    before = reader.take()
    git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    sha = git(repo, "rev-parse", "HEAD").strip()
    # Written over in place, not renamed into place as git does: the stat data differs.
    (repo / ".git" / "refs" / "heads" / "topic").write_text(sha + "\n")
    after = reader.take()
    assert before.refs["refs/heads/topic"] != after.refs["refs/heads/topic"] == sha
    git(repo, "pack-refs", "--all")
    assert reader.take().refs == after.refs


def _push(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "push", *args], cwd=repo, env={**os.environ, **env}, capture_output=True, text=True
    )


def test_pushes_are_refused_whatever_the_config_routes_them_through(
    repo: Path, tmp_path: Path
) -> None:
    remote = bare_remote(tmp_path, "remote.git")
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "remote", "add", "explicit", "https://example.invalid/never")
    git(repo, "config", "remote.explicit.pushurl", f"file://{remote}")
    git(repo, "config", f"url.{remote.parent}/.pushInsteadOf", "short:")
    git(repo, "remote", "add", "shortened", "short:remote.git")
    base = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "a.b", "GIT_CONFIG_VALUE_0": "c"}
    env = {**base, **push_environment(base, repo / ".git", allow_push=False)}
    assert env["GIT_CONFIG_KEY_1"].startswith("url.")  # after what the caller had
    for args in (
        ["origin", "main"],
        ["explicit", "main"],
        ["shortened", "main"],
        [str(remote), "main"],
    ):
        proc = _push(repo, env, *args)
        assert proc.returncode != 0 and "allow_push" in proc.stderr, (args, proc.stderr)
    assert git(remote, "for-each-ref") == ""
    assert push_environment({}, repo / ".git", allow_push=True) == {}
    assert _push(repo, {}, "origin", "main").returncode == 0


def test_a_watched_state_is_the_state_read_whole_after_every_kind_of_change(
    repo: Path,
) -> None:
    """On Linux a reader reads again only what its watch says changed: after each change
    below, what it takes is what a new reader, reading everything, takes; and with no
    change it takes nothing again."""
    git_dir = repo / ".git"
    reader = StateReader(git_dir)
    sha = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    later = git(repo, "rev-parse", "HEAD").strip()
    hooks = git_dir / "hooks"
    hooks.mkdir(exist_ok=True)
    changes = [
        lambda: git(repo, "branch", "topic", sha),
        lambda: git(repo, "update-ref", "refs/heads/topic", later),
        lambda: (git_dir / "refs" / "heads" / "topic").write_text(sha + "\n"),  # in place
        lambda: git(repo, "branch", "deep/er/still", sha),  # new directories
        lambda: git(repo, "tag", "v1", sha),
        lambda: git(repo, "pack-refs", "--all"),
        lambda: git(repo, "branch", "-D", "topic"),
        lambda: shutil.rmtree(git_dir / "refs" / "heads" / "deep", ignore_errors=True),
        lambda: (hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n"),
        lambda: (hooks / "pre-commit").write_text("#!/bin/sh\nexit 1\n"),
        lambda: (hooks / "nested").mkdir(),
        lambda: (hooks / "nested" / "x").write_text("x"),
        lambda: (git_dir / "info" / "exclude").write_text("*.tmp\n"),
        lambda: git(repo, "config", "alias.st", "status"),
        lambda: (git_dir / "config.worktree").write_text("[core]\n\tx = 1\n"),
        lambda: os.symlink(
            git_dir / "refs" / "tags" / "v2-target", git_dir / "refs" / "tags" / "v2"
        ),
        lambda: (git_dir / "refs" / "tags" / "v2-target").write_text(later + "\n"),
        lambda: (git_dir / "packed-refs").write_text(f"{sha} refs/heads/packed-only\n"),
    ]
    first = reader.take()
    assert reader.take() is first or sys.platform != "linux"  # nothing changed: nothing read
    for number, change in enumerate(changes):
        change()
        assert reader.take() == StateReader(git_dir).take(), f"after change {number}"
    reader.close()


def test_a_watched_state_sees_hooks_through_a_symlinked_hooks_directory(
    repo: Path, tmp_path: Path
) -> None:
    """`.git/hooks` may be a link to a directory the project keeps its hooks in: a hook
    changed there is a change to the repository's hooks."""
    shared = tmp_path / "shared-hooks"
    shared.mkdir()
    (shared / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    hooks = repo / ".git" / "hooks"
    shutil.rmtree(hooks, ignore_errors=True)
    hooks.symlink_to(shared, target_is_directory=True)
    reader = StateReader(repo / ".git")
    before = reader.take()
    (shared / "pre-commit").write_text("#!/bin/sh\nexit 1\n")
    (shared / "post-checkout").write_text("#!/bin/sh\n")
    after = reader.take()
    assert after == StateReader(repo / ".git").take()
    assert after.hooks != before.hooks
    reader.close()
