"""A stage may not change the user's repository behind the run: its git config, hooks,
refs outside the run, its remotes (no push unless `allow_push`), nor the run's own refs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import bare_remote, git, pasted, run_fabro, write_workflow


def _workflow(script: str, *, node_attrs: str = "", graph_attrs: str = "") -> str:
    script = script.replace("\\", "\\\\").replace('"', '\\"')
    return (
        "digraph Guard {\n"
        f"  {graph_attrs}\n"
        "  start [shape=Mdiamond]\n"
        "  exit [shape=Msquare]\n"
        f'  s1 [shape=parallelogram, script="{script}"{node_attrs}]\n'
        "  start -> s1 -> exit\n"
        "}\n"
    )


def _run(repo: Path, script: str, **attrs: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    write_workflow(repo, _workflow(script, **attrs))
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, proc.stderr
    return proc, json.loads(lines[-1])


def _stage_error(repo: Path, run_id: str) -> str:
    status = git(repo, "show", f"refs/fabro/meta/{run_id}:nodes/s1/status.json")
    return json.loads(status).get("error") or ""


def test_a_stage_that_sets_an_alias_and_hooks_path_fails_and_both_are_put_back(
    repo: Path, tmp_path: Path
) -> None:
    config_before = (repo / ".git" / "config").read_bytes()
    proc, result = _run(
        repo,
        f"git config alias.st '!touch pwned' && git config core.hooksPath {tmp_path / 'x'}",
    )
    assert result["status"] == "failed", proc.stderr
    error = _stage_error(repo, result["run_id"])
    assert "git config" in error and "alias.st added" in error, error
    assert "core.hooksPath added" in error and "put back" in error, error
    assert git(repo, "config", "--get", "alias.st", check=False) == ""
    assert git(repo, "config", "--get", "core.hooksPath", check=False) == ""
    assert (repo / ".git" / "config").read_bytes() == config_before


def test_a_stage_that_writes_a_hook_fails_and_the_hook_is_removed(repo: Path) -> None:
    proc, result = _run(
        repo,
        'hooks=$(git rev-parse --git-common-dir)/hooks && mkdir -p "$hooks" && '
        'printf "#!/bin/sh\\ntouch pwned\\n" > "$hooks/pre-commit" && chmod +x "$hooks/pre-commit"',
    )
    assert result["status"] == "failed", proc.stderr
    error = _stage_error(repo, result["run_id"])
    assert "hooks: pre-commit added" in error, error
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()


def test_a_stage_that_moves_the_users_branch_fails_and_the_branch_is_put_back(
    repo: Path,
) -> None:
    main_before = git(repo, "rev-parse", "main").strip()
    git(repo, "branch", "topic")
    git(repo, "branch", "gone")
    proc, result = _run(
        repo,
        "git commit -q --allow-empty -m evil && git branch -f topic HEAD && git tag t1 "
        "&& git branch -D gone",
    )
    assert result["status"] == "failed", proc.stderr
    error = _stage_error(repo, result["run_id"])
    assert "refs/heads/topic moved" in error and "refs/tags/t1 created" in error, error
    assert git(repo, "rev-parse", "topic").strip() == main_before
    assert git(repo, "rev-parse", "gone").strip() == main_before
    # A ref the stage made is named, not deleted: it may hold the stage's work.
    assert "git update-ref -d refs/tags/t1" in error, error


def test_a_ref_the_stage_named_to_run_code_is_one_quoted_word_in_the_suggestion(
    repo: Path,
) -> None:
    """A ref name may hold `$(`, `)` and `;`: the stage (an agent) chooses it, so the
    command the message suggests quotes it, and pasted into a shell it runs nothing."""
    hostile = "refs/tags/x;touch${IFS}pwned1;$(touch${IFS}pwned2)"
    proc, result = _run(repo, f"git update-ref '{hostile}' HEAD")
    assert result["status"] == "failed", proc.stderr
    error = _stage_error(repo, result["run_id"])
    suggested = error.split("(left; `", 1)[1].split("`", 1)[0]
    sandbox = repo.parent / "paste"
    sandbox.mkdir()
    assert pasted(suggested, sandbox) == ["update-ref", "-d", hostile], error
    assert list(sandbox.iterdir()) == []


def _bare_remote(repo: Path, tmp_path: Path) -> Path:
    remote = bare_remote(tmp_path, "remote.git", origin_of=repo)
    return remote


def test_a_stage_cannot_push_unless_the_workflow_allows_it(repo: Path, tmp_path: Path) -> None:
    remote = _bare_remote(repo, tmp_path)
    before = git(remote, "rev-parse", "main").strip()
    script = "git commit -q --allow-empty -m pushed && git push --force origin HEAD:main"
    proc, result = _run(repo, script)
    assert result["status"] == "failed", proc.stderr
    assert git(remote, "rev-parse", "main").strip() == before
    stderr_log = git(repo, "show", f"refs/fabro/meta/{result['run_id']}:nodes/s1/stderr.log")
    assert "allow_push" in stderr_log, stderr_log
    # Deleting a branch on the remote is a push too.
    git(repo, "push", "-q", "origin", "main:doomed")
    proc, result = _run(repo, "git push origin :doomed")
    assert result["status"] == "failed", proc.stderr
    assert git(remote, "branch", "--list", "doomed").strip()

    proc, result = _run(repo, script, node_attrs=", allow_push=true")
    assert result["status"] == "succeeded", proc.stderr
    assert git(remote, "rev-parse", "main").strip() != before
    # On the graph, it lets every stage push.
    proc, result = _run(
        repo, "git push -q origin HEAD:refs/heads/out", graph_attrs="allow_push=true"
    )
    assert result["status"] == "succeeded", proc.stderr
    assert git(remote, "branch", "--list", "out").strip()


# -- the run's own refs ------------------------------------------------------------------


def test_a_stage_that_deletes_the_runs_own_refs_sees_them_put_back(repo: Path) -> None:
    proc, result = _run(
        repo,
        'git update-ref -d "refs/fabro/meta/$FABRO_RUN_ID" && '
        'git update-ref -d "refs/heads/fabro/run/$FABRO_RUN_ID" && echo done > out.txt',
    )
    run_id = result["run_id"]
    assert result["status"] == "succeeded", proc.stderr
    checkpoint = json.loads(git(repo, "show", f"refs/fabro/meta/{run_id}:checkpoint.json"))
    assert checkpoint["completed_nodes"][-1] == "exit"
    assert "out.txt" in git(repo, "ls-tree", "--name-only", f"fabro/run/{run_id}").split()
    logs = run_fabro("logs", run_id, cwd=repo).stdout
    assert "put back" in logs and f"refs/fabro/meta/{run_id}" in logs


def test_resume_finds_a_run_whose_meta_ref_is_gone_from_its_scratch(
    repo: Path, hermetic_env: Path
) -> None:
    marker = hermetic_env / "second-time"
    proc, result = _run(repo, f"if [ -f {marker} ]; then echo ok > ok.txt; else exit 3; fi")
    assert result["status"] == "failed", proc.stderr
    run_id = result["run_id"]
    meta = git(repo, "rev-parse", f"refs/fabro/meta/{run_id}").strip()
    git(repo, "update-ref", "-d", f"refs/fabro/meta/{run_id}")
    marker.write_text("")
    resumed = run_fabro("resume", run_id, "--json", cwd=repo)
    assert "Traceback" not in resumed.stderr
    assert f"git update-ref refs/fabro/meta/{run_id} {meta}" in resumed.stderr, resumed.stderr
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["status"] == "succeeded"
    log = git(repo, "log", "--format=%H", f"refs/fabro/meta/{run_id}").split()
    assert meta in log


# Rewrites the repository's config in place, as many bytes as before, and puts its
# modification time back: only the change time tells.
SAME_SIZE_EDIT = """\
import os, subprocess
path = os.path.join(subprocess.check_output(
    ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], text=True).strip(), "config")
st = os.stat(path)
with open(path, "r+b") as out:
    data = out.read()
    out.seek(0)
    out.write(data.replace(b"value-one", b"value-two"))
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
"""


def test_a_config_rewritten_to_its_size_and_time_is_seen_and_put_back(repo: Path) -> None:
    git(repo, "config", "fabro.probe", "value-one")
    (repo / "edit.py").write_text(SAME_SIZE_EDIT)
    git(repo, "add", "edit.py")
    git(repo, "commit", "-q", "-m", "edit")
    proc, result = _run(repo, "python3 edit.py")
    assert result["status"] == "failed", proc.stderr
    error = _stage_error(repo, result["run_id"])
    assert "fabro.probe" in error and "put back" in error, error
    assert git(repo, "config", "--get", "fabro.probe").strip() == "value-one"


def test_a_submodules_config_a_stage_changes_is_put_back(repo: Path, tmp_path: Path) -> None:
    """A submodule's git dir (`.git/modules/<name>`) holds a config and hooks that the
    user's `git status` reads and runs as it recurses: guarded as the repository's own."""
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q", "-b", "main")
    (lib / "lib.txt").write_text("lib\n")
    git(lib, "add", "lib.txt")
    git(lib, "commit", "-q", "-m", "lib")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    git(repo, "commit", "-q", "-m", "a submodule")
    config = repo / ".git" / "modules" / "lib" / "config"
    before = config.read_bytes()
    marker = tmp_path / "fsmonitor-ran"
    script = (
        'git config --file "$(git rev-parse --path-format=absolute --git-common-dir)'
        f'/modules/lib/config" core.fsmonitor "touch {marker}"'
    )
    proc, result = _run(repo, script)
    assert result["status"] == "failed", proc.stderr
    error = _stage_error(repo, result["run_id"])
    assert "submodules' config and hooks: lib/config changed" in error, error
    assert "put back" in error
    assert config.read_bytes() == before
