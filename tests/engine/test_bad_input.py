"""Careless input is a user error (a message and exit 1), never a crash.

Node ids that refs and paths cannot carry, files that are not regular files or are far
too big, and a disk that fills up mid-run all end in a clear message through the real
`git fabro` command.
"""

from __future__ import annotations

from pathlib import Path

from conftest import git, run_fabro, run_json, write_workflow

LONG_ID = "n" * 300
# The longest id allowed, visited twice and inside a fan-out, so its ref name
# (`<id>-<visit>/<n>`, plus git's `.lock`) and its scratch and meta directories are made.
MAX_ID = "m" * 100


def _workflow(node_id: str) -> str:
    return f"""\
digraph W {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    {node_id} [shape=parallelogram, script="true"]
    start -> {node_id} -> exit
}}
"""


def test_over_long_node_id_is_a_validation_error(repo: Path) -> None:
    write_workflow(repo, _workflow(LONG_ID))
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "wf.fabro:4:5: error: [node_id_valid]" in proc.stdout
    assert "300 characters" in proc.stdout
    run = run_fabro("run", "wf.fabro", cwd=repo)
    assert run.returncode == 1, run.stderr
    assert "wf.fabro:4:5: error: [node_id_valid]" in run.stderr
    assert "Traceback" not in run.stderr and "unexpected error" not in run.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""


def test_quoted_node_id_that_no_ref_could_carry_is_refused(repo: Path) -> None:
    for bad in (
        "a/b",
        "x..y",
        "q@{1}",
        "lock.lock",
        "-lead",
        ".dot",
        "tab\\there",
        "back\\\\slash",
    ):
        write_workflow(repo, _workflow(f'"{bad}"'))
        proc = run_fabro("validate", "wf.fabro", cwd=repo)
        assert proc.returncode == 1, (bad, proc.stdout)
        assert "wf.fabro:4:5: error: [parse] invalid node id" in proc.stdout, (bad, proc.stdout)


def test_longest_allowed_node_id_runs_through_refs_and_paths(repo: Path) -> None:
    branch = "b" * 100
    write_workflow(
        repo,
        f"""\
digraph W {{
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    {MAX_ID} [shape=component]
    {branch} [shape=parallelogram, script="echo x >> b.txt"]
    other [shape=parallelogram, script="true"]
    join  [shape=tripleoctagon]
    check [shape=parallelogram, script="test -f loop.done || {{ touch loop.done; exit 1; }}"]
    start -> {MAX_ID}
    {MAX_ID} -> {branch} -> join
    {MAX_ID} -> other -> join
    join -> check
    check -> {MAX_ID} [condition="outcome=failed"]
    check -> exit [condition="outcome=succeeded"]
}}
""",
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded", result
    run_id = result["run_id"]
    refs = git(repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}/")
    assert f"refs/fabro/parallel/{run_id}/{MAX_ID}-2/0" in refs.split()
    tree = git(repo, "ls-tree", "--name-only", f"refs/fabro/meta/{run_id}:nodes")
    assert f"{MAX_ID}-2" in tree.split()
