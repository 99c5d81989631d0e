"""The store flushes what git's own `core.fsync` says git would flush, and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import git

from fabro_git.store.durability import DEFAULT, parse_fsync
from fabro_git.store.repo import GitRepo

# What git 2.39 flushes for each value, seen with strace on `git update-ref` (reference)
# and `git hash-object -w` (loose-object).
GIT_SEEN = [
    (None, set()),
    ("", set()),
    ("committed", {"reference", "loose-object"}),
    ("added", {"reference", "loose-object"}),
    ("all", {"reference", "loose-object"}),
    ("reference", {"reference"}),
    ("objects", {"loose-object"}),
    ("-pack,reference", {"reference"}),
    # Additions win over removals, whatever their order.
    ("committed,-reference", {"reference", "loose-object"}),
    ("bogus,reference", {"reference"}),
]


@pytest.mark.parametrize(("value", "flushed"), GIT_SEEN)
def test_parse_matches_git(value: str | None, flushed: set[str]) -> None:
    assert parse_fsync(value) & {"reference", "loose-object"} == flushed


def test_default_and_none() -> None:
    assert parse_fsync(None) == DEFAULT == {"pack", "pack-metadata", "commit-graph"}
    assert parse_fsync("none") == frozenset()
    assert parse_fsync("none,index") == {"index"}
    assert parse_fsync("added") >= {"index", "reference"}


_SCRIPT = """
import sys
from pathlib import Path
from dulwich.objects import Blob
from fabro_git.store.repo import GitRepo
with GitRepo.discover(Path(sys.argv[1])) as r:
    head = r.read_ref("refs/heads/main") or r.read_ref("refs/heads/master")
    blob = r.store_object(Blob.from_string(sys.argv[2].encode()))
    r.update_ref("refs/fabro/meta/t", head, old=None, message="create")
    print("FSYNC-MARK", flush=True)
"""


def _fsyncs(repo: Path, tag: str) -> int:
    """fsync calls our process makes for one object write and one ref creation."""
    trace = ["strace", "-f", "-e", "trace=fsync,fdatasync"]
    proc = subprocess.run(
        [*trace, sys.executable, "-c", _SCRIPT, str(repo), tag],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "FSYNC-MARK" in proc.stdout
    return sum(1 for line in proc.stderr.splitlines() if "fsync(" in line)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0), ("reference", 1), ("loose-object", 1), ("committed", 2)],
)
def test_store_flushes_what_git_would(repo: Path, value: str | None, expected: int) -> None:
    if value is not None:
        git(repo, "config", "core.fsync", value)
    assert _fsyncs(repo, f"blob for {value}") == expected
    with GitRepo.discover(repo) as r:
        assert r.read_ref("refs/fabro/meta/t") == git(repo, "rev-parse", "HEAD").strip()
    log = git(repo, "reflog", "show", "--format=%gs", "refs/fabro/meta/t")
    assert log.strip() == "create"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_legacy_fsync_object_files(repo: Path) -> None:
    git(repo, "config", "core.fsyncObjectFiles", "true")
    assert _fsyncs(repo, "legacy") == 1
