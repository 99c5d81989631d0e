"""Run worktrees: creation, staging into trees, checkout, removal, diffs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import git

from fabro_git.errors import RefRaceError, StoreError
from fabro_git.store.repo import GitRepo
from fabro_git.store.worktree import (
    _admin_dir_of,
    add_worktree,
    checkout,
    diff_text,
    files_changed,
    remove_worktree,
    snapshot_tree,
)

RUN = "01WORKTREE"
BRANCH = f"fabro/run/{RUN}"
REF = f"refs/heads/{BRANCH}"


@pytest.fixture
def run_wt(grepo: GitRepo, repo: Path, tmp_path: Path) -> Path:
    base = grepo.require_base().sha
    assert base is not None
    grepo.update_ref(REF, base, old=None, message="fabro: start")
    path = tmp_path / "scratch" / RUN / "worktree"
    add_worktree(grepo, path, branch=BRANCH, commit=base)
    return path


def tree_paths(repo: Path, tree: str) -> set[str]:
    return set(git(repo, "ls-tree", "-r", "--name-only", "-z", tree).split("\0")) - {""}


def commit_stage(grepo: GitRepo, path: Path, **kwargs: object) -> str:
    tip = grepo.read_ref(REF)
    assert tip is not None
    tree = snapshot_tree(path, **kwargs)  # type: ignore[arg-type]
    sha = grepo.write_commit(tree=tree, parents=[tip], message="stage")
    grepo.update_ref(REF, sha, old=tip, message="fabro: checkpoint")
    return sha


def test_add_worktree_attached(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    assert (run_wt / "README.md").read_text() == "hello\n"
    assert git(run_wt, "symbolic-ref", "HEAD").strip() == REF
    listing = git(repo, "worktree", "list", "--porcelain")
    assert f"worktree {run_wt}" in listing
    # The user's checkout is untouched.
    assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert git(repo, "status", "--porcelain") == ""


def test_add_worktree_detached(grepo: GitRepo, repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    path = tmp_path / "p" / "q" / "detached"
    add_worktree(grepo, path, branch=None, commit=base)
    assert git(path, "rev-parse", "HEAD").strip() == base
    assert git(path, "symbolic-ref", "-q", "HEAD", check=False) == ""


def test_add_worktree_branch_must_match_commit(grepo: GitRepo, repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD").strip()
    with pytest.raises(StoreError, match="does not exist"):
        add_worktree(grepo, tmp_path / "w", branch="fabro/run/NOPE", commit=base)
    other = grepo.write_commit(
        tree=git(repo, "rev-parse", "HEAD^{tree}").strip(), parents=[base], message="o"
    )
    grepo.update_ref(REF, other, old=None, message="x")
    with pytest.raises(RefRaceError):
        add_worktree(grepo, tmp_path / "w", branch=BRANCH, commit=base)
    assert not (tmp_path / "w").exists()


def test_snapshot_stages_everything_but_ignored_and_excluded(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    (run_wt / ".gitignore").write_text("build/\n*.tmp\n")
    (run_wt / "src").mkdir()
    (run_wt / "src" / "main.py").write_text("print(1)\n")
    (run_wt / "build").mkdir()
    (run_wt / "build" / "out.bin").write_text("binary")
    (run_wt / "scratch.tmp").write_text("x")
    (run_wt / "node_modules" / "dep").mkdir(parents=True)
    (run_wt / "node_modules" / "dep" / "index.js").write_text("js")
    (run_wt / "pkg" / "node_modules").mkdir(parents=True)
    (run_wt / "pkg" / "node_modules" / "x.js").write_text("js")
    (run_wt / "pkg" / "keep.js").write_text("keep")
    (run_wt / "README.md").unlink()
    tree = snapshot_tree(run_wt, exclude_globs=["**/node_modules/**"])
    assert tree_paths(repo, tree) == {".gitignore", "src/main.py", "pkg/keep.js"}
    # Nothing of the user's repository changed: no config, no info/exclude.
    assert "untrackedcache" not in (repo / ".git" / "config").read_text().lower()
    exclude = repo / ".git" / "info" / "exclude"
    assert not exclude.exists() or "node_modules" not in exclude.read_text()
    assert git(repo, "status", "--porcelain") == ""


def test_snapshot_with_changed_paths_stages_only_those(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    (run_wt / "a.txt").write_text("a\n")
    (run_wt / "b.txt").write_text("b\n")
    (run_wt / "weird [name]*.txt").write_text("w\n")
    tree = snapshot_tree(run_wt, changed_paths=["a.txt", "weird [name]*.txt"])
    # b.txt was not named, so it is not staged: the caller's list is trusted.
    assert tree_paths(repo, tree) == {"README.md", "a.txt", "weird [name]*.txt"}
    (run_wt / "a.txt").unlink()
    tree = snapshot_tree(run_wt, changed_paths=["a.txt"])
    assert tree_paths(repo, tree) == {"README.md", "weird [name]*.txt"}
    assert snapshot_tree(run_wt, changed_paths=[]) == tree


def test_changed_paths_fall_back_to_a_full_scan_when_git_refuses(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    (run_wt / ".gitignore").write_text("*.log\n")
    (run_wt / "c.txt").write_text("c\n")
    (run_wt / "debug.log").write_text("log")
    # "never-existed" matches nothing and debug.log is ignored: git refuses the list,
    # and the full scan still gives the right tree.
    tree = snapshot_tree(run_wt, changed_paths=["c.txt", "debug.log", "never-existed"])
    assert tree_paths(repo, tree) == {".gitignore", "README.md", "c.txt"}


def test_changed_paths_respect_exclude_globs(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    (run_wt / ".cache").mkdir()
    (run_wt / ".cache" / "x").write_text("x")
    (run_wt / "y.txt").write_text("y")
    tree = snapshot_tree(
        run_wt, exclude_globs=["**/.cache/**"], changed_paths=[".cache/x", "y.txt"]
    )
    assert tree_paths(repo, tree) == {"README.md", "y.txt"}


def test_snapshot_applies_clean_filters(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    (run_wt / ".gitattributes").write_text("*.txt text eol=lf\n")
    (run_wt / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    tree = snapshot_tree(run_wt)
    blob = git(repo, "rev-parse", f"{tree}:crlf.txt").strip()
    assert git(repo, "cat-file", "blob", blob) == "one\ntwo\n"


def test_commit_cycle_and_checkout(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    base = grepo.read_ref(REF)
    assert base is not None
    (run_wt / "plan.md").write_text("the plan\n")
    first = commit_stage(grepo, run_wt)
    (run_wt / "plan.md").write_text("the better plan\n")
    (run_wt / "code.py").write_text("x = 1\n")
    second = commit_stage(grepo, run_wt)
    assert git(run_wt, "status", "--porcelain") == ""
    assert git(repo, "log", "--format=%s", BRANCH).splitlines() == ["stage", "stage", "initial"]
    assert files_changed(run_wt, first, second) == ["code.py", "plan.md"]
    assert files_changed(repo, base, second) == ["code.py", "plan.md"]

    # Local edits are discarded; the branch is moved by CAS and stays attached.
    (run_wt / "plan.md").write_text("half-written\n")
    (run_wt / "untracked.txt").write_text("stays")
    checkout(run_wt, first)
    assert (run_wt / "plan.md").read_text() == "the plan\n"
    assert not (run_wt / "code.py").exists()
    assert (run_wt / "untracked.txt").read_text() == "stays"
    assert git(run_wt, "symbolic-ref", "HEAD").strip() == REF
    assert grepo.read_ref(REF) == first
    assert "fabro: checkout" in git(repo, "reflog", "show", "--format=%gs", REF)

    # Detached worktrees move only their own HEAD.
    detached = run_wt.parent / "detached"
    add_worktree(grepo, detached, branch=None, commit=second)
    checkout(detached, first)
    assert git(detached, "rev-parse", "HEAD").strip() == first
    assert git(detached, "status", "--porcelain") == ""
    assert grepo.read_ref(REF) == first


def test_remove_worktree(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    (run_wt / "dirty.txt").write_text("uncommitted")
    remove_worktree(grepo, run_wt)
    assert not run_wt.exists()
    assert str(run_wt) not in git(repo, "worktree", "list", "--porcelain")
    assert grepo.read_ref(REF) is not None  # the branch survives its worktree
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert list((repo / ".git" / "worktrees").iterdir()) == []  # registration gone too


def test_remove_worktree_leaves_a_worktree_it_cannot_vouch_for_to_git(
    grepo: GitRepo, repo: Path, run_wt: Path, tmp_path: Path
) -> None:
    # A registration whose `gitdir` names another place is not removed in process:
    # git decides, and here refuses, with its own message; nothing is deleted.
    (admin,) = (repo / ".git" / "worktrees").iterdir()
    (admin / "gitdir").write_text(str(tmp_path / "elsewhere" / ".git") + "\n")
    assert _admin_dir_of(grepo, run_wt) is None
    with pytest.raises(StoreError, match="is not a working tree"):
        remove_worktree(grepo, run_wt)
    assert (run_wt / "README.md").exists() and admin.is_dir()
    # And a main worktree is never taken for a linked one.
    assert _admin_dir_of(grepo, repo) is None


def test_worktree_deleted_behind_gits_back_then_readded(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    (run_wt / "work.txt").write_text("w")
    sha = commit_stage(grepo, run_wt)
    shutil.rmtree(run_wt)
    assert f"worktree {run_wt}" in git(repo, "worktree", "list", "--porcelain")
    add_worktree(grepo, run_wt, branch=BRANCH, commit=sha)
    assert (run_wt / "work.txt").read_text() == "w"
    # Also at a different path (scratch dir moved), while the old one is stale.
    shutil.rmtree(run_wt)
    elsewhere = run_wt.parent.parent / "moved" / "worktree"
    add_worktree(grepo, elsewhere, branch=BRANCH, commit=sha)
    assert (elsewhere / "work.txt").read_text() == "w"
    # Removing a worktree that is already gone just forgets it.
    shutil.rmtree(elsewhere)
    remove_worktree(grepo, elsewhere)
    assert "moved" not in git(repo, "worktree", "list", "--porcelain")


def test_add_worktree_refuses_a_live_checkout_of_the_branch(
    grepo: GitRepo, run_wt: Path, tmp_path: Path
) -> None:
    tip = grepo.read_ref(REF)
    assert tip is not None
    with pytest.raises(StoreError, match="worktree"):
        add_worktree(grepo, tmp_path / "second", branch=BRANCH, commit=tip)


def test_git_location_variables_from_hooks_are_ignored(
    grepo: GitRepo, repo: Path, run_wt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inside a git hook these point at the user's repository and index.
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(repo / ".git" / "index"))
    monkeypatch.setenv("GIT_WORK_TREE", str(repo))
    (run_wt / "from-agent.txt").write_text("a")
    tree = snapshot_tree(run_wt)
    assert "from-agent.txt" in tree_paths(repo, tree)
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_INDEX_FILE")
    monkeypatch.delenv("GIT_WORK_TREE")
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "ls-files") == "README.md\n"


def test_diff_text_and_truncation(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    base = grepo.read_ref(REF)
    assert base is not None
    (run_wt / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    (run_wt / "README.md").write_text("hello\nworld\n")
    sha = commit_stage(grepo, run_wt)
    full = diff_text(run_wt, base, sha)
    assert "+world" in full and "+line 4999" in full and "truncated" not in full
    cut = diff_text(repo, base, sha, max_bytes=300)
    body, marker = cut.rsplit("\n[", 1)
    assert len(body.encode()) <= 300
    assert full.startswith(body)
    assert "truncated" in marker and f"git diff {base[:12]} {sha[:12]}" in marker
    with pytest.raises(StoreError):
        diff_text(repo, base, "0" * 40)


def test_fsck_clean_after_worktree_cycle(grepo: GitRepo, repo: Path, run_wt: Path) -> None:
    for i in range(3):
        (run_wt / f"f{i}.txt").write_text(str(i))
        commit_stage(grepo, run_wt)
    remove_worktree(grepo, run_wt)
    proc = subprocess.run(["git", "fsck", "--strict"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_add_worktree_on_a_live_worktree_resets_it(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    (run_wt / "kept.txt").write_text("k")
    sha = commit_stage(grepo, run_wt)
    (run_wt / "kept.txt").write_text("half-done edit")
    add_worktree(grepo, run_wt, branch=BRANCH, commit=sha)  # as on resume
    assert (run_wt / "kept.txt").read_text() == "k"
    assert git(run_wt, "status", "--porcelain") == ""
    # A live worktree in another state is not taken over.
    with pytest.raises(StoreError, match="already a worktree"):
        add_worktree(grepo, run_wt, branch=None, commit=sha)
    assert git(run_wt, "symbolic-ref", "HEAD").strip() == REF


def test_checkout_clears_an_index_lock_left_by_a_killed_git(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    import os

    base = grepo.read_ref(REF)
    assert base is not None
    (run_wt / "x.txt").write_text("x")
    commit_stage(grepo, run_wt)
    lock = Path(
        git(run_wt, "rev-parse", "--path-format=absolute", "--git-path", "index.lock").strip()
    )
    lock.write_text("")
    # A fresh lock may belong to a live git process: left alone, and git refuses.
    with pytest.raises(StoreError, match=r"index\.lock"):
        checkout(run_wt, base)
    assert lock.exists()
    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))
    checkout(run_wt, base)
    assert not lock.exists()
    assert not (run_wt / "x.txt").exists()


def test_a_run_worktrees_index_carries_no_untracked_cache(
    grepo: GitRepo, repo: Path, run_wt: Path
) -> None:
    """Not when the worktree is made, nor after git stages it, even where the user's
    config asks for the cache: git's could miss a new directory, and a `git status` in
    the worktree would then leave its files out."""
    from fabro_git.store.statcheck import index_path, read_index

    def extensions() -> tuple[bytes, ...]:
        index = index_path(run_wt)
        assert index is not None
        stat = index.stat()
        state = read_index(index, (stat.st_mtime_ns, stat.st_size))
        assert state is not None
        return state.extensions

    git(repo, "config", "core.untrackedCache", "true")
    assert b"UNTR" not in extensions()
    (run_wt / "new").mkdir()
    (run_wt / "new" / "a.txt").write_text("a\n")
    commit_stage(grepo, run_wt)
    assert b"UNTR" not in extensions()
    # The same worktree with the setting git fabro overrides: git adds the cache, and
    # git fabro's next write of the index (a checkout, say a rewind's) drops it.
    git(run_wt, "-c", "core.untrackedCache=true", "add", "-A")
    assert b"UNTR" in extensions()
    checkout(run_wt, git(run_wt, "rev-parse", "HEAD").strip())
    assert b"UNTR" not in extensions()
