"""GitRepo against real repositories: discovery, HEAD, CAS ref moves, reading objects."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import bare_remote, git

from fabro_git.errors import RefRaceError, RepositoryError, StoreError
from fabro_git.store.repo import GitRepo, parse_trailers
from fabro_git.store.worktree import add_worktree


def head_sha(path: Path) -> str:
    return git(path, "rev-parse", "HEAD").strip()


def empty_tree(path: Path) -> str:
    return git(path, "hash-object", "-t", "tree", "-w", "/dev/null").strip()


# -- discovery -----------------------------------------------------------------------


def test_discover_from_subdirectory(repo: Path) -> None:
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    with GitRepo.discover(sub) as r:
        assert r.root == repo.resolve()
        assert r.git_dir == (repo / ".git").resolve()
        assert r.head().branch == "main"
        assert r.head().sha == head_sha(repo)


def test_discover_outside_a_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(RepositoryError) as info:
        GitRepo.discover(plain)
    message = str(info.value)
    assert "is not inside a git repository" in message
    assert "git init" in message


def test_discover_bare_repository(tmp_path: Path) -> None:
    bare = bare_remote(tmp_path, "bare.git")
    with pytest.raises(RepositoryError) as info:
        GitRepo.discover(bare)
    assert "bare repository" in str(info.value)
    assert "working tree" in str(info.value)
    assert "git clone" in str(info.value)


def test_require_base_without_commits(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    git(tmp_path, "init", "-q", "-b", "main", str(empty))
    with GitRepo.discover(empty) as r:
        assert r.head().sha is None
        assert r.head().branch == "main"
        with pytest.raises(RepositoryError) as info:
            r.require_base()
    assert "no commits" in str(info.value)
    assert "first commit" in str(info.value)


def test_require_base_detached_head(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    with GitRepo.discover(repo) as r:
        assert r.head().branch is None
        with pytest.raises(RepositoryError) as info:
            r.require_base()
    assert "detached" in str(info.value)
    assert "check out a branch" in str(info.value)


def test_require_base_on_branch(grepo: GitRepo, repo: Path) -> None:
    base = grepo.require_base()
    assert base.sha == head_sha(repo)
    assert base.branch == "main"


def test_discover_inside_run_worktree_resolves_to_main_repo(repo: Path, tmp_path: Path) -> None:
    with GitRepo.discover(repo) as r:
        sha = r.require_base().sha
        assert sha is not None
        r.update_ref("refs/heads/fabro/run/01TESTRUN", sha, old=None, message="fabro: start")
        add_worktree(r, tmp_path / "elsewhere" / "wt", branch="fabro/run/01TESTRUN", commit=sha)
    inner = tmp_path / "elsewhere" / "wt"
    (inner / "deep").mkdir()
    with GitRepo.discover(inner / "deep") as r:
        assert r.root == repo.resolve()
        assert r.git_dir == (repo / ".git").resolve()
        assert r.head().branch == "main"


def test_discover_inside_detached_scratch_worktree_resolves_to_main_repo(
    repo: Path, hermetic_env: Path
) -> None:
    from fabro_git.config.locations import run_scratch_dir

    path = run_scratch_dir(repo / ".git", "01PARALLEL") / "worktree"
    with GitRepo.discover(repo) as r:
        add_worktree(r, path, branch=None, commit=head_sha(repo))
    with GitRepo.discover(path) as r:
        assert r.root == repo.resolve()


def test_discover_inside_users_own_linked_worktree_stays_there(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "feature"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(other))
    with GitRepo.discover(other) as r:
        assert r.root == other.resolve()
        assert r.git_dir == (repo / ".git").resolve()
        assert r.head().branch == "feature"


def test_uncommitted_changes_and_origin(grepo: GitRepo, repo: Path) -> None:
    assert grepo.uncommitted_changes() == []
    (repo / "README.md").write_text("changed\n")
    (repo / "new.txt").write_text("new\n")
    changes = grepo.uncommitted_changes()
    assert " M README.md" in changes
    assert "?? new.txt" in changes
    assert grepo.origin_url() is None
    git(repo, "remote", "add", "origin", "https://example.com/x.git")
    assert grepo.origin_url() == "https://example.com/x.git"
    assert grepo.origin_url("upstream") is None


# -- refs ----------------------------------------------------------------------------


def test_create_if_absent_then_refuse_second_create(grepo: GitRepo, repo: Path) -> None:
    sha = head_sha(repo)
    grepo.update_ref("refs/fabro/meta/01A", sha, old=None, message="fabro: init")
    assert grepo.read_ref("refs/fabro/meta/01A") == sha
    other = grepo.write_commit(tree=empty_tree(repo), parents=[], message="other")
    with pytest.raises(RefRaceError) as info:
        grepo.update_ref("refs/fabro/meta/01A", other, old=None, message="fabro: init again")
    assert "refs/fabro/meta/01A" in str(info.value)
    assert grepo.read_ref("refs/fabro/meta/01A") == sha


def test_cas_lost_race_never_overwrites(grepo: GitRepo, repo: Path) -> None:
    base = head_sha(repo)
    a = grepo.write_commit(tree=empty_tree(repo), parents=[base], message="a")
    b = grepo.write_commit(tree=empty_tree(repo), parents=[base], message="b")
    grepo.update_ref("refs/heads/fabro/run/01R", base, old=None, message="fabro: start")
    # Someone else moves the ref first (here: git itself).
    git(repo, "update-ref", "refs/heads/fabro/run/01R", a)
    with pytest.raises(RefRaceError) as info:
        grepo.update_ref("refs/heads/fabro/run/01R", b, old=base, message="fabro: checkpoint")
    assert "refs/heads/fabro/run/01R" in str(info.value)
    assert grepo.read_ref("refs/heads/fabro/run/01R") == a
    # With the right expectation it moves.
    grepo.update_ref("refs/heads/fabro/run/01R", b, old=a, message="fabro: checkpoint")
    assert git(repo, "rev-parse", "fabro/run/01R").strip() == b


def test_cas_on_missing_ref_with_old_is_a_race(grepo: GitRepo, repo: Path) -> None:
    with pytest.raises(RefRaceError):
        grepo.update_ref("refs/fabro/meta/nope", head_sha(repo), old=head_sha(repo), message="x")
    assert grepo.read_ref("refs/fabro/meta/nope") is None


def test_locked_ref_is_a_race(grepo: GitRepo, repo: Path) -> None:
    sha = head_sha(repo)
    grepo.update_ref("refs/fabro/meta/01L", sha, old=None, message="fabro: init")
    lock = repo / ".git" / "refs" / "fabro" / "meta" / "01L.lock"
    lock.write_text("")
    with pytest.raises(RefRaceError):
        grepo.update_ref("refs/fabro/meta/01L", sha, old=sha, message="x")
    lock.unlink()


def test_reflog_messages_are_visible_to_git(grepo: GitRepo, repo: Path) -> None:
    base = head_sha(repo)
    nxt = grepo.write_commit(tree=empty_tree(repo), parents=[base], message="next")
    grepo.update_ref("refs/fabro/meta/01G", base, old=None, message="fabro: init")
    grepo.update_ref("refs/fabro/meta/01G", nxt, old=base, message="fabro: checkpoint plan@1")
    log = git(repo, "reflog", "show", "--format=%H %gs", "refs/fabro/meta/01G").splitlines()
    assert log == [f"{nxt} fabro: checkpoint plan@1", f"{base} fabro: init"]
    ident = git(repo, "reflog", "show", "--format=%gn <%ge>", "refs/fabro/meta/01G").splitlines()
    assert ident[0] == "Test Committer <committer@example.com>"


def test_delete_ref_is_cas_and_drops_reflog(grepo: GitRepo, repo: Path) -> None:
    base = head_sha(repo)
    other = grepo.write_commit(tree=empty_tree(repo), parents=[], message="other")
    grepo.update_ref("refs/fabro/parallel/01P/fan/0", base, old=None, message="fabro: branch")
    with pytest.raises(RefRaceError):
        grepo.delete_ref("refs/fabro/parallel/01P/fan/0", old=other, message="fabro: drop")
    assert grepo.read_ref("refs/fabro/parallel/01P/fan/0") == base
    grepo.delete_ref("refs/fabro/parallel/01P/fan/0", old=base, message="fabro: drop")
    assert grepo.read_ref("refs/fabro/parallel/01P/fan/0") is None
    assert git(repo, "for-each-ref", "refs/fabro/") == ""
    assert not (repo / ".git" / "logs" / "refs" / "fabro" / "parallel" / "01P").exists()
    # The name is free again, also as a directory.
    grepo.update_ref("refs/fabro/parallel/01P/fan/0/x", base, old=None, message="fabro: again")


def test_list_refs_includes_packed(grepo: GitRepo, repo: Path) -> None:
    sha = head_sha(repo)
    grepo.update_ref("refs/fabro/meta/01B", sha, old=None, message="x")
    git(repo, "pack-refs", "--all")
    grepo.update_ref("refs/fabro/meta/01C", sha, old=None, message="x")
    grepo.update_ref("refs/fabro/parallel/01C/n/0", sha, old=None, message="x")
    assert grepo.list_refs("refs/fabro/meta/") == {
        "refs/fabro/meta/01B": sha,
        "refs/fabro/meta/01C": sha,
    }
    # A packed ref still moves by CAS.
    other = grepo.write_commit(tree=empty_tree(repo), parents=[sha], message="o")
    grepo.update_ref("refs/fabro/meta/01B", other, old=sha, message="y")
    assert git(repo, "rev-parse", "refs/fabro/meta/01B").strip() == other


def test_bad_ref_names_are_refused(grepo: GitRepo, repo: Path) -> None:
    for name in ("HEAD", "fabro/meta/x", "refs/fabro/meta/a..b", "refs/fabro/meta/x.lock"):
        with pytest.raises(StoreError, match="is not a valid full ref name"):
            grepo.update_ref(name, head_sha(repo), old=None, message="x")


# -- objects -------------------------------------------------------------------------


def test_write_commit_and_read_back(grepo: GitRepo, repo: Path) -> None:
    base = head_sha(repo)
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    message = (
        "fabro(01X): plan (succeeded)\n\nSome body text.\n\n"
        "Fabro-Run: 01X\nFabro-Completed: 2\nFabro-Checkpoint: abc123\n"
    )
    sha = grepo.write_commit(tree=tree, parents=[base], message=message, timestamp=1_700_000_000)
    info = grepo.commit_info(sha)
    assert info.tree == tree
    assert info.parents == (base,)
    assert info.subject == "fabro(01X): plan (succeeded)"
    assert info.trailers == {
        "Fabro-Run": "01X",
        "Fabro-Completed": "2",
        "Fabro-Checkpoint": "abc123",
    }
    assert info.author_time == info.commit_time == 1_700_000_000
    # git agrees on every field, and on who made it.
    shown = git(
        repo,
        "log",
        "-1",
        "--format=%an <%ae>|%cn <%ce>|%s|%(trailers:key=Fabro-Run,valueonly)",
        sha,
    )
    assert (
        shown.strip()
        == "Test Author <author@example.com>|Test Committer <committer@example.com>|fabro(01X): plan (succeeded)|01X"
    )
    # Same inputs, same commit: a replay is byte-for-byte.
    assert (
        grepo.write_commit(tree=tree, parents=[base], message=message, timestamp=1_700_000_000)
        == sha
    )
    subprocess.run(["git", "fsck", "--strict"], cwd=repo, check=True, capture_output=True)


def test_identity_from_config_and_fallback(
    repo: Path, hermetic_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(var)
    monkeypatch.delenv("EMAIL", raising=False)
    # Identity is read once per repository object (config reads cost more than commits),
    # so each configuration gets a fresh object.
    with GitRepo.discover(repo) as r:
        assert (r.author().name, r.author().email) == ("Test User", "test@example.com")
    git(repo, "config", "user.name", "Repo Person")
    with GitRepo.discover(repo) as r:
        assert r.committer().name == "Repo Person"
    (hermetic_env / ".gitconfig").write_text("")
    git(repo, "config", "--unset", "user.name")
    with GitRepo.discover(repo) as r:
        assert (r.author().name, r.author().email) == ("git fabro", "fabro@localhost")
        sha = r.write_commit(tree=empty_tree(repo), parents=[], message="x")
    assert (
        git(repo, "log", "-1", "--format=%an <%ae>", sha).strip() == "git fabro <fabro@localhost>"
    )


def test_git_dates_from_environment(
    grepo: GitRepo, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_AUTHOR_DATE", "@1600000000 +0200")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2021-01-02T03:04:05+00:00")
    sha = grepo.write_commit(tree=empty_tree(repo), parents=[], message="dated")
    assert git(repo, "log", "-1", "--format=%at %ai|%ct", sha).strip() == (
        "1600000000 2020-09-13 14:26:40 +0200|1609556645"
    )


def test_read_file_list_dir_and_log(grepo: GitRepo, repo: Path) -> None:
    (repo / "docs" / "deep").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text("A\n")
    (repo / "docs" / "deep" / "b.md").write_text("B\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "second")
    sha = head_sha(repo)
    assert grepo.read_file(sha, "docs/a.md") == b"A\n"
    assert grepo.read_file(sha, "docs/deep/b.md") == b"B\n"
    assert grepo.read_file(sha, "docs") is None
    assert grepo.read_file(sha, "docs/missing") is None
    assert grepo.read_file(sha, "README.md/x") is None
    assert grepo.list_dir(sha, "") == ["README.md", "docs"]
    assert grepo.list_dir(sha, "docs") == ["a.md", "deep"]
    assert grepo.list_dir(sha, "README.md") is None
    assert grepo.list_dir(sha, "nope") is None
    # refs work where a commit is expected
    assert grepo.read_file("refs/heads/main", "docs/a.md") == b"A\n"
    assert [c.subject for c in grepo.iter_log(sha)] == ["second", "initial"]
    first = git(repo, "rev-parse", "HEAD~1").strip()
    assert grepo.is_ancestor(first, sha)
    assert not grepo.is_ancestor(sha, first)
    assert grepo.is_ancestor(sha, sha)
    with pytest.raises(StoreError):
        grepo.commit_info("0" * 40)


def test_iter_log_follows_first_parent(grepo: GitRepo, repo: Path) -> None:
    base = head_sha(repo)
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    side = grepo.write_commit(tree=tree, parents=[base], message="side")
    main2 = grepo.write_commit(tree=tree, parents=[base], message="main2")
    merge = grepo.write_commit(tree=tree, parents=[main2, side], message="merge")
    assert [c.subject for c in grepo.iter_log(merge)] == ["merge", "main2", "initial"]
    assert grepo.is_ancestor(side, merge)
    assert not grepo.is_ancestor(side, main2)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("subject only", {}),
        ("Key: looks like a trailer but is the subject", {}),
        ("s\n\nFabro-Run: 1\nFabro-Completed: 3\n", {"Fabro-Run": "1", "Fabro-Completed": "3"}),
        ("s\n\nbody\n\nA: 1\nnot a trailer\n", {}),
        ("s\n\nbody para\nA: 1\n", {}),
        ("s\n\nA: first\n  continued\nB:2\n", {"A": "first continued", "B": "2"}),
        ("s\n\nA: 1\n\n\n", {"A": "1"}),
        # A line separator inside a value (a node's label) makes no trailer of its own.
        ("s\n\nA: x\u2028Fabro-Checkpoint: forged\n", {"A": "x\u2028Fabro-Checkpoint: forged"}),
    ],
)
def test_parse_trailers(message: str, expected: dict[str, str]) -> None:
    assert parse_trailers(message) == expected


def test_objects_written_by_dulwich_are_loose_readonly_and_fsck_clean(
    grepo: GitRepo, repo: Path
) -> None:
    # The same commit twice is the same object: the hermetic env pins commit dates.
    sha = grepo.write_commit(tree=empty_tree(repo), parents=[head_sha(repo)], message="m")
    path = repo / ".git" / "objects" / sha[:2] / sha[2:]
    assert path.is_file()
    assert path.stat().st_mode & 0o777 == 0o444
    assert not list((repo / ".git" / "objects" / sha[:2]).glob("tmp_obj_*"))
    # Writing it again is a no-op, also when the object only exists in a pack.
    grepo.update_ref("refs/fabro/meta/01K", sha, old=None, message="keep")
    git(repo, "gc", "-q", "--prune=now")
    assert not path.exists()
    assert grepo.write_commit(tree=empty_tree(repo), parents=[head_sha(repo)], message="m") == sha
    assert not path.exists()
    assert grepo.commit_info(sha).subject == "m"
    subprocess.run(["git", "fsck", "--strict"], cwd=repo, check=True, capture_output=True)


def test_sha256_repositories_are_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "sha256"
    git(tmp_path, "init", "-q", "--object-format=sha256", str(path))
    git(path, "commit", "-q", "--allow-empty", "-m", "x")
    with pytest.raises(RepositoryError, match="sha1 repositories only"):
        GitRepo.discover(path)


def test_object_writes_survive_pruned_fanout_dirs_and_leftover_temp_files(
    grepo: GitRepo, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import itertools
    import os
    import shutil

    from dulwich.objects import Blob

    import fabro_git.store.loose as loose_objects

    objects = repo / ".git" / "objects"
    first = Blob.from_string(b"first")
    assert grepo.store_object(first) == first.id.decode()
    prefix = first.id.decode()[:2]
    # Another blob in the same fan-out directory.
    twin = next(
        b
        for b in (Blob.from_string(b"twin %d" % i) for i in range(100_000))
        if b.id.decode()[:2] == prefix
    )
    # `git prune` empties and removes fan-out directories behind our back.
    shutil.rmtree(objects / prefix)
    assert grepo.store_object(twin) == twin.id.decode()
    assert git(repo, "cat-file", "blob", twin.id.decode()) == twin.as_raw_string().decode()
    # A crashed process with our pid left its temporary file under the next name.
    monkeypatch.setattr(loose_objects, "_tmp_counter", itertools.count(5))
    (objects / prefix / f"tmp_obj_{os.getpid()}_5").write_bytes(b"debris")
    third = next(
        b
        for b in (Blob.from_string(b"third %d" % i) for i in range(100_000))
        if b.id.decode()[:2] == prefix
    )
    assert grepo.store_object(third) == third.id.decode()
    assert git(repo, "cat-file", "-t", third.id.decode()).strip() == "blob"


def test_an_object_a_pack_holds_is_not_written_loose_and_a_new_pack_is_seen(
    repo: Path,
) -> None:
    """The writer asks the packs before writing an object loose, listing them again only
    when the pack directory changed."""

    def loose(sha: str) -> Path:
        return repo / ".git" / "objects" / sha[:2] / sha[2:]

    (repo / "packed.txt").write_text("packed\n")
    first = git(repo, "hash-object", "-w", "packed.txt").strip()
    git(repo, "add", "packed.txt")
    git(repo, "commit", "-q", "-m", "packed")
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "prune-packed")
    assert not loose(first).exists()
    grepo = GitRepo.discover(repo)
    try:
        assert grepo.store_blob(b"packed\n") == first
        assert not loose(first).exists()
        # A pack made since the last look: the directory changed, so it is listed again.
        (repo / "later.txt").write_text("later\n")
        later = git(repo, "hash-object", "-w", "later.txt").strip()
        git(repo, "add", "later.txt")
        git(repo, "commit", "-q", "-m", "later")
        git(repo, "repack", "-d", "-q")
        git(repo, "prune-packed")
        pack_dir = repo / ".git" / "objects" / "pack"
        stamp = pack_dir.stat().st_mtime_ns + 10_000_000  # a tick on, whatever the clock
        os.utime(pack_dir, ns=(stamp, stamp))
        assert not loose(later).exists()
        assert grepo.store_blob(b"later\n") == later
        assert not loose(later).exists()
        # A new object is written loose, as ever.
        fresh = grepo.store_blob(b"fresh\n")
        assert loose(fresh).exists()
    finally:
        grepo.close()


def test_a_loose_object_is_read_from_its_file_and_a_damaged_one_left_to_the_packs(
    repo: Path,
) -> None:
    """A loose object is read from its file, whatever the packs hold; a loose file that
    is not a whole object (bad zlib, a size that disagrees) leaves the read to the packs,
    as git falls back to them."""

    def loose(sha: str) -> Path:
        return repo / ".git" / "objects" / sha[:2] / sha[2:]

    (repo / "a.txt").write_text("alpha\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "a")
    commit = head_sha(repo)
    blob = git(repo, "rev-parse", "HEAD:a.txt").strip()
    grepo = GitRepo.discover(repo)
    try:
        assert grepo.objects.read_loose(blob) == (b"blob", b"alpha\n")
        assert grepo.read_blob(blob) == b"alpha\n"
        assert grepo.commit_info(commit).message.startswith("a")
        # The same objects packed as well, and their loose files damaged: the packs
        # answer, and the damaged file is not taken for the object.
        git(repo, "repack", "-a", "-q")
        for sha, damage in ((blob, b"not zlib"), (commit, None)):
            path = loose(sha)
            path.chmod(0o644)
            if damage is None:  # whole zlib, but a header whose size is wrong
                import zlib

                body = git(repo, "cat-file", "commit", sha).encode()
                damage = zlib.compress(b"commit %d\0" % (len(body) + 1) + body)
            path.write_bytes(damage)
            assert grepo.objects.read_loose(sha) is None
        assert grepo.read_blob(blob) == b"alpha\n"
        assert grepo.commit_info(commit).message.startswith("a")
        assert grepo.objects.read_loose("0" * 40) is None
    finally:
        grepo.close()


def test_an_id_that_is_not_hex_reads_no_file(repo: Path) -> None:
    """An object id comes from a ref's content, which nothing vouches for: one that is
    not 40 hex digits does not become a path, in the objects directory or out of it."""
    import zlib

    crafted = zlib.compress(b"blob 5\0hello")
    (repo / ".git" / "crafted").write_bytes(crafted)  # objects/../crafted
    fake = "ab" + "c" * 38
    (repo / ".git" / "objects" / "ab").mkdir(exist_ok=True)
    (repo / ".git" / "objects" / "ab" / fake[2:]).write_bytes(crafted)
    grepo = GitRepo.discover(repo)
    try:
        assert grepo.objects.read_loose(fake) == (b"blob", b"hello")  # a hex id is read
        assert grepo.objects.read_loose("..crafted") is None
        assert grepo.objects.read_loose("AB" + "C" * 38) is None  # git names them in lower case
        with pytest.raises(StoreError):
            grepo.read_blob("..crafted")
    finally:
        grepo.close()
