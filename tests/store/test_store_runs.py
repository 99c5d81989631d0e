"""Run ids, ref names, prefix resolution, and moving run refs through a remote."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from helpers import bare_remote, git

from fabro_git.errors import AmbiguousRunId, RunNotFound, StoreError
from fabro_git.store import remote as rm
from fabro_git.store import runs
from fabro_git.store.repo import GitRepo
from fabro_git.store.snapshot import MetaSnapshotter

ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")


def make_run(grepo: GitRepo, run_id: str, *, parallel: bool = False) -> None:
    """A run as the engine leaves it: meta history, run branch, maybe parallel refs."""
    base = grepo.require_base().sha
    assert base is not None
    MetaSnapshotter(grepo, runs.meta_ref(run_id)).write(
        {"manifest.json": f'{{"run_id": "{run_id}"}}'.encode()}, "init", expected_tip=None
    )
    grepo.update_ref(runs.run_branch_ref(run_id), base, old=None, message="fabro: start")
    if parallel:
        for i in range(2):
            grepo.update_ref(
                runs.parallel_ref(run_id, "fan", i), base, old=None, message="fabro: branch"
            )


# -- ids and names -------------------------------------------------------------------


def test_ulid_shape_and_monotonic_order() -> None:
    ids = [runs.new_ulid() for _ in range(2000)]
    assert all(ULID_RE.match(i) for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_ulid_encodes_the_current_time() -> None:
    before = time.time_ns() // 1_000_000
    rid = runs.new_ulid()
    after = time.time_ns() // 1_000_000
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    ms = 0
    for ch in rid[:10]:
        ms = ms * 32 + alphabet.index(ch)
    assert before <= ms <= after


def test_ref_names(grepo: GitRepo, repo: Path) -> None:
    rid = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    assert runs.run_branch_name(rid) == f"fabro/run/{rid}"
    assert runs.run_branch_ref(rid) == f"refs/heads/fabro/run/{rid}"
    assert runs.meta_ref(rid) == f"refs/fabro/meta/{rid}"
    assert runs.parallel_ref(rid, "fan", 2) == f"refs/fabro/parallel/{rid}/fan/2"
    # All of them can exist together (no ref is a directory of another).
    make_run(grepo, rid, parallel=True)
    names = git(repo, "for-each-ref", "--format=%(refname)").split()
    assert runs.parallel_ref(rid, "fan", 1) in names
    assert runs.meta_ref(rid) in names and runs.run_branch_ref(rid) in names
    assert git(repo, "log", "--glob=fabro/meta", "--format=%s") == "init\n"


def test_list_run_ids(grepo: GitRepo) -> None:
    assert runs.list_run_ids(grepo) == []
    make_run(grepo, "01B0000000000000000000000B")
    make_run(grepo, "01A0000000000000000000000A")
    assert runs.list_run_ids(grepo) == ["01A0000000000000000000000A", "01B0000000000000000000000B"]


def test_resolve_prefix_locally(grepo: GitRepo) -> None:
    make_run(grepo, "01HAAAAAAAAAAAAAAAAAAAAAAA")
    make_run(grepo, "01HAB00000000000000000000B")
    make_run(grepo, "01JZ000000000000000000000C")
    assert runs.resolve_run_id(grepo, "01J") == "01JZ000000000000000000000C"
    assert runs.resolve_run_id(grepo, "01haa") == "01HAAAAAAAAAAAAAAAAAAAAAAA"
    assert runs.resolve_run_id(grepo, "01JZ000000000000000000000C") == "01JZ000000000000000000000C"
    assert runs.resolve_run_id(grepo, "fabro/run/01HAB") == "01HAB00000000000000000000B"
    with pytest.raises(AmbiguousRunId) as info:
        runs.resolve_run_id(grepo, "01H")
    message = str(info.value)
    assert "01HAAAAAAAAAAAAAAAAAAAAAAA" in message and "01HAB00000000000000000000B" in message
    assert "01JZ" not in message
    with pytest.raises(RunNotFound) as missing:
        runs.resolve_run_id(grepo, "01K")
    assert "git fabro fetch" in str(missing.value)
    with pytest.raises(RunNotFound):
        runs.resolve_run_id(grepo, "  ")


# -- remotes -------------------------------------------------------------------------


@pytest.fixture
def origin(repo: Path, tmp_path: Path) -> Path:
    bare = bare_remote(tmp_path, origin_of=repo)
    return bare


def test_push_then_resolve_in_a_fresh_clone(
    grepo: GitRepo, repo: Path, origin: Path, tmp_path: Path
) -> None:
    rid, other = "01PUSHED00000000000000000A", "01OTHER000000000000000000B"
    make_run(grepo, rid, parallel=True)
    make_run(grepo, other)
    refs = [
        runs.meta_ref(rid),
        runs.run_branch_ref(rid),
        runs.parallel_ref(rid, "fan", 0),
        runs.parallel_ref(rid, "fan", 1),
        runs.meta_ref(other),
        runs.run_branch_ref(other),
    ]
    results = rm.push(grepo, "origin", refs).refs
    assert [(r, ok) for r, ok, _ in results] == [(r, True) for r in refs]
    assert rm.ls_remote(grepo, "origin", ["refs/fabro/meta/*"]) == {
        runs.meta_ref(rid): grepo.read_ref(runs.meta_ref(rid)),
        runs.meta_ref(other): grepo.read_ref(runs.meta_ref(other)),
    }

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    with GitRepo.discover(clone) as cloned:
        assert runs.list_run_ids(cloned) == []  # clone copies refs/heads/* only
        assert cloned.read_ref(runs.meta_ref(rid)) is None
        assert runs.resolve_run_id(cloned, "01pu") == rid
        assert cloned.read_ref(runs.meta_ref(rid)) == grepo.read_ref(runs.meta_ref(rid))
        assert cloned.read_ref(runs.run_branch_ref(rid)) == grepo.read_ref(runs.run_branch_ref(rid))
        assert cloned.read_ref(runs.parallel_ref(rid, "fan", 1)) == grepo.read_ref(
            runs.parallel_ref(rid, "fan", 1)
        )
        assert (
            cloned.read_file(runs.meta_ref(rid), "manifest.json")
            == f'{{"run_id": "{rid}"}}'.encode()
        )
        # Only that run came over.
        assert cloned.read_ref(runs.meta_ref(other)) is None
        assert runs.list_run_ids(cloned) == [rid]
        # Now it is local, and remote=None works.
        assert runs.resolve_run_id(cloned, rid[:6], remote=None) == rid
        with pytest.raises(RunNotFound):
            runs.resolve_run_id(cloned, "01OTHER", remote=None)
        # A local match wins; the remote is consulted only when nothing matches here.
        assert runs.resolve_run_id(cloned, "01") == rid
    assert git(clone, "fsck", "--strict", "--no-dangling") == ""


def test_ambiguous_on_remote(grepo: GitRepo, repo: Path, origin: Path, tmp_path: Path) -> None:
    make_run(grepo, "01SAME0000000000000000000A")
    make_run(grepo, "01SAME0000000000000000000B")
    rm.push(
        grepo,
        "origin",
        [runs.meta_ref("01SAME0000000000000000000A"), runs.meta_ref("01SAME0000000000000000000B")],
    )
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    with GitRepo.discover(clone) as cloned:
        with pytest.raises(AmbiguousRunId) as info:
            runs.resolve_run_id(cloned, "01same")
        assert "on origin" in str(info.value)
        with pytest.raises(RunNotFound) as missing:
            runs.resolve_run_id(cloned, "01NOPE")
        assert "origin" in str(missing.value)
        assert runs.list_run_ids(cloned) == []


def test_push_is_never_forced(grepo: GitRepo, repo: Path, origin: Path) -> None:
    rid = "01DIVERGED0000000000000000"
    make_run(grepo, rid)
    meta = runs.meta_ref(rid)
    assert rm.push(grepo, "origin", [meta]).refs[0][1] is True
    # Rewrite the local history so the remote's tip is no longer an ancestor.
    tip = grepo.read_ref(meta)
    assert tip is not None
    rewritten = MetaSnapshotter(grepo, "refs/fabro/meta/tmp").write(
        {"x": b"y"}, "other", expected_tip=None
    )
    grepo.update_ref(meta, rewritten.commit_sha, old=tip, message="test: rewrite")
    branch = runs.run_branch_ref(rid)
    results = dict((r, (ok, msg)) for r, ok, msg in rm.push(grepo, "origin", [meta, branch]).refs)
    assert results[meta][0] is False
    assert (
        "rejected" in results[meta][1]
        or "fetch first" in results[meta][1]
        or "non-fast-forward" in results[meta][1]
    )
    assert results[branch][0] is True
    assert git(origin, "rev-parse", meta).strip() == tip
    # Pushing an unchanged ref is fine.
    assert rm.push(grepo, "origin", [branch]).refs[0][1] is True


def test_remote_failures_are_store_errors(grepo: GitRepo, repo: Path, tmp_path: Path) -> None:
    git(repo, "remote", "add", "gone", str(tmp_path / "does-not-exist.git"))
    with pytest.raises(StoreError) as info:
        rm.fetch(grepo, "gone", ["refs/fabro/meta/*:refs/fabro/meta/*"])
    assert "does-not-exist" in str(info.value)
    with pytest.raises(StoreError):
        rm.push(grepo, "gone", [runs.meta_ref("01X")])
    with pytest.raises(StoreError):
        rm.ls_remote(grepo, "gone", ["refs/fabro/meta/*"])
    with pytest.raises(RunNotFound) as missing:
        runs.resolve_run_id(grepo, "01X", remote="gone")
    assert "could not be listed" in str(missing.value)


def test_fetch_all_meta_refs(grepo: GitRepo, repo: Path, origin: Path, tmp_path: Path) -> None:
    make_run(grepo, "01FETCHALL0000000000000000")
    rm.push(grepo, "origin", [runs.meta_ref("01FETCHALL0000000000000000")])
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    with GitRepo.discover(clone) as cloned:
        rm.fetch(cloned, "origin", ["refs/fabro/meta/*:refs/fabro/meta/*"])
        assert runs.list_run_ids(cloned) == ["01FETCHALL0000000000000000"]
