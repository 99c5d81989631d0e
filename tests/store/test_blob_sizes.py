"""An object's size read from its header, as `git cat-file -s` gives it, wherever git
keeps the object: a loose file, a pack entry, a delta on a base named by its offset or
by its id. A blob read whole is refused by it, before a byte is inflated."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import git, loosen_packs

from fabro_git.errors import BlobTooLarge
from fabro_git.store import blobs
from fabro_git.store.repo import GitRepo

NO_BASE = "0" * 40


def _cat(repo: Path, sha: str) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "blob", sha], cwd=repo, capture_output=True, check=True
    ).stdout


def _versions(repo: Path) -> None:
    """Thirty commits of a growing file (one `git fast-import`): a pack holds most of
    them as deltas, the early ones on a later, bigger one."""
    stream = []
    for version in range(30):
        lines = "".join(f"line {n}\n" for n in range(200 + 300 * version))
        data = f"{lines}version {version}\n".encode()
        stream += [
            b"commit refs/heads/main\n",
            b"committer T <t@example.com> 1700000000 +0000\n",
            b"data 1\nv\n",
            *([b"from refs/heads/main^0\n"] if version == 0 else []),
            b"M 100644 inline grows.txt\n",
            b"data %d\n%s\n" % (len(data), data),
        ]
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=b"".join(stream), check=True)


@pytest.mark.parametrize("kept", ["loose", "ofs-delta", "ref-delta"])
def test_sizes_from_headers_are_the_sizes_git_gives(repo: Path, kept: str) -> None:
    _versions(repo)
    if kept == "loose":
        loosen_packs(repo)
        assert not list((repo / ".git" / "objects" / "pack").glob("*.pack"))
    else:
        offsets = "true" if kept == "ofs-delta" else "false"
        git(repo, "-c", f"repack.useDeltaBaseOffset={offsets}", "repack", "-adfq", "--window=50")
    listing = git(
        repo,
        "cat-file",
        "--batch-all-objects",
        "--batch-check=%(objectname) %(objecttype) %(objectsize) %(deltabase)",
    ).split("\n")
    objects = [line.split() for line in listing if line]
    chained = [name for name, _, _, base in objects if base != NO_BASE]
    assert (len(chained) > 20) == (kept != "loose")
    kept_as_deltas = 0  # blobs whose chain, not their size, is over the limit
    with GitRepo.discover(repo) as grepo:
        store = grepo._repo.object_store
        for name, kind, size, _ in objects:
            found = blobs.object_size(grepo.objects.objects_dir, lambda: store.packs, name)
            assert found is not None and found.size == int(size), (name, kind, found)
            # A delta's chain counts its base and every delta on the way.
            assert (found.inflated > found.size) == (name in chained)
            if kind == "blob":
                # Up to the byte; a delta's chain may inflate to a few times more.
                limit = max(int(size), -(-found.inflated // blobs.CHAIN_FACTOR))
                assert grepo.read_blob(name, limit=limit) == _cat(repo, name)
                with pytest.raises(BlobTooLarge, match=f"grows.txt .* is {int(size):,} bytes:"):
                    grepo.read_blob(name, limit=int(size) - 1, path="grows.txt")
                if limit > int(size):  # an early version, kept as deltas on a later one
                    kept_as_deltas += 1
                    with pytest.raises(BlobTooLarge, match="kept as deltas that inflate"):
                        grepo.read_blob(name, limit=int(size))
    assert (kept_as_deltas > 0) == (kept != "loose")
