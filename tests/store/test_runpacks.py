"""The packs runs leave are merged across runs as they pile up, so a repository that
has seen many runs holds a few packs of them, not one a run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import assert_fsck_clean, git, run_fabro, write_workflow

from fabro_git.store.repo import GitRepo


def _packs(repo: Path) -> list[str]:
    return sorted(p[:-5] for p in os.listdir(repo / ".git/objects/pack") if p.endswith(".pack"))


def _listed(repo: Path) -> list[str]:
    return sorted((repo / ".git/fabro/run-packs").read_text().splitlines())


def _a_run(grepo: GitRepo, tag: str) -> list[str]:
    """What a run's end does: its objects into one pack, listed among the runs'."""
    with grepo.objects.batch():
        blob = grepo.store_blob(f"run {tag}\n".encode())
        tree = grepo.store_raw(b"tree", b"100644 f\0" + bytes.fromhex(blob))
        commit = grepo.write_commit(tree=tree, parents=[], message=f"run {tag}")
    grepo.consolidate_packs()
    return [blob, tree, commit]


def test_eight_runs_packs_become_one_git_reads_whole(repo: Path, grepo: GitRepo) -> None:
    written = [sha for i in range(7) for sha in _a_run(grepo, str(i))]
    assert len(_packs(repo)) == 7 and all(line.startswith("0 ") for line in _listed(repo))
    written += _a_run(grepo, "7")
    [merged] = _packs(repo)
    assert _listed(repo) == [f"1 {merged}"]
    written += _a_run(grepo, "8")
    assert len(_packs(repo)) == 2 and len(_listed(repo)) == 2
    for sha in written:
        git(repo, "cat-file", "-e", sha)
    idx = repo / ".git/objects/pack" / f"{merged}.idx"
    assert git(repo, "verify-pack", str(idx)) == ""
    assert sorted(os.listdir(repo / ".git/objects/pack")) == sorted(
        f"{name}{ext}" for name in _packs(repo) for ext in (".idx", ".pack")
    )
    assert_fsck_clean(repo)


def test_a_listed_pack_git_took_away_is_dropped(repo: Path, grepo: GitRepo) -> None:
    _a_run(grepo, "a")
    [taken] = _packs(repo)
    git(repo, "gc", "-q")  # folds it into git's own pack
    assert taken not in _packs(repo)
    _a_run(grepo, "b")
    assert taken not in "".join(_listed(repo)) and len(_listed(repo)) == 1


def test_a_pack_with_deltas_is_never_copied_by_a_merge(repo: Path, grepo: GitRepo) -> None:
    """A delta names its base by where it lies in its pack: a copy would be wrong. A
    full class holding such a pack (git's own, listed by mistake) is left as it is."""
    for i in range(3):
        (repo / "big.txt").write_text("".join(f"line {n} {i}\n" for n in range(2000)))
        git(repo, "add", "big.txt")
        git(repo, "commit", "-q", "-m", f"big {i}")
    git(repo, "repack", "-adq")
    [gits] = _packs(repo)
    assert "chain length = 1" in git(repo, "verify-pack", "-v", f".git/objects/pack/{gits}.idx")
    (repo / ".git/fabro").mkdir()
    (repo / ".git/fabro/run-packs").write_text(f"0 {gits}\n")
    for i in range(7):
        _a_run(grepo, str(i))
    assert len(_packs(repo)) == 8 and gits in _packs(repo)
    assert f"0 {gits}" in _listed(repo)
    assert_fsck_clean(repo)


def test_a_list_that_names_no_pack_is_not_followed(repo: Path, grepo: GitRepo) -> None:
    (repo / ".git/fabro").mkdir()
    (repo / ".git/fabro/run-packs").write_text("0 ../../config\n0 pack-zz\nx pack-1\n")
    _a_run(grepo, "a")
    [pack] = _packs(repo)
    assert _listed(repo) == [f"0 {pack}"]
    assert (repo / ".git/config").is_file()


def test_runs_of_the_real_command_leave_few_packs(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph P { start [shape=Mdiamond]; exit [shape=Msquare];\n"
        '  s [shape=parallelogram, script="date +%N > out.txt"]; start -> s -> exit }\n',
    )
    for _ in range(9):
        proc = run_fabro("run", "wf.fabro", cwd=repo)
        assert proc.returncode == 0, proc.stderr
    assert len(_packs(repo)) == 2  # eight runs' packs in one, and the ninth's
    count = subprocess.run(
        ["git", "count-objects", "-v"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert "packs: 2" in count
    assert_fsck_clean(repo)


def test_a_pack_whose_index_does_not_check_out_is_never_merged(repo: Path, grepo: GitRepo) -> None:
    """What the index says (where each object is, its CRC-32) is checked before a copy:
    an index changed on disk leaves its class unmerged rather than a bad pack made."""
    for i in range(7):
        _a_run(grepo, str(i))
    first = repo / ".git/objects/pack" / f"{_packs(repo)[0]}.idx"
    data = bytearray(first.read_bytes())
    data[8 + 256 * 4 + 20 * 1] ^= 0xFF  # an object id's first byte
    first.chmod(0o644)
    first.write_bytes(bytes(data))
    _a_run(grepo, "7")
    assert len(_packs(repo)) == 8
