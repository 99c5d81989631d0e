"""Checkpoint objects written as packs: read by git itself, merged as they pile up, and
never pointed at before they are on disk."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
from pathlib import Path

import pytest
from dulwich.object_format import SHA1
from dulwich.objects import Blob, Tree
from dulwich.pack import load_pack_index
from helpers import assert_fsck_clean, git

from fabro_git.store import packwrite
from fabro_git.store.repo import GitRepo


def _packs(repo: Path) -> list[str]:
    return sorted(p for p in os.listdir(repo / ".git/objects/pack") if p.endswith(".pack"))


def _loose(repo: Path) -> int:
    return int(git(repo, "count-objects", "-v").split("count: ")[1].split()[0])


def _three(grepo: GitRepo, tag: str) -> tuple[str, str, str]:
    """A blob, a tree holding it, a commit of the tree: what a checkpoint writes."""
    blob = grepo.store_blob(f"content {tag}\n".encode())
    tree = Tree()
    tree.add(b"f.txt", 0o100644, blob.encode())
    tree_sha = grepo.store_object(tree)
    commit = grepo.write_commit(tree=tree_sha, parents=[], message=f"c {tag}")
    return blob, tree_sha, commit


def test_a_batch_is_one_pack_git_reads_whole(repo: Path, grepo: GitRepo) -> None:
    loose = _loose(repo)
    big = os.urandom(70_000)  # a size header of three bytes; stored as it is
    with grepo.objects.batch():
        blob, tree, commit = _three(grepo, "a")
        empty = grepo.store_blob(b"")
        big_sha = grepo.store_blob(big)
        assert _packs(repo) == []  # nothing on disk while the batch is open
    assert _loose(repo) == loose
    [pack] = _packs(repo)
    idx = repo / ".git/objects/pack" / pack.replace(".pack", ".idx")
    listing = git(repo, "verify-pack", "-v", str(idx))
    for sha in (blob, tree, commit, empty, big_sha):
        assert sha in listing
    assert git(repo, "cat-file", "-p", blob) == "content a\n"
    assert git(repo, "cat-file", "-t", commit).strip() == "commit"
    shown = subprocess.run(
        ["git", "cat-file", "blob", big_sha], cwd=repo, capture_output=True, check=True
    )
    assert shown.stdout == big
    assert git(repo, "cat-file", "-s", empty).strip() == "0"
    # And dulwich, through the repository's own reads.
    assert grepo.commit_info(commit).tree == tree


def test_a_batch_of_fewer_than_three_objects_is_written_loose(repo: Path, grepo: GitRepo) -> None:
    loose = _loose(repo)
    with grepo.objects.batch():
        a = grepo.store_blob(b"one\n")
        b = grepo.store_blob(b"two\n")
    assert _packs(repo) == []
    assert _loose(repo) == loose + 2
    assert git(repo, "cat-file", "-p", a) == "one\n" and git(repo, "cat-file", "-p", b) == "two\n"


def test_a_ref_moved_inside_a_batch_finds_its_objects_on_disk(repo: Path, grepo: GitRepo) -> None:
    with grepo.objects.batch():
        _, _, commit = _three(grepo, "b")
        grepo.update_ref("refs/fabro/meta/t", commit, old=None, message="m")
        # Readable by git before the batch ends: the ref move wrote them first.
        assert git(repo, "log", "--format=%s", "refs/fabro/meta/t").strip() == "c b"
        later = grepo.store_blob(b"after the ref\n")
    assert git(repo, "cat-file", "-p", later) == "after the ref\n"
    assert_fsck_clean(repo)


def test_an_error_inside_a_batch_drops_its_objects(repo: Path, grepo: GitRepo) -> None:
    with pytest.raises(RuntimeError), grepo.objects.batch():
        blob, _, _ = _three(grepo, "c")
        raise RuntimeError("stop")
    assert _packs(repo) == []
    missing = subprocess.run(["git", "cat-file", "-e", blob], cwd=repo, check=False)
    assert missing.returncode != 0
    assert grepo.objects.held(blob) is None
    # Not counted among what this process wrote: nothing to look for at the run's end.
    assert grepo.missing_written() == []


def test_packs_merge_as_they_pile_up_and_into_one_at_the_end(repo: Path, grepo: GitRepo) -> None:
    written = []
    for i in range(9):
        with grepo.objects.batch():
            written += _three(grepo, f"n{i}")
    # Eight packs became one; the ninth waits beside it.
    assert len(_packs(repo)) == 2
    grepo.consolidate_packs()
    [pack] = _packs(repo)
    idx = repo / ".git/objects/pack" / pack.replace(".pack", ".idx")
    listing = git(repo, "verify-pack", "-v", str(idx))
    assert all(sha in listing for sha in written)
    assert grepo.missing_written() == []
    # Nothing left behind: no temporary files, no index without its pack.
    names = os.listdir(repo / ".git/objects/pack")
    assert sorted(names) == sorted([pack, pack.replace(".pack", ".idx")])


def test_a_repack_that_takes_the_packs_away_loses_nothing_held(repo: Path, grepo: GitRepo) -> None:
    written = []
    for i in range(3):
        with grepo.objects.batch():
            written += _three(grepo, f"r{i}")
    # Unreachable, so a full repack drops them with their packs (`git gc --prune=now`).
    git(repo, "repack", "-a", "-d", "-q")
    git(repo, "prune", "--expire=now")
    for i in range(3, 9):
        with grepo.objects.batch():
            written += _three(grepo, f"r{i}")
    grepo.consolidate_packs()
    # The first ones are written again from memory; the rest are in the merged pack.
    assert grepo.missing_written() == []
    for sha in written:
        git(repo, "cat-file", "-e", sha)


def test_offsets_past_2_gib_go_to_the_index_large_table(tmp_path: Path) -> None:
    objects = {
        bytes([1] * 20): (12, 10, 0x1234),
        bytes([2] * 20): (0x80000000, 10, 0x5678),
        bytes([3] * 20): (0x1_2345_6789, 10, 0x9ABC),
    }
    index = packwrite._index(objects, b"\7" * 20)
    path = tmp_path / "x.idx"
    path.write_bytes(index)
    loaded = load_pack_index(str(path), SHA1)
    try:
        loaded.check()  # the index's own checksum
        assert loaded.get_pack_checksum() == b"\7" * 20
        assert {sha: (offset, crc) for sha, offset, crc in loaded.iterentries()} == {
            sha: (offset, crc) for sha, (offset, _, crc) in objects.items()
        }
    finally:
        loaded.close()


def test_a_blob_stored_outside_a_batch_is_loose(repo: Path, grepo: GitRepo) -> None:
    loose = _loose(repo)
    grepo.store_object(Blob.from_string(b"alone\n"))
    assert _loose(repo) == loose + 1 and _packs(repo) == []


def test_a_merge_that_finds_one_pack_left_keeps_it(repo: Path, grepo: GitRepo) -> None:
    """`git gc` took all but one of the packs away: merged alone, the last one would be
    the very same file, written again and then deleted as an old one."""
    with grepo.objects.batch():
        _three(grepo, "gone")
    [taken] = _packs(repo)
    with grepo.objects.batch():
        kept = _three(grepo, "kept")
    for name in (taken, taken.replace(".pack", ".idx")):
        (repo / ".git/objects/pack" / name).unlink()
    grepo.consolidate_packs()
    assert len(_packs(repo)) == 1
    for sha in kept:
        git(repo, "cat-file", "-e", sha)


def test_each_thread_has_its_own_batch(repo: Path, grepo: GitRepo) -> None:
    """A batch opened on another thread meanwhile neither takes this thread's objects
    nor keeps them from disk when this thread moves a ref."""
    other_open, this_done = threading.Event(), threading.Event()
    theirs: list[str] = []

    def other() -> None:
        with grepo.objects.batch():
            theirs.extend(_three(grepo, "theirs"))
            other_open.set()
            this_done.wait(30)

    with grepo.objects.batch():
        _, _, commit = _three(grepo, "ours")
        thread = threading.Thread(target=other)
        thread.start()
        assert other_open.wait(30)
        grepo.update_ref("refs/fabro/meta/ours", commit, old=None, message="m")
        assert git(repo, "log", "--format=%s", "refs/fabro/meta/ours").strip() == "c ours"
    this_done.set()
    thread.join()
    for sha in theirs:
        git(repo, "cat-file", "-e", sha)
    assert_fsck_clean(repo)


def test_a_temporary_pack_name_already_taken_is_passed_over(repo: Path, grepo: GitRepo) -> None:
    """Debris of a crashed process that had this pid, or a link planted there, is never
    written through: the next name is taken."""
    pack_dir = repo / ".git/objects/pack"
    target = repo / "elsewhere.txt"
    target.write_text("untouched\n")
    for n in range(3):
        (pack_dir / f"tmp_pack_{os.getpid()}_{n}").symlink_to(target)
    packwrite._tmp_counter = itertools.count()
    with grepo.objects.batch():
        blob, _, _ = _three(grepo, "taken")
    assert target.read_text() == "untouched\n"
    assert git(repo, "cat-file", "-p", blob) == "content taken\n"
