"""The in-process diff of a checkpoint walks only the subtrees that changed, and says
what dulwich's whole-tree diff says, file for file."""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

from dulwich.objects import ObjectID
from dulwich.patch import write_tree_diff
from helpers import git
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabro_git.store.repo import GitRepo

PATHS = ["a", "b.txt", "d/a", "d/e/f", "d.x", "d-y", "z", "q/r"]
trees = st.dictionaries(st.sampled_from(PATHS), st.sampled_from([b"1\n", b"2\n", b"3\n"]))


def _tree(root: Path, files: dict[str, bytes]) -> str:
    for child in root.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for rel, content in files.items():
        # "d/a" and a file "d" cannot both exist; the later one wins, as it would on disk.
        path = root / rel
        for parent in reversed(path.parents):
            if parent != root and parent.is_file():
                parent.unlink()
        if path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    git(root, "add", "-A")
    return git(root, "write-tree").strip()


def _files(diff: str) -> list[str]:
    return ["diff --git" + part for part in diff.split("diff --git")[1:]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=trees, after=trees)
def test_the_diff_matches_dulwich(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    root = Path(tempfile.mkdtemp(prefix="treediff-"))
    try:
        git(root, "init", "-q")
        old, new = _tree(root, before), _tree(root, after)
        grepo = GitRepo.discover(root)
        expected = io.BytesIO()
        store = grepo._repo.object_store
        write_tree_diff(expected, store, ObjectID(old.encode()), ObjectID(new.encode()))
        ours = grepo.small_tree_diff(old, new, max_bytes=1_000_000)
        assert ours is not None
        # The same file diffs; ours come in git's path order ("d.x" before "d/a").
        assert sorted(_files(ours)) == sorted(_files(expected.getvalue().decode()))
        grepo.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
