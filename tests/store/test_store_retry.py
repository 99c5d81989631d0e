"""Ref moves and git calls wait out the user's own git, and only that.

The waits run on a fake clock (`store.backoff.Clock`) whose sleep moves its time at
once: a lock is released when the backoff has waited a given time, and a lock that
stays is reported at the deadline, all without real waiting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import git

from fabro_git.errors import RefRaceError, RepositoryError
from fabro_git.store.backoff import DEADLINE_SECONDS, is_transient_git_failure
from fabro_git.store.repo import GitRepo
from fabro_git.store.worktree import add_worktree, snapshot_tree


class FakeClock:
    """A backoff clock whose `sleep` moves its time at once, running what is due then."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self._due: list[tuple[float, Callable[[], None]]] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        for entry in [d for d in self._due if d[0] <= self.now]:
            self._due.remove(entry)
            entry[1]()

    def release_after(self, lock: Path, seconds: float) -> None:
        """Delete `lock` once the backoff has waited `seconds` on this clock."""
        self._due.append((seconds, lock.unlink))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def grepo(repo: Path, clock: FakeClock) -> Iterator[GitRepo]:
    r = GitRepo.discover(repo, clock=clock)
    yield r
    r.close()


def _head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def _second_commit(repo: Path) -> str:
    tree = git(repo, "write-tree").strip()
    return git(repo, "commit-tree", tree, "-p", _head(repo), "-m", "second").strip()


def test_a_held_ref_lock_is_waited_for(grepo: GitRepo, repo: Path, clock: FakeClock) -> None:
    base, nxt = _head(repo), _second_commit(repo)
    grepo.update_ref("refs/fabro/meta/01R", base, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01R.lock"
    lock.write_text("")
    clock.release_after(lock, 0.3)
    grepo.update_ref("refs/fabro/meta/01R", nxt, old=base, message="fabro: next")
    assert git(repo, "rev-parse", "refs/fabro/meta/01R").strip() == nxt
    # Several pauses, growing, and no more once the lock was gone.
    assert len(clock.sleeps) >= 3 and clock.sleeps[-1] > clock.sleeps[0]
    assert 0.3 <= clock.now < 0.3 + 0.25 * 1.5


def test_a_held_packed_refs_lock_is_waited_for_on_delete(
    grepo: GitRepo, repo: Path, clock: FakeClock
) -> None:
    base = _head(repo)
    grepo.update_ref("refs/fabro/meta/01P", base, old=None, message="fabro: init")
    git(repo, "pack-refs", "--all")
    lock = repo / ".git" / "packed-refs.lock"
    lock.write_text("")
    clock.release_after(lock, 0.3)
    grepo.delete_ref("refs/fabro/meta/01P", old=base, message="fabro: drop")
    assert clock.now >= 0.3
    assert git(repo, "for-each-ref", "refs/fabro/meta").strip() == ""


def test_a_lost_compare_and_swap_is_never_retried_into_an_overwrite(
    grepo: GitRepo, repo: Path, clock: FakeClock
) -> None:
    base, nxt = _head(repo), _second_commit(repo)
    grepo.update_ref("refs/fabro/meta/01C", nxt, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01C.lock"
    lock.write_text("")
    clock.release_after(lock, 0.2)
    with pytest.raises(RefRaceError, match="moved underneath us"):
        grepo.update_ref("refs/fabro/meta/01C", base, old=base, message="fabro: stale")
    # Refused as soon as the lock was gone, not retried to the deadline.
    assert 0.2 <= clock.now < 0.2 + 0.25 * 1.5
    assert git(repo, "rev-parse", "refs/fabro/meta/01C").strip() == nxt


def test_a_lock_that_stays_is_reported_with_the_file_to_delete(
    grepo: GitRepo, repo: Path, clock: FakeClock
) -> None:
    base = _head(repo)
    grepo.update_ref("refs/fabro/meta/01S", base, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01S.lock"
    lock.write_text("")
    with pytest.raises(RefRaceError) as caught:
        grepo.update_ref("refs/fabro/meta/01S", _second_commit(repo), old=base, message="x")
    assert DEADLINE_SECONDS * 0.8 <= clock.now <= DEADLINE_SECONDS
    assert "stayed locked" in str(caught.value) and str(lock) in str(caught.value)
    assert f"for {DEADLINE_SECONDS:g}s" in str(caught.value)


def test_a_lock_waits_as_long_as_gits_own_ref_lock_timeout_says(
    repo: Path, clock: FakeClock
) -> None:
    git(repo, "config", "core.filesRefLockTimeout", "250")
    with GitRepo.discover(repo, clock=clock) as grepo:
        base = _head(repo)
        grepo.update_ref("refs/fabro/meta/01T", base, old=None, message="fabro: init")
        (repo / ".git" / "refs" / "fabro" / "meta" / "01T.lock").write_text("")
        with pytest.raises(RefRaceError) as caught:
            grepo.update_ref("refs/fabro/meta/01T", _second_commit(repo), old=base, message="x")
    assert 0 < clock.now <= 0.25  # tried again, but never past 250 ms
    assert "stayed locked by another process for 0.25s" in str(caught.value)


def test_git_add_waits_for_a_held_index_lock(repo: Path, tmp_path: Path, clock: FakeClock) -> None:
    with GitRepo.discover(repo) as grepo:
        worktree = tmp_path / "wt"
        add_worktree(grepo, worktree, branch=None, commit=_head(repo))
    (worktree / "new.txt").write_text("new\n")
    lock = Path(git(worktree, "rev-parse", "--git-path", "index.lock").strip())
    lock = lock if lock.is_absolute() else worktree / lock
    lock.write_text("")
    clock.release_after(lock, 0.3)
    tree = snapshot_tree(worktree, clock=clock)
    assert clock.now >= 0.3
    assert "new.txt" in git(repo, "ls-tree", "--name-only", tree)


@pytest.mark.parametrize("held", ["refs/heads/fabro", "refs/heads/fabro/run"])
@pytest.mark.parametrize("packed", [False, True])
def test_a_ref_in_the_way_is_named_at_once(
    grepo: GitRepo, repo: Path, clock: FakeClock, held: str, packed: bool
) -> None:
    git(repo, "update-ref", held, "HEAD")
    if packed:
        git(repo, "pack-refs", "--all")
    with pytest.raises(RepositoryError, match="in the way"):
        grepo.update_ref("refs/heads/fabro/run/01X", _head(repo), old=None, message="x")
    assert clock.sleeps == []  # not a lock to wait out
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
