"""Paths built from run data stay inside their destination, whatever the names say.

Random entry names (`..`, absolute paths, NUL, names too long, unicode, `.git` in any
spelling, mixtures) are written through the real writers, into a destination that holds
random symlinks (leading inside it and out); afterwards nothing outside the destination
has changed, and the only error is a refusal the user can read (a `FabroError`).

The destination, and the directory its symlinks lead out to, sit deeper inside the
test's own directory than any generated path can climb, and an absolute name always
points into that outside directory: run against a writer with no confinement, the test finds the file
it wrote outside instead of writing over the machine's own files.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fabro_git.errors import FabroError
from fabro_git.outputs.artifacts import ArtifactStore

MAX_PARTS = 6
DEPTH = MAX_PARTS + 2  # directories above the destination, inside the test's own

_SPECIAL = st.sampled_from(
    [
        "..",
        ".",
        "",
        ".git",
        ".GIT",
        ".Git. ",
        ".g\u200cit",
        "git~1",
        "a",
        "b",
        "link_in",
        "link_out",
        "file_out",
        "x" * 300,
        "é" * 200,
        "nul\0byte",
        "\udcff",
    ]
)
_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="/", blacklist_categories=("Cs",)), max_size=12
)
_PARTS = st.lists(st.one_of(_SPECIAL, _TEXT), min_size=1, max_size=MAX_PARTS)
# Symlinks made in the destination before the write: where, and whether they lead out.
_LINKS = st.lists(
    st.tuples(
        st.sampled_from(["link_in", "link_out", "file_out", "a/link_out", "a"]), st.booleans()
    ),
    max_size=4,
)


def _snapshot(base: Path, dest: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry under `base` outside `dest`: its kind and its bytes (or link target)."""
    seen: dict[str, tuple[str, bytes]] = {}
    for directory, dirs, files in os.walk(base):
        here = Path(directory)
        if here == dest or dest in here.parents:
            dirs[:] = []
            continue
        for name in dirs + files:
            path = here / name
            if path == dest:
                continue
            rel = str(path.relative_to(base))
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path).encode())
            elif path.is_dir():
                seen[rel] = ("dir", b"")
            else:
                seen[rel] = ("file", path.read_bytes())
    return seen


def _git_named(dest: Path) -> list[Path]:
    return [
        Path(d) / n
        for d, dirs, files in os.walk(dest)
        for n in dirs + files
        if n.casefold().rstrip(". ") == ".git"
    ]


def _check_write(
    parts: list[str],
    absolute: bool,
    links: list[tuple[str, bool]],
    write: Callable[[Path, str, bytes], None],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        outside = base.joinpath(*(f"o{i}" for i in range(DEPTH)), "outside")
        outside.mkdir(parents=True)
        (outside / "file_out.json").write_bytes(b"theirs")
        dest = base.joinpath(*(f"d{i}" for i in range(DEPTH)), "dest")
        (dest / "inside").mkdir(parents=True)
        for name, leads_out in links:
            link = dest / name
            if link.exists() or link.is_symlink():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            if name == "file_out":
                target = outside / "file_out.json" if leads_out else dest / "inside" / "f.json"
            else:
                target = outside if leads_out else dest / "inside"
            link.symlink_to(target)
        relpath = "/".join(parts)
        if absolute:
            relpath = f"{outside}/{relpath}"
        before = _snapshot(base, dest)
        try:
            write(dest, relpath, b'"ours"')
        except FabroError as err:
            assert "Traceback" not in str(err)
        assert _snapshot(base, dest) == before, relpath
        assert _git_named(dest) == [], relpath


def _via_artifact_store(dest: Path, relpath: str, data: bytes) -> None:
    """As resume restores a meta ref's `artifacts/` tree: the store is the destination."""
    store = ArtifactStore(dest.parent)
    store.root = dest
    store.materialise({relpath.removesuffix(".json"): data})


def _via_write_confined(dest: Path, relpath: str, data: bytes) -> None:
    from fabro_git.confine import write_confined

    write_confined(dest, relpath, data)


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(parts=_PARTS, absolute=st.booleans(), links=_LINKS)
@example(parts=["..", "..", "outside", "x"], absolute=False, links=[])
@example(parts=["link_out", "x"], absolute=False, links=[("link_out", True)])
@example(parts=["file_out"], absolute=False, links=[("file_out", True)])
@example(parts=[".git", "hooks", "pre-commit"], absolute=False, links=[])
@example(parts=["x"], absolute=True, links=[])
def test_restoring_artifacts_writes_nothing_outside(
    parts: list[str], absolute: bool, links: list[tuple[str, bool]]
) -> None:
    _check_write(parts, absolute, links, _via_artifact_store)


@_SETTINGS
@given(parts=_PARTS, absolute=st.booleans(), links=_LINKS)
@example(parts=["..", "x"], absolute=False, links=[])
@example(parts=["a", "link_out", "x"], absolute=False, links=[("a/link_out", True)])
@example(parts=["file_out.json"], absolute=False, links=[("file_out", True)])
@example(parts=[".GIT", "config"], absolute=False, links=[])
def test_confined_writes_land_inside_or_are_refused(
    parts: list[str], absolute: bool, links: list[tuple[str, bool]]
) -> None:
    _check_write(parts, absolute, links, _via_write_confined)


@pytest.mark.parametrize(
    ("relpath", "reason"),
    [
        ("../x", "`..`"),
        ("/etc/x", "absolute"),
        ("a//b", "empty component"),
        ("a/./b", "`.` component"),
        ("a\0b", "NUL"),
        (".git/config", "`.git`"),
        ("sub/.GiT/hooks/x", "`.git`"),
        ("x" * 256, "256 bytes"),
        ("", "empty"),
    ],
)
def test_a_refusal_names_the_entry_and_why(relpath: str, reason: str) -> None:
    from fabro_git.confine import UnsafeEntry, checked_parts

    with pytest.raises(UnsafeEntry) as caught:
        checked_parts(relpath)
    message = str(caught.value.for_run("01RUN"))
    assert message.startswith("run 01RUN: refusing to write ")
    assert repr(relpath) in message and reason in message


def test_plain_names_and_symlink_free_directories_are_written(tmp_path: Path) -> None:
    from fabro_git.confine import write_confined

    (tmp_path / "dest" / "dir").mkdir(parents=True)
    path = write_confined(tmp_path / "dest", "dir/sub/naïve name.json", b"1")
    assert path.read_bytes() == b"1"
    streamed = write_confined(tmp_path / "dest", "dir/sub/s", lambda out: out.write(b"2"))
    assert streamed.read_bytes() == b"2"
    private = write_confined(tmp_path / "scratch", "v/k.json", b"3", private=True)
    assert private.stat().st_mode & 0o777 == 0o600
    assert private.parent.stat().st_mode & 0o777 == 0o700
