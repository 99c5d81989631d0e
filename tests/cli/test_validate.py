"""`git fabro validate` through the real command: output format, JSON, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import git, run_fabro, write_workflow

import fabro_git

EXAMPLES = Path(fabro_git.__file__).parent / "examples"

CLEAN = """digraph Clean {
    graph [goal="say hi"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hi    [shape=parallelogram, script="echo hi"]
    start -> hi -> exit
}
"""

WARNS = """digraph Warns {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    think [shape=box]
    start -> think -> exit
}
"""

BROKEN = """digraph Broken {
    start [shape=Mdiamond]
    a [prompt="x"]
    start -> a
    a -> start
    a -> b [condition="outcome=="]
}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def assert_no_traceback(proc: object) -> None:
    stderr = getattr(proc, "stderr", "")
    stdout = getattr(proc, "stdout", "")
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert "unexpected error" not in stderr


def test_clean_file_exits_zero(tmp_path: Path) -> None:
    path = write(tmp_path, "clean.fabro", CLEAN)
    proc = run_fabro("validate", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{path}: valid - workflow 'Clean', 3 nodes, 2 edges\n"


def test_warnings_print_in_compiler_format_and_still_pass(tmp_path: Path) -> None:
    path = write(tmp_path, "warns.fabro", WARNS)
    proc = run_fabro("validate", "warns.fabro", cwd=tmp_path)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("warns.fabro:4:5: warning: [prompt_on_llm_nodes] agent node 'think'")
    assert lines[-1] == "warns.fabro: valid with 1 warning - workflow 'Warns', 3 nodes, 2 edges"
    assert path.exists()


def test_errors_exit_one_with_positions(tmp_path: Path) -> None:
    write(tmp_path, "broken.fabro", BROKEN)
    proc = run_fabro("validate", "broken.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    out = proc.stdout
    assert "broken.fabro:1:1: error: [terminal_node] no exit node" in out
    assert "broken.fabro:5:5: error: [start_no_incoming] edge a -> start" in out
    assert (
        "broken.fabro:6:33: error: [condition_syntax] edge a -> b: bad condition 'outcome==': "
        "expected a value after '=='" in out
    )
    assert out.splitlines()[-1].startswith("broken.fabro: invalid (")
    assert_no_traceback(proc)


def test_several_files_fail_if_any_fails(tmp_path: Path) -> None:
    write(tmp_path, "clean.fabro", CLEAN)
    write(tmp_path, "broken.fabro", BROKEN)
    proc = run_fabro("validate", "clean.fabro", "broken.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    assert "clean.fabro: valid" in proc.stdout
    assert "broken.fabro: invalid" in proc.stdout


def test_json_document_shape(tmp_path: Path) -> None:
    write(tmp_path, "clean.fabro", CLEAN)
    write(tmp_path, "broken.fabro", BROKEN)
    proc = run_fabro("validate", "--json", "clean.fabro", "broken.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    document = json.loads(proc.stdout)
    assert [entry["file"] for entry in document] == ["clean.fabro", "broken.fabro"]
    clean, broken = document
    assert clean == {
        "file": "clean.fabro",
        "name": "Clean",
        "nodes": 3,
        "edges": 2,
        "diagnostics": [],
    }
    assert (broken["name"], broken["nodes"], broken["edges"]) == ("Broken", 3, 3)
    by_rule = {d["rule"]: d for d in broken["diagnostics"]}
    assert by_rule["start_no_incoming"] == {
        "rule": "start_no_incoming",
        "severity": "error",
        "message": "edge a -> start enters the start node; nothing may lead back to start",
        "node_id": None,
        "edge": ["a", "start"],
        "line": 5,
        "column": 5,
        "typo": None,
    }
    assert by_rule["terminal_node"]["edge"] is None


def test_json_reports_parse_errors_as_diagnostics(tmp_path: Path) -> None:
    write(tmp_path, "bad.fabro", 'digraph G {\n  a [label="x"\n')
    proc = run_fabro("validate", "--json", "bad.fabro", "missing.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    bad, missing = json.loads(proc.stdout)
    assert bad["name"] is None and bad["nodes"] == 0 and bad["edges"] == 0
    (diag,) = bad["diagnostics"]
    assert (diag["rule"], diag["severity"], diag["line"], diag["column"]) == (
        "parse",
        "error",
        3,
        1,
    )
    assert diag["message"] == "unexpected end of file: expected ']' to close the attribute list"
    assert missing["diagnostics"][0]["message"] == "no such file"
    assert_no_traceback(proc)


def test_missing_file(tmp_path: Path) -> None:
    proc = run_fabro("validate", "nope.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    assert "nope.fabro: error: [parse] no such file" in proc.stdout
    assert_no_traceback(proc)


def test_directory(tmp_path: Path) -> None:
    proc = run_fabro("validate", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1
    assert "is a directory" in proc.stdout
    assert_no_traceback(proc)


def test_invalid_utf8(tmp_path: Path) -> None:
    (tmp_path / "latin1.fabro").write_bytes(b'digraph G {\n  a [label="na\xefve"]\n}\n')
    proc = run_fabro("validate", "latin1.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    assert "latin1.fabro:2:15: error: [parse] not valid UTF-8 (byte 0xef)" in proc.stdout
    assert_no_traceback(proc)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"nodes": []}\n', "expected 'digraph' at the start of a workflow"),
        (b"name: workflow\nsteps: []\n", "expected 'digraph' at the start of a workflow"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "thing.fabro: error: [parse] this is a binary file"),
        (b"\xff\xfeL\x00", "binary file"),
        (b"", "empty workflow"),
    ],
)
def test_non_dot_files(tmp_path: Path, content: bytes, fragment: str) -> None:
    (tmp_path / "thing.fabro").write_bytes(content)
    proc = run_fabro("validate", "thing.fabro", cwd=tmp_path)
    assert proc.returncode == 1
    assert fragment in proc.stdout
    assert "could not be parsed" in proc.stdout
    assert_no_traceback(proc)


def test_every_shipped_example_validates_cleanly(tmp_path: Path) -> None:
    paths = sorted(str(p) for p in EXAMPLES.glob("*.fabro"))
    proc = run_fabro("validate", *paths, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count(": valid - workflow") == len(paths)
    assert "warning" not in proc.stdout


# The exit out of reach, and no stage to end at: `a` and `b` hand the run to each other
# for ever.
NO_WAY_OUT = """digraph Cycle {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    a     [shape=parallelogram, script="true"]
    b     [shape=parallelogram, script="true"]
    start -> a -> b -> a
}
"""

# The exit is reachable, but a failed check goes round `fix` and `again` for ever.
TRAP = """digraph Trap {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    check [shape=parallelogram, script="true"]
    fix   [shape=parallelogram, script="true"]
    again [shape=parallelogram, script="true"]
    start -> check
    check -> exit [condition="outcome=succeeded"]
    check -> fix  [condition="outcome!=succeeded"]
    fix -> again -> fix
}
"""


def test_a_workflow_that_cannot_finish_is_refused_before_it_runs(repo: Path) -> None:
    write_workflow(repo, NO_WAY_OUT, "cycle.fabro")
    write_workflow(repo, TRAP, "trap.fabro")
    proc = run_fabro("validate", "cycle.fabro", "trap.fabro", cwd=repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "cycle.fabro:2:5: error: [endless_loop] no path from nodes 'start', 'a', 'b' reaches the "
        "exit or ends anywhere" in proc.stdout
    ), proc.stdout
    assert "add a way out, e.g. b -> exit" in proc.stdout
    assert (
        "trap.fabro:5:5: error: [endless_loop] no path from nodes 'fix', 'again' reaches the "
        "exit or ends anywhere, so a run that gets there goes round a loop for ever; add a "
        "way out, e.g. again -> exit" in proc.stdout
    ), proc.stdout
    for name in ("cycle.fabro", "trap.fabro"):
        run = run_fabro("run", name, cwd=repo, timeout=60)
        assert run.returncode == 1, run.stderr
        assert "cannot run" in run.stderr and "Traceback" not in run.stderr
    assert git(repo, "for-each-ref", "refs/fabro/") == ""
    # With a way out, the same loop is fine.
    write_workflow(repo, TRAP.replace("fix -> again -> fix", "fix -> again -> check"), "ok.fabro")
    assert run_fabro("validate", "ok.fabro", cwd=repo).returncode == 0
