"""MetaSnapshotter: subtree reuse, deletes, CAS and a clean object database."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import git

from fabro_git.errors import RefRaceError, StoreError
from fabro_git.store.repo import GitRepo
from fabro_git.store.snapshot import MetaSnapshotter

REF = "refs/fabro/meta/01SNAP"


def ls_tree(repo: Path, rev: str) -> dict[str, str]:
    """{path: sha} for every entry, trees included, recursively."""
    out = git(repo, "ls-tree", "-r", "-t", "-z", rev)
    entries = {}
    for record in out.split("\0"):
        if record:
            meta, path = record.split("\t", 1)
            entries[path] = meta.split()[2]
    return entries


def fsck(repo: Path) -> None:
    proc = subprocess.run(
        ["git", "fsck", "--strict", "--no-dangling"], cwd=repo, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and "error" not in proc.stderr.lower(), (
        proc.stdout + proc.stderr
    )


def test_first_snapshot_is_an_orphan_root(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    result = snap.write(
        {"manifest.json": b'{"run_id": "01SNAP"}', "graph.fabro": b"digraph {}\n"},
        "init",
        expected_tip=None,
    )
    assert result.entry_count == 2
    assert result.bytes == len(b'{"run_id": "01SNAP"}') + len(b"digraph {}\n")
    assert grepo.read_ref(REF) == result.commit_sha
    info = grepo.commit_info(result.commit_sha)
    assert info.parents == ()
    assert info.subject == "init"
    assert git(repo, "show", f"{REF}:graph.fabro") == "digraph {}\n"
    assert git(repo, "log", "--format=%s", "fabro/meta/01SNAP").splitlines() == ["init"]
    assert git(repo, "reflog", "show", "--format=%gs", REF).splitlines() == ["fabro: init"]
    fsck(repo)


def test_unchanged_subtrees_are_reused(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    first = snap.write(
        {
            "manifest.json": b"{}",
            "nodes/plan/prompt.md": b"plan it",
            "nodes/plan/status.json": b'{"status": "success"}',
            "nodes/build/prompt.md": b"build it",
            "events/000001.jsonl": b'{"event": 1}\n',
            "assets/build/retry_1/report.xml": b"<xml/>",
        },
        "init",
        expected_tip=None,
    )
    second = snap.write(
        {
            "nodes/build/response.md": b"built",
            "events/000002.jsonl": b'{"event": 2}\n',
            "checkpoint.json": b'{"current_node": "build"}',
        },
        "checkpoint build@1",
        expected_tip=first.commit_sha,
    )
    before, after = ls_tree(repo, first.commit_sha), ls_tree(repo, second.commit_sha)
    # Untouched subtrees keep their object ids.
    for unchanged in ("nodes/plan", "assets", "assets/build/retry_1", "nodes/plan/status.json"):
        assert before[unchanged] == after[unchanged], unchanged
    # Only the path to the change was rebuilt.
    for changed in ("nodes", "nodes/build", "events"):
        assert before[changed] != after[changed], changed
    assert after["events/000001.jsonl"] == before["events/000001.jsonl"]
    assert set(after) - set(before) == {
        "nodes/build/response.md",
        "events/000002.jsonl",
        "checkpoint.json",
    }
    assert grepo.commit_info(second.commit_sha).parents == (first.commit_sha,)
    fsck(repo)


def test_unrelated_subtree_is_not_rewritten(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    first = snap.write(
        {"nodes/plan/prompt.md": b"p", "events/000001.jsonl": b"e\n"}, "init", expected_tip=None
    )
    plan_tree = ls_tree(repo, first.commit_sha)["nodes/plan"]
    packs_before = set((repo / ".git" / "objects" / "pack").glob("*.idx"))
    # A fresh snapshotter (nothing cached) must not write objects of subtrees it keeps.
    fresh = MetaSnapshotter(grepo, REF)
    second = fresh.write(
        {"events/000002.jsonl": b"f\n"}, "checkpoint", expected_tip=first.commit_sha
    )
    [new_pack] = set((repo / ".git" / "objects" / "pack").glob("*.idx")) - packs_before
    listed = git(repo, "verify-pack", "-v", str(new_pack))
    new_objects = [line.split()[0] for line in listed.splitlines() if line[:40].isalnum()]
    # blob + events tree + root tree + commit: nothing else.
    assert len(new_objects) == 4 and plan_tree not in new_objects
    assert ls_tree(repo, second.commit_sha)["nodes/plan"] == plan_tree


def test_delete_files_and_directories(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    first = snap.write(
        {
            "a.txt": b"a",
            "artifacts/big.json": b"{}",
            "nodes/x/one": b"1",
            "nodes/x/two": b"2",
            "nodes/y/one": b"1",
        },
        "init",
        expected_tip=None,
    )
    second = snap.write(
        {
            "a.txt": None,
            "artifacts/big.json": None,  # last entry: the directory disappears too
            "nodes/x": None,  # a whole directory
            "missing/file": None,  # deleting what is not there is fine
        },
        "cleanup",
        expected_tip=first.commit_sha,
    )
    assert second.entry_count == 0 and second.bytes == 0
    assert sorted(ls_tree(repo, second.commit_sha)) == ["nodes", "nodes/y", "nodes/y/one"]
    third = snap.write({"nodes/y/one": None}, "empty", expected_tip=second.commit_sha)
    assert ls_tree(repo, third.commit_sha) == {}
    assert (
        grepo.commit_info(third.commit_sha).tree
        == git(repo, "hash-object", "-t", "tree", "/dev/null").strip()
    )
    fsck(repo)


def test_overwrite_same_content_reuses_objects(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    first = snap.write({"x/y": b"same"}, "one", expected_tip=None)
    second = snap.write({"x/y": b"same"}, "two", expected_tip=first.commit_sha)
    assert grepo.commit_info(first.commit_sha).tree == grepo.commit_info(second.commit_sha).tree


def test_stale_expected_tip_is_a_race(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    first = snap.write({"a": b"1"}, "init", expected_tip=None)
    second = snap.write({"a": b"2"}, "two", expected_tip=first.commit_sha)
    with pytest.raises(RefRaceError) as info:
        snap.write({"a": b"3"}, "three", expected_tip=first.commit_sha)
    assert REF in str(info.value)
    assert grepo.read_ref(REF) == second.commit_sha
    with pytest.raises(RefRaceError):
        snap.write({"a": b"x"}, "init again", expected_tip=None)
    assert grepo.read_ref(REF) == second.commit_sha
    fsck(repo)


def test_bad_paths_are_refused(grepo: GitRepo) -> None:
    snap = MetaSnapshotter(grepo, REF)
    for path in ("", "/abs", "a//b", "a/../b", "./a", ".git/config", "trailing/"):
        with pytest.raises(StoreError):
            snap.write({path: b"x"}, "bad", expected_tip=None)
    with pytest.raises(StoreError):
        snap.write({"a": b"file", "a/b": b"beneath"}, "conflict", expected_tip=None)
    assert grepo.read_ref(REF) is None


def test_file_and_directory_clashes_with_existing_tree(grepo: GitRepo) -> None:
    snap = MetaSnapshotter(grepo, REF)
    first = snap.write({"nodes/plan/status.json": b"{}", "top": b"t"}, "init", expected_tip=None)
    with pytest.raises(StoreError):
        snap.write({"nodes/plan": b"a file over a dir"}, "x", expected_tip=first.commit_sha)
    with pytest.raises(StoreError):
        snap.write({"top/under": b"a dir through a file"}, "x", expected_tip=first.commit_sha)
    assert grepo.read_ref(REF) == first.commit_sha


def test_many_snapshots_append_segments(grepo: GitRepo, repo: Path) -> None:
    snap = MetaSnapshotter(grepo, REF)
    tip = None
    for i in range(1, 41):
        files: dict[str, bytes | None] = {
            f"events/{i:06d}.jsonl": f'{{"n": {i}}}\n'.encode(),
            "checkpoint.json": f'{{"i": {i}}}'.encode(),
            f"nodes/n{i % 5}/status.json": b'{"status": "success"}',
        }
        tip = snap.write(files, f"checkpoint n{i % 5}@{i}", expected_tip=tip).commit_sha
    assert tip is not None
    assert len(grepo.list_dir(tip, "events") or []) == 40
    assert grepo.read_file(tip, "events/000017.jsonl") == b'{"n": 17}\n'
    assert len(git(repo, "rev-list", REF).split()) == 40
    assert len(git(repo, "reflog", "show", REF).splitlines()) == 40
    fsck(repo)
