"""In-process staging must write the tree git writes, keep the index git's, and leave
to git whatever it does not reproduce (clean filters above all)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from helpers import git, run_fabro, write_workflow
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabro_git.store import staging, statcheck
from fabro_git.store.repo import GitRepo
from fabro_git.store.staging import PendingIndex, Stager

# Names chosen to exercise git's tree order (a directory sorts as if it ended in "/").
DIRS = ["", "d1", "d1/d2", "d1.d", "sp ace"]
FILES = ["a", "d1.txt", "d1-a", "d10", "é", "x y", "Z"]

# Ignore patterns, some of which match the names above (and one that only un-ignores).
IGNORE_PATTERNS = ["*.txt", "d1/", "/Z", "!d1.txt", "sp ace/", "**/fa", "d1.d/*", "*.log"]
File = tuple[str, bytes, bool, bool]  # path, content, executable, symlink


def _settled(staged: tuple[str, object] | None) -> tuple[str, tuple[int, int] | None]:
    """A staging's tree and the stamp of the index it wrote, once its objects are on
    disk (as the checkpoint that takes them writes them)."""
    assert staged is not None
    tree, stamp = staged
    if isinstance(stamp, PendingIndex):
        return tree, stamp.settle()
    assert stamp is None or isinstance(stamp, tuple)
    return tree, stamp


def _path(dir_name: str, file_name: str) -> str:
    # Files live under "f"-prefixed names inside directories so that a path is never
    # both a file and a directory (that case is left to git and tested apart).
    return f"{dir_name}/f{file_name}" if dir_name else file_name


files_strategy = st.dictionaries(
    st.builds(_path, st.sampled_from(DIRS), st.sampled_from(FILES)),
    st.tuples(st.binary(max_size=40), st.booleans(), st.booleans()),
    max_size=12,
)


def _write(root: Path, files: dict[str, tuple[bytes, bool, bool]]) -> None:
    for rel, (content, executable, symlink) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        if symlink:
            os.symlink(content.decode("latin-1").replace("\0", "") or "target", path)
        else:
            path.write_bytes(content)
            os.chmod(path, 0o755 if executable else 0o644)


def _remove_empty_dirs(root: Path) -> None:
    for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        if ".git" not in dirpath and Path(dirpath) != root:
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def _git_tree_from_copy(root: Path) -> str:
    index = root / ".git" / "index"
    copy = root / ".git" / "index.copy"
    shutil.copyfile(index, copy)
    env = {**os.environ, "GIT_INDEX_FILE": str(copy)}
    subprocess.run(["git", "add", "-A"], cwd=root, env=env, check=True)
    out = subprocess.run(
        ["git", "write-tree"], cwd=root, env=env, check=True, capture_output=True, text=True
    )
    copy.unlink()
    return out.stdout.strip()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    first=files_strategy,
    second=files_strategy,
    deleted=st.lists(st.sampled_from([_path(d, f) for d in DIRS for f in FILES]), max_size=6),
    third=files_strategy,
    version=st.sampled_from(["2", "3", "4"]),
    ignored=st.lists(st.sampled_from(IGNORE_PATTERNS), max_size=3),
)
def test_the_tree_is_the_one_git_writes(
    first: dict[str, tuple[bytes, bool, bool]],
    second: dict[str, tuple[bytes, bool, bool]],
    deleted: list[str],
    third: dict[str, tuple[bytes, bool, bool]],
    version: str,
    ignored: list[str],
) -> None:
    root = Path(tempfile.mkdtemp(prefix="staging-"))
    try:
        git(root, "init", "-q")
        git(root, "config", "index.version", version)  # v4 compresses paths
        if ignored:
            (root / ".gitignore").write_text("\n".join(ignored) + "\n")
        _write(root, first)
        git(root, "add", "-A")
        tree = git(root, "write-tree").strip()
        stamp = statcheck.index_stamp(root)
        grepo = GitRepo.discover(root)
        stager = Stager(grepo, root)
        for change in (second, third):
            _write(root, change)
            for rel in deleted:
                (root / rel).unlink(missing_ok=True)
            _remove_empty_dirs(root)
            staged = stager.stage(tree, stamp)
            if staged is None:
                # Left to git (an ignore pattern might match a new file): as the
                # recorder does, stage with git and go on from its index.
                assert ignored
                git(root, "add", "-A")
                tree, stamp = git(root, "write-tree").strip(), statcheck.index_stamp(root)
                continue
            tree, stamp = _settled(staged)
            # The index we wrote says what git would: nothing differs from the files...
            assert git(root, "--no-optional-locks", "diff", "--name-status").strip() == ""
            others = git(root, "--no-optional-locks", "ls-files", "--others", "--exclude-standard")
            assert others.strip() == ""
            # ...nothing git ignores went in...
            assert git(root, "ls-files", "--cached", "--ignored", "--exclude-standard") == ""
            # ...and git staging everything (in a copy of that index, so the next round
            # starts from ours) gives the very same tree.
            assert _git_tree_from_copy(root) == tree
            assert statcheck.index_stamp(root) == stamp
            deleted = deleted[::-1][:2]
        grepo.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_file_that_becomes_a_directory_is_left_to_git(repo: Path) -> None:
    (repo / "a").write_text("file\n")
    git(repo, "add", "-A")
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    (repo / "a").unlink()
    (repo / "a").mkdir()
    (repo / "a" / "b").write_text("now a directory\n")
    assert Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo)) is None
    grepo.close()


def test_a_clean_filter_sends_staging_back_to_git(repo: Path) -> None:
    (repo / ".gitattributes").write_text("*.txt filter=upper\n")
    git(repo, "config", "filter.upper.clean", "tr a-z A-Z")
    git(repo, "config", "filter.upper.smudge", "cat")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "filter")
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    (repo / "shout.txt").write_text("quiet\n")
    assert Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo)) is None
    grepo.close()
    # Through a whole run: the second stage would be staged in process, were it not
    # for the filter; git stages it, and the filter applies as in the user's commits.
    write_workflow(
        repo,
        """digraph Filtered {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            one [shape=parallelogram, script="echo first > one.txt"]
            two [shape=parallelogram, script="echo second > two.txt"]
            start -> one -> two -> exit
        }""",
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "workflow")
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    (branch,) = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/fabro/run").split()
    assert git(repo, "show", f"{branch}:one.txt") == "FIRST\n"
    assert git(repo, "show", f"{branch}:two.txt") == "SECOND\n"


def test_an_ignored_new_file_is_left_to_git(repo: Path) -> None:
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    (repo / "noise.log").write_text("ignored\n")
    assert Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo)) is None
    grepo.close()


def _a_change_staged(
    repo: Path,
) -> tuple[GitRepo, Stager, tuple[str, tuple[int, int] | PendingIndex | None]]:
    """A file `a` git staged, then changed and staged again here."""
    (repo / "a").write_text("one\n")
    git(repo, "add", "-A")
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    stager = Stager(grepo, repo)
    (repo / "a").write_text("two\n")
    staged = stager.stage(tree, statcheck.index_stamp(repo))
    assert staged is not None
    return grepo, stager, staged


def test_staging_leaves_no_lock_and_waits_its_turn_behind_git(repo: Path) -> None:
    grepo, stager, staged = _a_change_staged(repo)
    # Nothing is left behind in the git dir that could block a later git command.
    assert sorted(p.name for p in (repo / ".git").glob("index*")) == ["index"]
    # While git holds the index lock, the index is git's to write.
    (repo / ".git" / "index.lock").write_bytes(b"")
    (repo / "a").write_text("three\n")
    assert stager.stage(staged[0], staged[1]) is None
    (repo / ".git" / "index.lock").unlink()
    grepo.close()


def test_the_index_names_the_stages_objects_only_once_they_are_on_disk(repo: Path) -> None:
    """A staging's blob and trees wait in memory for the checkpoint's pack, written by
    another thread; the index that names them is written right after it."""
    index = repo / ".git" / "index"
    grepo, _, staged = _a_change_staged(repo)
    before = git(repo, "ls-files", "-s", "a")  # as git staged it
    new_tree, pending = staged
    assert isinstance(pending, PendingIndex) and not pending.done
    # Nothing on disk names the new objects yet.
    assert git(repo, "ls-files", "-s", "a") == before and index.exists()
    assert subprocess.run(["git", "cat-file", "-e", new_tree], cwd=repo).returncode != 0
    assert grepo.objects.held(new_tree) is not None  # read back from memory meanwhile

    def checkpoint() -> None:
        with grepo.objects.batch():
            grepo.store_raw(b"blob", b"the checkpoint's own\n")

    thread = threading.Thread(target=checkpoint)
    thread.start()
    thread.join()
    assert pending.done and pending.stamp == statcheck.index_stamp(repo)
    assert git(repo, "cat-file", "-t", new_tree) == "tree\n"
    assert git(repo, "--no-optional-locks", "diff", "--name-status") == ""
    assert git(repo, "write-tree").strip() == new_tree
    grepo.close()


def test_an_index_git_rewrote_before_the_objects_were_written_is_left_as_git_wrote_it(
    repo: Path,
) -> None:
    grepo, stager, staged = _a_change_staged(repo)
    (repo / "b").write_text("a hook's\n")
    git(repo, "add", "b")  # git rewrites the index meanwhile
    grepo.objects.flush()
    # Git's index stands: b as git staged it, a as git last saw it.
    assert "b\n" in git(repo, "ls-files")
    assert git(repo, "--no-optional-locks", "diff", "--name-only") == "a\n"
    pending = staged[1]
    assert isinstance(pending, PendingIndex) and pending.done and pending.stamp is None
    assert stager.stage(*staged) is None  # the next staging is git's
    grepo.close()


def test_a_new_file_no_ignore_pattern_can_match_is_staged_in_process(repo: Path) -> None:
    (repo / ".gitignore").write_text("*.log\nbuild/\n")
    git(repo, "add", "-A")
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    (repo / "src").mkdir()
    (repo / "src" / "main.py").write_text("print('hi')\n")
    staged = Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo))
    _settled(staged)
    assert git(repo, "ls-files", "src") == "src/main.py\n"
    grepo.close()


def test_an_exclude_file_rewritten_between_stagings_is_read_again(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ignore files' lines are remembered between stages by their stat data: a
    rewrite that keeps the size and puts the mtime back still changes the ctime."""
    # Any file counts as settled, so the first reading is remembered.
    monkeypatch.setattr(staging, "_SETTLED_NS", -1)
    exclude = repo / ".git" / "info" / "exclude"
    exclude.parent.mkdir(exist_ok=True)
    exclude.write_text("*.log\n")
    long_ago = exclude.stat().st_mtime - 3600
    os.utime(exclude, (long_ago, long_ago))
    git(repo, "add", "-A")
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    stager = Stager(grepo, repo)
    (repo / "a.txt").write_text("kept\n")
    staged = stager.stage(tree, statcheck.index_stamp(repo))
    assert staged is not None  # no pattern can match a.txt: staged in process
    exclude.write_text("*.txt\n")  # the same size
    os.utime(exclude, (long_ago, long_ago))
    (repo / "b.txt").write_text("ignored now\n")
    # b.txt may be ignored: git decides, not a remembered reading of the old file.
    assert stager.stage(*staged) is None
    grepo.close()


@pytest.mark.parametrize("setting", ["core.excludesFile", "core.autocrlf"])
def test_what_the_repositorys_config_asks_for_is_left_to_git(repo: Path, setting: str) -> None:
    """The stager reads git's configuration as the worktree sees it: a new file that the
    user's excludes file may match, or line endings git converts, are left to git. The
    same new file without the setting is staged in process."""
    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    (repo / "noise.log").write_text("a line\n")
    assert Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo)) is not None
    git(repo, "reset", "-q")
    excludes = repo.parent / "excludes"
    excludes.write_text("*.log\n")
    value = str(excludes) if setting == "core.excludesFile" else "true"
    git(repo, "config", setting, value)  # as written, in camel case: git lower-cases it
    assert Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo)) is None
    grepo.close()


def test_an_ignore_file_that_is_no_regular_file_is_left_to_git(repo: Path, tmp_path: Path) -> None:
    """A stage may leave a `.gitignore` linked to a FIFO (or to `/dev/zero`): the stager
    never reads it, and git, which does not follow a link in the worktree, decides."""
    import threading

    tree = git(repo, "write-tree").strip()
    grepo = GitRepo.discover(repo)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (repo / ".gitignore").symlink_to(fifo)
    (repo / "new.txt").write_text("new\n")
    staged: list[object] = []
    stager = threading.Thread(
        target=lambda: staged.append(Stager(grepo, repo).stage(tree, statcheck.index_stamp(repo))),
        daemon=True,
    )
    stager.start()
    stager.join(timeout=10)  # a read of a FIFO with no writer never returns
    assert staged == [None]
    grepo.close()


def test_a_stage_that_links_gitignore_to_dev_zero_is_checkpointed(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph G { start [shape=Mdiamond]; exit [shape=Msquare];\n"
        '  link [shape=parallelogram, script="ln -s /dev/zero .gitignore; echo new > new.txt"]\n'
        "  start -> link -> exit }\n",
    )
    # Bounded memory: an endless read fails here rather than taking the machine's.
    proc = subprocess.run(
        ["prlimit", "--as=4000000000", "git", "fabro", "run", "wf.fabro", "--json"],
        cwd=repo, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    listed = git(repo, "ls-tree", "--name-only", f"fabro/run/{run_id}")
    assert {".gitignore", "new.txt"} <= set(listed.split())


def test_a_fifo_named_gitignore_fails_the_stage_instead_of_hanging_the_checkpoint(
    repo: Path,
) -> None:
    """git opens every `.gitignore` as it adds files, and waits on a FIFO for ever; the
    checkpoint says so and fails the stage."""
    write_workflow(
        repo,
        "digraph F { start [shape=Mdiamond]; exit [shape=Msquare];\n"
        '  pipe [shape=parallelogram, script="mkdir sub && mkfifo sub/.gitignore && echo x > new"]\n'
        "  start -> pipe -> exit }\n",
    )
    proc = run_fabro("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "sub/.gitignore is a named pipe (FIFO), not a file" in proc.stderr


FIFO_STAGE = (
    'pipe [shape=parallelogram, script="mkdir -p sub && test -e {marker} || mkfifo sub/.gitignore;'
    ' touch {marker}; echo x > new"]'
)


@pytest.mark.parametrize("path", ["git-staging", "parallel-branch"])
def test_a_fifo_named_gitignore_fails_the_stage_whoever_stages_it(
    repo: Path, tmp_path: Path, path: str
) -> None:
    """The same refusal where git stages the worktree: a run with exclude globs (which
    only git applies), and a parallel branch's own worktree (the branch fails, the run
    goes on with the other, partially succeeded)."""
    stage = FIFO_STAGE.format(marker=tmp_path / "made")
    if path == "git-staging":
        body = f"{stage}\n  start -> pipe -> exit"
        (repo / "run.toml").write_text(
            '[workflow]\ngraph = "wf.fabro"\n[run.checkpoint]\nexclude_globs = ["*.log"]\n'
        )
        target = "run.toml"
    else:
        body = (
            f"fan [shape=component]; join [shape=tripleoctagon];\n  {stage}\n"
            '  other [shape=parallelogram, script="echo y > other"]\n'
            "  start -> fan; fan -> pipe -> join; fan -> other -> join; join -> exit"
        )
        target = "wf.fabro"
    write_workflow(
        repo, f"digraph F {{ start [shape=Mdiamond]; exit [shape=Msquare];\n  {body} }}\n"
    )
    proc = run_fabro("run", target, cwd=repo, timeout=60)
    assert proc.returncode == (1 if path == "git-staging" else 0), proc.stderr
    assert "sub/.gitignore is a named pipe (FIFO), not a file" in proc.stderr
    assert "Traceback" not in proc.stderr
    if path == "parallel-branch":
        assert "branch pipe: failed" in proc.stderr and "Run partially succeeded" in proc.stderr


def test_an_add_of_known_paths_looks_only_on_their_way(repo: Path) -> None:
    """git reads the ignore and attribute files of the directories leading to the paths
    it adds: only those are looked at; the whole walk finds the rest."""
    from fabro_git.errors import StoreError

    (repo / "a" / "b").mkdir(parents=True)
    os.mkfifo(repo / "a" / ".gitignore")
    (repo / "other").mkdir()
    os.mkfifo(repo / "other" / ".gitattributes")
    with pytest.raises(StoreError, match=r"a/\.gitignore is a named pipe"):
        statcheck.refuse_special_files(repo, ["a/b/new.txt"])
    statcheck.refuse_special_files(repo, ["c.txt", "d/e.txt"])  # neither is on the way
    found = sorted(os.fsdecode(path) for path, _ in statcheck.special_files(repo))
    assert found == ["a/.gitignore", "other/.gitattributes"]


@pytest.mark.parametrize("put_back", ["remove_untracked", "checkout"])
def test_putting_a_worktree_back_drops_a_fifo_git_would_wait_on(repo: Path, put_back: str) -> None:
    """Resume puts a killed run's worktree back to its checkpoint with `git reset` and
    `git clean`, which read every `.gitignore` as they walk: the FIFO a stage left goes
    first (a commit cannot hold one)."""
    from fabro_git.store import worktree as worktrees

    fifo = repo / ".gitignore"
    os.mkfifo(fifo)
    (repo / "left.txt").write_text("untracked\n")
    head = git(repo, "rev-parse", "HEAD").strip()
    done: list[bool] = []

    def go() -> None:
        if put_back == "checkout":
            worktrees.checkout(repo, head)
        else:
            worktrees.remove_untracked(repo)
        done.append(True)

    putting = threading.Thread(target=go, daemon=True)
    putting.start()
    putting.join(60)
    if putting.is_alive():  # let a git stuck on the FIFO go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert done == [True]
    assert not fifo.exists() and not os.path.islink(fifo)
