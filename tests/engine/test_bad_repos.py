"""Places a run cannot start, and inputs that cannot be used: each ends with exit 1 and
a message that names the problem and what to do, never a traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import bare_remote, git, run_fabro


def _fails(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert proc.stderr.startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in:\n{proc.stderr}"
    assert "crash log" not in proc.stderr
    return proc.stderr


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-repo"
    path.mkdir()
    return path


def _ceiling(path: Path) -> dict[str, str]:
    # Never let discovery wander above the test's directory into some enclosing repo.
    return {"GIT_CEILING_DIRECTORIES": str(path.parent)}


@pytest.mark.parametrize(
    "command", [["run", "hello"], ["ps"], ["logs", "01ABC"], ["resume", "01ABC"], ["fetch"]]
)
def test_outside_any_repository(outside: Path, command: list[str]) -> None:
    proc = run_fabro(*command, cwd=outside, env=_ceiling(outside))
    _fails(proc, f"{outside} is not inside a git repository", "git init")


@pytest.mark.parametrize("command", [["run", "hello"], ["ps"]])
def test_in_a_bare_repository(tmp_path: Path, command: list[str]) -> None:
    bare = bare_remote(tmp_path, "bare.git")
    proc = run_fabro(*command, cwd=bare, env=_ceiling(bare))
    _fails(proc, f"{bare} is a bare repository", "working tree", "hint: clone it")


def test_inside_the_git_directory(repo: Path) -> None:
    _fails(
        run_fabro("run", "hello", cwd=repo / ".git"), "inside the git directory", "hint: cd into"
    )


def test_repository_without_commits(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    git(tmp_path, "init", "-q", str(empty))
    proc = run_fabro("run", "hello", cwd=empty)
    _fails(proc, f"the repository at {empty} has no commits yet", "git commit --allow-empty")
    # Nothing was created: no refs, no scratch dir.
    assert git(empty, "for-each-ref") == ""
    # Listing runs needs no commit: there are none, and that is not an error.
    ps = run_fabro("ps", cwd=empty)
    assert ps.returncode == 0 and "no runs in this repository" in ps.stderr


def test_detached_head(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    sha = git(repo, "rev-parse", "HEAD").strip()
    proc = run_fabro("run", "hello", cwd=repo)
    _fails(proc, f"HEAD is detached at {sha[:12]}", "git switch")
    assert git(repo, "for-each-ref", "refs/fabro", "refs/heads/fabro") == ""
    ps = run_fabro("ps", cwd=repo)
    assert ps.returncode == 0, ps.stderr


def test_sha256_repository_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s256"
    git(tmp_path, "init", "-q", "--object-format=sha256", str(path))
    git(path, "commit", "-q", "--allow-empty", "-m", "initial")
    _fails(run_fabro("run", "hello", cwd=path), "sha256")


# -- workflow files --------------------------------------------------------------------


def test_malformed_workflow_names_file_line_and_column(repo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.fabro"
    bad.write_text(
        "digraph X {\n  start [shape=Mdiamond]\n  start -> ;\n  exit [shape=Msquare]\n}\n"
    )
    err = _fails(run_fabro("run", str(bad), cwd=repo))
    assert err.startswith(f"error: {bad}:3:12: "), err
    assert "'->'" in err
    assert git(repo, "for-each-ref", "refs/fabro") == ""


def test_unterminated_string_names_where_it_started(repo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "quote.fabro"
    bad.write_text('digraph X {\n  start [shape=Mdiamond, label="oops]\n}\n')
    err = _fails(run_fabro("run", str(bad), cwd=repo), "unterminated string")
    assert err.startswith(f"error: {bad}:2:32: "), err


def test_invalid_workflow_lists_every_error_with_its_location(repo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "nostart.fabro"
    bad.write_text('digraph X {\n  a [shape=parallelogram, script="true"]\n}\n')
    err = _fails(run_fabro("run", str(bad), cwd=repo), "cannot run", "git fabro validate")
    assert f"{bad}:1:1: error: [start_node]" in err
    assert "[terminal_node]" in err


def test_workflow_that_is_not_utf8(repo: Path, tmp_path: Path) -> None:
    bad = tmp_path / "binary.fabro"
    bad.write_bytes(b"digraph X { \xff\xfe }")
    _fails(run_fabro("run", str(bad), cwd=repo), str(bad), "UTF-8")


def test_missing_workflow_lists_the_shipped_examples(repo: Path) -> None:
    err = _fails(
        run_fabro("run", "no-such-workflow", cwd=repo), "no workflow file 'no-such-workflow'"
    )
    for example in (
        "hello",
        "branch-loop",
        "human-gate",
        "parallel-review",
        "plan-implement-review",
    ):
        assert example in err


def test_workflow_path_that_is_a_directory(repo: Path, tmp_path: Path) -> None:
    directory = tmp_path / "dir.fabro"
    directory.mkdir()
    _fails(run_fabro("run", str(directory), cwd=repo), str(directory), "directory")


@pytest.mark.parametrize("command", ["run", "validate", "graph"])
@pytest.mark.parametrize("workflow", ["", "  "])
def test_an_empty_workflow_argument_is_no_workflow(repo: Path, command: str, workflow: str) -> None:
    """An empty WORKFLOW is no path to the current directory: the user typed nothing."""
    err = _fails(
        run_fabro(command, workflow, cwd=repo),
        "error: no workflow given: the WORKFLOW argument is empty",
    )
    assert "is a directory" not in err and "hint: pass a path to a .fabro" in err


# -- run ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["logs", "inspect", "resume"])
def test_unknown_run_id(repo: Path, command: str) -> None:
    _fails(
        run_fabro(command, "7ZZZZZZZ", cwd=repo), "no run matches '7ZZZZZZZ' here", "git fabro ps"
    )


@pytest.mark.parametrize("command", ["logs", "inspect", "resume"])
def test_empty_run_id(repo: Path, command: str) -> None:
    _fails(run_fabro(command, "", cwd=repo), "no run id given")


@pytest.fixture
def two_runs(repo: Path) -> tuple[Path, list[str]]:
    ids = []
    for _ in range(2):
        proc = run_fabro("run", "hello", "--json", cwd=repo)
        assert proc.returncode == 0, proc.stderr
        ids.append(json.loads(proc.stdout.splitlines()[-1])["run_id"])
    return repo, ids


@pytest.mark.parametrize("command", ["logs", "inspect", "resume"])
def test_ambiguous_prefix_lists_the_candidates(
    two_runs: tuple[Path, list[str]], command: str
) -> None:
    repo, ids = two_runs
    common = 0
    while ids[0][common] == ids[1][common]:
        common += 1
    prefix = ids[0][:common]
    assert prefix, "ULIDs made a second apart share their leading time digits"
    err = _fails(
        run_fabro(command, prefix.lower(), cwd=repo), "matches 2 runs", "give more characters"
    )
    for run_id in ids:
        assert f"  {run_id}" in err
    # One more character is enough.
    ok = run_fabro(command, ids[1][: common + 1], cwd=repo)
    assert ok.returncode == 0, ok.stderr


def test_broken_meta_ref_is_named_and_does_not_hide_other_runs(
    two_runs: tuple[Path, list[str]],
) -> None:
    """A meta ref pointing at something that is not a snapshot commit (a hand edit, a
    bad fetch) must not stop `ps` listing the other runs, and commands on that run
    name the ref."""
    repo, ids = two_runs
    blob = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=repo,
        input="not a commit\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    bad_id = "01BADBADBADBADBADBADBADBAD"
    git(repo, "update-ref", f"refs/fabro/meta/{bad_id}", blob)
    ps = run_fabro("ps", "--json", cwd=repo)
    assert "Traceback" not in ps.stderr
    listed = {json.loads(line)["run_id"] for line in ps.stdout.splitlines()}
    assert set(ids) <= listed
    assert f"refs/fabro/meta/{bad_id}" in ps.stderr
    for command in ("logs", "inspect", "resume"):
        _fails(run_fabro(command, bad_id, cwd=repo), f"refs/fabro/meta/{bad_id}")


def test_incomplete_meta_snapshot_is_reported(repo: Path) -> None:
    empty_tree = git(repo, "hash-object", "-w", "-t", "tree", "/dev/null").strip()
    commit = subprocess.run(
        ["git", "commit-tree", "-m", "init", empty_tree],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    run_id = "01EMPTYEMPTYEMPTYEMPTYEMPT"
    git(repo, "update-ref", f"refs/fabro/meta/{run_id}", commit)
    for command in ("inspect", "resume"):
        _fails(
            run_fabro(command, run_id, cwd=repo),
            f"run {run_id}",
            "is incomplete",
            f"git show {commit}",
        )
