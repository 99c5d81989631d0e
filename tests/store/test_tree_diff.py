"""The in-process diff of a checkpoint walks only the subtrees that changed, and says
what dulwich's whole-tree diff says, file for file."""

from __future__ import annotations

import io
import shutil
import subprocess
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


def _path_bytes(file_diff: str) -> bytes:
    """The path a file's diff is of, from its `diff --git a/P b/P` line."""
    header = file_diff.split("\n", 1)[0].removeprefix("diff --git a/")
    return header[: (len(header) - 3) // 2].encode("utf-8", "surrogateescape")


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
        # The same file diffs; ours come in git's path order ("d.x" before "d/a": the
        # order of the whole paths' bytes).
        theirs = _files(expected.getvalue().decode())
        assert _files(ours) == sorted(theirs, key=_path_bytes)
        grepo.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# File contents a diff meets: several lines, a last line with no newline, an empty
# file, a binary one (a NUL early on).
LINES = st.lists(st.sampled_from([b"x\n", b"y\n", b"zz\n", b"\n", b"tail"]), max_size=12)
CONTENTS = st.one_of(
    LINES.map(lambda lines: b"".join(line for line in lines if line != b"tail")),
    LINES.map(lambda lines: b"".join(lines)),
    st.just(b""),
    st.just(b"bin\0ary\n"),
)
MODES = st.sampled_from([0o100644, 0o100755, 0o120000])


@settings(max_examples=200, deadline=None)
@given(old=CONTENTS, new=CONTENTS, old_mode=MODES, new_mode=MODES, kind=st.integers(0, 2))
def test_one_files_diff_is_written_as_dulwich_writes_it(
    old: bytes, new: bytes, old_mode: int, new_mode: int, kind: int
) -> None:
    """`file_diff` writes what `dulwich.patch.write_object_diff` did before it: the
    header, modes and ids, the binary notice, the hunks."""
    from dulwich.objects import Blob
    from dulwich.patch import write_object_diff

    from fabro_git.store.tree_diff import file_diff

    blobs = {b.id: b for b in (Blob.from_string(old), Blob.from_string(new))}
    old_side = (b"p/f.txt", old_mode, Blob.from_string(old).id)
    new_side = (b"p/f.txt", new_mode, Blob.from_string(new).id)
    if kind == 1:  # added
        old_side = (None, None, None)
    elif kind == 2:  # deleted
        new_side = (None, None, None)
    expected = io.BytesIO()
    write_object_diff(expected, blobs, old_side, new_side)  # type: ignore[arg-type]
    ours = b"".join(file_diff(old_side, new_side, lambda sha: blobs[sha].data))
    assert ours == expected.getvalue()


def test_a_carriage_return_is_part_of_its_line_as_in_git(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    old = _tree(tmp_path, {"f": b"a\rb\n1\n"})
    new = _tree(tmp_path, {"f": b"a\rc\n1\n"})
    with GitRepo.discover(tmp_path) as grepo:
        ours = grepo.small_tree_diff(old, new, max_bytes=1_000_000)
    assert ours is not None
    theirs = subprocess.run(
        ["git", "diff", "--no-color", old, new], cwd=tmp_path, capture_output=True, check=True
    ).stdout.decode()
    assert ours.split("@@", 1)[1] == theirs.split("@@", 1)[1]
    assert "-a\rb\n+a\rc\n 1\n" in ours
