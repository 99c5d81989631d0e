"""`git fabro hooks install|uninstall` and the pre-push hook, with real pushes to a
local bare remote: a pushed run branch takes its metadata along, a hook that was there
before keeps its say, and nothing about the hook can fail the user's push."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, bare_remote, git, run_fabro, run_json, write_workflow

WORKFLOW = """
digraph H {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=parallelogram, script="echo made > made.txt"]
    start -> work -> exit
}
"""

FOREIGN = """#!/bin/sh
# the user's own pre-push hook
{ echo "args: $*"; cat; } > "%s"
exit %d
"""


@pytest.fixture
def remote(repo: Path, tmp_path: Path) -> Path:
    bare = bare_remote(tmp_path, "remote.git")
    git(repo, "remote", "add", "origin", str(bare))
    return bare


def make_run(repo: Path) -> str:
    write_workflow(repo, WORKFLOW)
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return str(result["run_id"])


def remote_refs(bare: Path) -> set[str]:
    return set(git(bare, "for-each-ref", "--format=%(refname)").split())


def push(repo: Path, *refs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "push", "origin", *refs], cwd=repo, capture_output=True, text=True, check=False
    )


def hooks(repo: Path, action: str) -> subprocess.CompletedProcess[str]:
    proc = run_fabro("hooks", action, cwd=repo)
    assert "Traceback" not in proc.stderr
    return proc


def test_pushing_a_run_branch_pushes_its_metadata(repo: Path, remote: Path, tmp_path: Path) -> None:
    run_id = make_run(repo)
    # A parallel branch head of the run rides along too.
    git(repo, "update-ref", f"refs/fabro/parallel/{run_id}/fan/0", "HEAD")
    assert hooks(repo, "install").returncode == 0
    proc = push(repo, f"fabro/run/{run_id}")
    assert proc.returncode == 0, proc.stderr
    refs = remote_refs(remote)
    assert f"refs/heads/fabro/run/{run_id}" in refs
    assert f"refs/fabro/meta/{run_id}" in refs
    assert f"refs/fabro/parallel/{run_id}/fan/0" in refs
    assert git(remote, "rev-parse", f"refs/fabro/meta/{run_id}") == git(
        repo, "rev-parse", f"refs/fabro/meta/{run_id}"
    )
    # A clone of that remote can inspect the run.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(remote), str(clone))
    assert run_fabro("fetch", cwd=clone).returncode == 0
    proc = run_fabro("inspect", run_id, "--json", cwd=clone)
    assert proc.returncode == 0, proc.stderr
    assert run_id in proc.stdout


def test_without_the_hook_the_metadata_stays_home(repo: Path, remote: Path) -> None:
    run_id = make_run(repo)
    proc = push(repo, f"fabro/run/{run_id}")
    assert proc.returncode == 0, proc.stderr
    refs = remote_refs(remote)
    assert f"refs/heads/fabro/run/{run_id}" in refs
    assert f"refs/fabro/meta/{run_id}" not in refs


def test_other_branches_push_nothing_extra(repo: Path, remote: Path) -> None:
    run_id = make_run(repo)
    assert hooks(repo, "install").returncode == 0
    proc = push(repo, "main")
    assert proc.returncode == 0, proc.stderr
    assert remote_refs(remote) == {"refs/heads/main"}
    assert f"refs/fabro/meta/{run_id}" not in remote_refs(remote)


def test_a_remote_that_refuses_the_metadata_does_not_fail_the_push(
    repo: Path, remote: Path
) -> None:
    update = remote / "hooks" / "update"
    update.write_text(
        '#!/bin/sh\ncase "$1" in refs/fabro/*) echo "refs/fabro is closed here" >&2; exit 1 ;; esac\nexit 0\n'
    )
    update.chmod(0o755)
    run_id = make_run(repo)
    assert hooks(repo, "install").returncode == 0
    proc = push(repo, f"fabro/run/{run_id}")
    assert proc.returncode == 0, proc.stderr
    refs = remote_refs(remote)
    assert f"refs/heads/fabro/run/{run_id}" in refs
    assert f"refs/fabro/meta/{run_id}" not in refs
    notes = [line for line in proc.stderr.splitlines() if line.startswith("git fabro:")]
    assert len(notes) == 1, proc.stderr
    assert f"metadata of run {run_id} was not pushed" in notes[0]
    assert f"git fabro push origin {run_id}" in notes[0]


def test_a_foreign_hook_that_passes_still_runs(repo: Path, remote: Path, tmp_path: Path) -> None:
    run_id = make_run(repo)
    marker = tmp_path / "foreign-ran"
    hook = repo / ".git" / "hooks" / "pre-push"
    hook.write_text(FOREIGN % (marker, 0))
    hook.chmod(0o755)
    proc = hooks(repo, "install")
    assert proc.returncode == 0
    assert "pre-push.legacy" in proc.stderr
    proc = push(repo, f"fabro/run/{run_id}")
    assert proc.returncode == 0, proc.stderr
    seen = marker.read_text()
    sha = git(repo, "rev-parse", f"fabro/run/{run_id}").strip()
    assert f"args: origin {remote}" in seen
    assert f"refs/heads/fabro/run/{run_id} {sha} refs/heads/fabro/run/{run_id}" in seen
    assert f"refs/fabro/meta/{run_id}" in remote_refs(remote)


def test_a_foreign_hook_veto_still_blocks_the_push(
    repo: Path, remote: Path, tmp_path: Path
) -> None:
    run_id = make_run(repo)
    marker = tmp_path / "foreign-ran"
    hook = repo / ".git" / "hooks" / "pre-push"
    hook.write_text(FOREIGN % (marker, 3))
    hook.chmod(0o755)
    assert hooks(repo, "install").returncode == 0
    proc = push(repo, f"fabro/run/{run_id}")
    assert proc.returncode != 0
    assert marker.exists()
    assert remote_refs(remote) == set()


def test_install_twice_then_uninstall_restores_the_foreign_hook(repo: Path) -> None:
    hooks_dir = repo / ".git" / "hooks"
    hook = hooks_dir / "pre-push"
    original = b"#!/bin/sh\n# mine \xff bytes\nexit 0\n"
    hook.write_bytes(original)
    hook.chmod(0o750)
    assert hooks(repo, "install").returncode == 0
    installed = hook.read_bytes()
    assert b"git-fabro-hook:" in installed
    assert os.access(hook, os.X_OK)
    assert (hooks_dir / "pre-push.legacy").read_bytes() == original
    proc = hooks(repo, "install")
    assert proc.returncode == 0
    assert "already installed" in proc.stderr
    assert hook.read_bytes() == installed
    assert (hooks_dir / "pre-push.legacy").read_bytes() == original
    assert hooks(repo, "uninstall").returncode == 0
    assert hook.read_bytes() == original
    assert stat.S_IMODE(hook.stat().st_mode) == 0o750
    assert not (hooks_dir / "pre-push.legacy").exists()
    # Nothing of ours left: a second uninstall leaves the user's hook alone.
    proc = hooks(repo, "uninstall")
    assert proc.returncode == 0
    assert hook.read_bytes() == original


def test_uninstall_without_a_foreign_hook_removes_ours(repo: Path) -> None:
    assert hooks(repo, "install").returncode == 0
    assert hooks(repo, "uninstall").returncode == 0
    assert not (repo / ".git" / "hooks" / "pre-push").exists()


def test_core_hooks_path_is_refused(repo: Path) -> None:
    git(repo, "config", "core.hooksPath", ".githooks")
    proc = hooks(repo, "install")
    assert proc.returncode == 1
    assert "core.hooksPath is set (.githooks)" in proc.stderr
    assert "hint:" in proc.stderr
    assert not (repo / ".githooks").exists()
    assert not (repo / ".git" / "hooks" / "pre-push").exists()


def test_hooks_install_from_a_linked_worktree_uses_the_shared_hooks_dir(
    repo: Path, tmp_path: Path
) -> None:
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked))
    assert hooks(linked, "install").returncode == 0
    assert b"git-fabro-hook:" in (repo / ".git" / "hooks" / "pre-push").read_bytes()


def test_the_source_tree_hooks_dir_is_the_shipped_script() -> None:
    from fabro_git.cli.hooks import script

    assert (ROOT / "hooks" / "pre-push").read_bytes() == script("pre-push")
    assert script("pre-push").startswith(b"#!/bin/sh\n")


def test_git_fabro_push_of_a_new_run_with_the_hook_installed(
    repo: Path, remote: Path, tmp_path: Path
) -> None:
    # git fabro push names the metadata refs itself: the hook must not race it to them.
    run_id = make_run(repo)
    marker = tmp_path / "foreign-ran"
    hook = repo / ".git" / "hooks" / "pre-push"
    hook.write_text(FOREIGN % (marker, 0))
    hook.chmod(0o755)
    assert hooks(repo, "install").returncode == 0
    proc = run_fabro("push", "origin", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "rejected" not in proc.stderr
    refs = remote_refs(remote)
    assert {f"refs/heads/fabro/run/{run_id}", f"refs/fabro/meta/{run_id}"} <= refs
    assert marker.exists()  # the user's own hook still had its say
