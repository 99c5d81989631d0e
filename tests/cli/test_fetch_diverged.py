"""`git fabro fetch` takes every run that fast-forwards; a run one of whose refs the
remote would rewrite is kept as it is, named, and the fetch exits 1."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import assert_fsck_clean, bare_remote, git, run_fabro


def _run(repo: Path) -> str:
    proc = run_fabro("run", "hello", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout.splitlines()[-1])["run_id"])


def _ref(repo: Path, name: str) -> str:
    return git(repo, "rev-parse", name).strip()


def _elsewhere(repo: Path, ref: str) -> str:
    """Point `ref` at a commit of the same tree that nothing else has: a diverged copy."""
    stray = git(repo, "commit-tree", "-m", "elsewhere", f"{ref}^{{tree}}").strip()
    git(repo, "update-ref", ref, stray)
    return stray


def test_fetch_keeps_the_diverged_runs_and_takes_the_others(repo: Path, tmp_path: Path) -> None:
    origin = bare_remote(tmp_path, origin_of=repo)
    diverged_meta, diverged_branch = _run(repo), _run(repo)
    assert run_fabro("push", "origin", cwd=repo).returncode == 0
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    assert run_fabro("fetch", cwd=clone).returncode == 0

    # Here, one run's meta ref and another's branch move where the origin never was...
    meta = f"refs/fabro/meta/{diverged_meta}"
    branch = f"refs/heads/fabro/run/{diverged_branch}"
    stray_meta, stray_branch = _elsewhere(clone, meta), _elsewhere(clone, branch)
    # ...while on the origin the first run's branch moves on and a new run arrives.
    first_branch = f"refs/heads/fabro/run/{diverged_meta}"
    ours_first_branch = _ref(clone, first_branch)
    moved = git(repo, "commit-tree", "-p", first_branch, "-m", "on", f"{first_branch}^{{tree}}")
    git(repo, "push", "-q", "origin", f"{moved.strip()}:{first_branch}")
    new = _run(repo)
    assert run_fabro("push", "origin", new, cwd=repo).returncode == 0

    fetched = run_fabro("fetch", cwd=clone)
    assert fetched.returncode == 1, fetched.stderr
    assert "1 run new" in fetched.stderr and _ref(clone, f"refs/fabro/meta/{new}")
    assert f"kept local {meta} (" in fetched.stderr
    assert f"kept local fabro/run/{diverged_branch} (" in fetched.stderr
    assert "not a fast-forward" in fetched.stderr and "git fabro rm" in fetched.stderr
    # A kept run is kept whole: its branch did not move on either.
    assert _ref(clone, meta) == stray_meta
    assert _ref(clone, first_branch) == ours_first_branch
    assert _ref(clone, branch) == stray_branch
    assert git(clone, "for-each-ref", "refs/fabro-incoming/") == ""

    one = run_fabro("fetch", "origin", diverged_meta[:12], cwd=clone)
    assert one.returncode == 1 and f"kept local {meta} (" in one.stderr, one.stderr
    assert _ref(clone, meta) == stray_meta
    assert_fsck_clean(clone)
