"""Meta snapshots splice changed entries into trees they keep serialised in memory: the
trees must still be exactly the ones git would build (git's order, where a directory
sorts as `name/`), through any sequence of writes and deletes."""

from __future__ import annotations

from pathlib import Path

from dulwich.objects import Blob, Tree
from helpers import assert_fsck_clean
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabro_git.store.repo import GitRepo
from fabro_git.store.snapshot import MetaSnapshotter

# Names whose order differs between "as a file" and "as a directory" (`a.b` < `a/` < `a0`).
_NAMES = ["a", "a.b", "a-", "a0", "ab", "b"]
_paths = st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3).map("/".join)
_step = st.dictionaries(_paths, st.one_of(st.none(), st.binary(max_size=3)), max_size=4)


def _tree_sha(files: dict[str, bytes]) -> str | None:
    """The root tree git would make of `files`, built with dulwich's own serialiser."""
    tree = Tree()
    subdirs: dict[str, dict[str, bytes]] = {}
    for path, data in files.items():
        head, _, rest = path.partition("/")
        if rest:
            subdirs.setdefault(head, {})[rest] = data
        else:
            tree.add(head.encode(), 0o100644, Blob.from_string(data).id)
    for name, sub in subdirs.items():
        sha = _tree_sha(sub)
        if sha is not None:
            tree.add(name.encode(), 0o040000, sha.encode())
    return tree.id.decode() if len(tree) else None


def _apply(files: dict[str, bytes], step: dict[str, bytes | None]) -> bool:
    """Apply `step` as the snapshotter would; False when it is not a valid step (a file
    and a directory of one name at once), which the snapshotter refuses."""
    paths = list(step)
    if any(other.startswith(path + "/") for path in paths for other in paths):
        return False  # one step may not name a path and paths beneath it
    for path in paths:
        parts = path.split("/")
        if any("/".join(parts[:i]) in files for i in range(1, len(parts))):
            return False  # beneath an existing file
    new = dict(files)
    for path, data in step.items():
        if data is None:
            prefix = path + "/"
            for existing in [p for p in new if p == path or p.startswith(prefix)]:
                del new[existing]
    for path, data in step.items():
        if data is not None:
            new[path] = data
    names = set(new)
    for path in names:
        parts = path.split("/")
        if any("/".join(parts[:i]) in names for i in range(1, len(parts))):
            return False
    files.clear()
    files.update(new)
    return True


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_step, min_size=1, max_size=8))
def test_snapshot_trees_are_the_trees_git_would_build(
    grepo: GitRepo, repo: Path, steps: list[dict[str, bytes | None]]
) -> None:
    ref = f"refs/fabro/meta/order{abs(hash(str(steps))) % 10**9}"
    snap = MetaSnapshotter(grepo, ref)
    files: dict[str, bytes] = {"manifest.json": b"{}"}
    tip = snap.write(dict(files), "init", expected_tip=None).commit_sha
    for step in steps:
        if not _apply(files, step):
            continue
        tip = snap.write(step, "step", expected_tip=tip).commit_sha
        assert grepo.commit_info(tip).tree == (_tree_sha(files) or _EMPTY_TREE)
    # And git finds every tree well-formed (in its order, no duplicates).
    assert_fsck_clean(repo)


_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
