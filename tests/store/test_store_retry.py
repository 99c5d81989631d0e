"""Ref moves and git calls wait out the user's own git, and only that."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import git

from fabro_git.errors import RefRaceError, RepositoryError
from fabro_git.store import worktree as wt
from fabro_git.store.backoff import DEADLINE_SECONDS, is_transient_git_failure
from fabro_git.store.repo import GitRepo


@pytest.fixture
def grepo(repo: Path) -> Iterator[GitRepo]:
    r = GitRepo.discover(repo)
    yield r
    r.close()


def _head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def _second_commit(repo: Path) -> str:
    tree = git(repo, "write-tree").strip()
    return git(repo, "commit-tree", tree, "-p", _head(repo), "-m", "second").strip()


def _release_later(lock: Path, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), lock.unlink()))
    thread.start()
    return thread


def test_a_held_ref_lock_is_waited_for(grepo: GitRepo, repo: Path) -> None:
    base, nxt = _head(repo), _second_commit(repo)
    grepo.update_ref("refs/fabro/meta/01R", base, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01R.lock"
    lock.write_text("")
    releaser = _release_later(lock, 0.3)
    grepo.update_ref("refs/fabro/meta/01R", nxt, old=base, message="fabro: next")
    releaser.join()
    assert git(repo, "rev-parse", "refs/fabro/meta/01R").strip() == nxt


def test_a_held_packed_refs_lock_is_waited_for_on_delete(grepo: GitRepo, repo: Path) -> None:
    base = _head(repo)
    grepo.update_ref("refs/fabro/meta/01P", base, old=None, message="fabro: init")
    git(repo, "pack-refs", "--all")
    lock = repo / ".git" / "packed-refs.lock"
    lock.write_text("")
    releaser = _release_later(lock, 0.3)
    grepo.delete_ref("refs/fabro/meta/01P", old=base, message="fabro: drop")
    releaser.join()
    assert git(repo, "for-each-ref", "refs/fabro/meta").strip() == ""


def test_a_lost_compare_and_swap_is_never_retried_into_an_overwrite(
    grepo: GitRepo, repo: Path
) -> None:
    base, nxt = _head(repo), _second_commit(repo)
    grepo.update_ref("refs/fabro/meta/01C", nxt, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01C.lock"
    lock.write_text("")
    releaser = _release_later(lock, 0.2)
    started = time.monotonic()
    with pytest.raises(RefRaceError, match="moved underneath us"):
        grepo.update_ref("refs/fabro/meta/01C", base, old=base, message="fabro: stale")
    releaser.join()
    assert time.monotonic() - started < DEADLINE_SECONDS
    assert git(repo, "rev-parse", "refs/fabro/meta/01C").strip() == nxt


def test_a_lock_that_stays_is_reported_with_the_file_to_delete(grepo: GitRepo, repo: Path) -> None:
    base = _head(repo)
    grepo.update_ref("refs/fabro/meta/01S", base, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01S.lock"
    lock.write_text("")
    started = time.monotonic()
    with pytest.raises(RefRaceError) as caught:
        grepo.update_ref("refs/fabro/meta/01S", _second_commit(repo), old=base, message="x")
    assert DEADLINE_SECONDS * 0.8 <= time.monotonic() - started < DEADLINE_SECONDS + 2
    assert "stayed locked" in str(caught.value) and str(lock) in str(caught.value)


def test_git_add_waits_for_a_held_index_lock(repo: Path, tmp_path: Path) -> None:
    with GitRepo.discover(repo) as grepo:
        worktree = tmp_path / "wt"
        wt.add_worktree(grepo, worktree, branch=None, commit=_head(repo))
    (worktree / "new.txt").write_text("new\n")
    lock = Path(git(worktree, "rev-parse", "--git-path", "index.lock").strip())
    lock = lock if lock.is_absolute() else worktree / lock
    lock.write_text("")
    releaser = _release_later(lock, 0.3)
    tree = wt.snapshot_tree(worktree)
    releaser.join()
    assert "new.txt" in git(repo, "ls-tree", "--name-only", tree)


@pytest.mark.parametrize("held", ["refs/heads/fabro", "refs/heads/fabro/run"])
@pytest.mark.parametrize("packed", [False, True])
def test_a_ref_in_the_way_is_named_at_once(
    grepo: GitRepo, repo: Path, held: str, packed: bool
) -> None:
    git(repo, "update-ref", held, "HEAD")
    if packed:
        git(repo, "pack-refs", "--all")
    started = time.monotonic()
    with pytest.raises(RepositoryError, match="in the way"):
        grepo.update_ref("refs/heads/fabro/run/01X", _head(repo), old=None, message="x")
    assert time.monotonic() - started < 1
    assert grepo.conflicting_ref("refs/heads/fabro/run/01X") == held


def test_transient_git_messages() -> None:
    assert is_transient_git_failure(
        "error: unable to create temporary file: No such file or directory"
    )
    assert is_transient_git_failure(
        "fatal: Unable to create '/r/.git/worktrees/w/index.lock': File exists."
    )
    assert is_transient_git_failure(
        "error: cannot lock ref 'refs/heads/x': Unable to create '/r/.git/refs/heads/x.lock': "
        "File exists."
    )
    assert not is_transient_git_failure(
        "error: cannot lock ref 'refs/heads/x': is at 1111 but expected 2222"
    )
    assert is_transient_git_failure(
        "fatal: could not open '.git/worktrees/worktree2/locked' for writing: "
        "No such file or directory"
    )
    assert not is_transient_git_failure("fatal: pathspec 'x' did not match any files")
    assert not is_transient_git_failure("error: invalid path 'a/.git/b'")
