"""Big files of a snapshot: written without extra copies, side by side, and exactly the
objects git itself would write for the same bytes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import git

from fabro_git.store.repo import GitRepo
from fabro_git.store.snapshot import MetaSnapshotter

REF = "refs/fabro/meta/01BIG"


def _git_hash(repo: Path, data: bytes) -> str:
    return (
        subprocess.run(
            ["git", "hash-object", "--stdin"], cwd=repo, input=data, capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )


def _cat(repo: Path, sha: str) -> bytes:
    return subprocess.run(
        ["git", "cat-file", "blob", sha], cwd=repo, capture_output=True, check=True
    ).stdout


def test_store_blob_writes_the_object_git_names_for_those_bytes(grepo: GitRepo, repo: Path) -> None:
    data = b"".join(b"line %d of a big reply\n" % i for i in range(120_000))
    sha = grepo.store_blob(data)
    assert sha == _git_hash(repo, data)
    assert _cat(repo, sha) == data
    assert grepo.store_blob(data) == sha  # already there: found, not rewritten
    assert grepo.store_blob(b"") == _git_hash(repo, b"")


def test_a_snapshot_with_several_big_files_holds_each_of_them_whole(
    grepo: GitRepo, repo: Path
) -> None:
    response = b"".join(b"reply line %d\n" % i for i in range(200_000))  # over 1 MB
    value = b'"' + response.replace(b"\n", b"\\n") + b'"'
    other = bytes(reversed(response))
    files = {
        "nodes/plan/response.md": response,
        "artifacts/plan/response.plan.json": value,
        "artifacts/response.plan.json": value,  # the same object under a second path
        "nodes/plan/other.bin": other,
        "small.json": b"{}",
    }
    result = MetaSnapshotter(grepo, REF).write(files, "big", expected_tip=None)
    for path, data in files.items():
        sha = git(repo, "rev-parse", f"{result.commit_sha}:{path}").strip()
        assert sha == _git_hash(repo, data), path
        assert _cat(repo, sha) == data, path
    proc = subprocess.run(
        ["git", "fsck", "--strict", "--no-dangling"], cwd=repo, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
