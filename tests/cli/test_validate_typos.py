"""Typos caught before a run, through the real `git fabro validate` and `git fabro run`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import run_events, run_fabro, write_workflow

TYPOS = """\
digraph Typos {
    graph [goal="ship it"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    test  [shape=parallelogram, script="true", timout="30s"]
    start -> test
    test -> exti [condition="outcom=succeeded"]
    test -> exit
}
"""


def test_validate_prints_each_typo_at_its_place_with_a_suggestion(tmp_path: Path) -> None:
    (tmp_path / "typos.fabro").write_text(TYPOS)
    proc = run_fabro("validate", "typos.fabro", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout  # warnings alone pass
    lines = proc.stdout.splitlines()
    assert (
        "typos.fabro:5:48: warning: [unknown_attribute] node 'test': unknown attribute "
        "'timout': nothing reads it; did you mean 'timeout'?"
    ) in lines
    implicit = next(line for line in lines if "[implicit_node]" in line)
    assert implicit.startswith("typos.fabro:7:13: warning: [implicit_node] node 'exti'")
    assert "edge test -> exti at typos.fabro:7:5" in implicit
    assert implicit.endswith("did you mean 'exit'?")
    typo = next(line for line in lines if "[condition_typo]" in line)
    assert typo.startswith("typos.fabro:7:30: warning: [condition_typo]")
    assert typo.endswith("did you mean 'outcome'?")
    assert lines[-1].startswith("typos.fabro: valid with 4 warnings")


def test_validate_json_carries_the_new_rules(tmp_path: Path) -> None:
    (tmp_path / "typos.fabro").write_text(TYPOS)
    proc = run_fabro("validate", "--json", "typos.fabro", cwd=tmp_path)
    assert proc.returncode == 0
    (document,) = json.loads(proc.stdout)
    found = {(d["rule"], d["severity"], d["line"], d["column"]) for d in document["diagnostics"]}
    assert found == {
        ("unknown_attribute", "warning", 5, 48),
        ("implicit_node", "warning", 7, 13),
        ("prompt_on_llm_nodes", "warning", 7, 13),
        ("condition_typo", "warning", 7, 30),
    }
    implicit = next(d for d in document["diagnostics"] if d["rule"] == "implicit_node")
    assert implicit["node_id"] == "exti"
    typo = next(d for d in document["diagnostics"] if d["rule"] == "condition_typo")
    assert typo["edge"] == ["test", "exti"]


def test_validate_shows_a_child_workflows_warnings_under_its_path(tmp_path: Path) -> None:
    (tmp_path / "child.fabro").write_text(
        "digraph C {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  start -> exit [wieght=1]\n}\n"
    )
    (tmp_path / "parent.fabro").write_text(
        "digraph P {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  sub [shape=house, stack.child_workflow="child.fabro"]\n  start -> sub -> exit\n}\n'
    )
    proc = run_fabro("validate", "parent.fabro", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    (line,) = [ln for ln in proc.stdout.splitlines() if "[child_workflow]" in ln]
    assert line.startswith("parent.fabro:4:42: warning: [child_workflow] node 'sub'")
    assert "child.fabro:4:18: [unknown_attribute]" in line
    assert "did you mean 'weight'?" in line


def test_run_prints_the_warnings_first_and_goes_ahead_when_typos_are_allowed(repo: Path) -> None:
    write_workflow(repo, TYPOS, "typos.fabro")
    proc = run_fabro("run", "typos.fabro", "--dry-run", "--allow-typos", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    warnings = [i for i, line in enumerate(lines) if ": warning: [" in line]
    started = next(i for i, line in enumerate(lines) if line.startswith("run "))
    assert len(warnings) == 4 and max(warnings) < started
    assert any(
        line.startswith("typos.fabro:7:13: warning: [implicit_node]")
        and line.endswith("did you mean 'exit'?")
        for line in lines
    )
    # --allow-typos: it ran as written, where the misspelt condition key
    # reads as empty, so the edge to `exti` is never taken.
    run_id = lines[started].split()[1]
    entered = [e["node_id"] for e in run_events(run_id, repo) if e["event"] == "stage.started"]
    assert entered == ["start", "test", "exit"]


def test_a_refused_run_also_shows_the_warning_that_explains_it(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph R {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  build [shape=parallelogram, scrpt="make"]\n  start -> build -> exit\n}\n',
        "refused.fabro",
    )
    proc = run_fabro("run", "refused.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert (
        "refused.fabro:4:31: warning: [unknown_attribute] node 'build': unknown attribute "
        "'scrpt': nothing reads it; did you mean 'script'?"
    ) in proc.stderr.splitlines()
    assert "[command_requires_script]" in proc.stderr


NEWCOMER = """\
digraph Newcomer {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    test  [shape=parallellogram, script="false"]
    review [promt="Review the change", lable="Review"]
    start -> test
    test -> review [conditon="outcome=success"]
    test -> exit [condition="outcome=fail"]
    review -> exit
}
"""


def test_run_refuses_typos_before_anything_starts(repo: Path) -> None:
    write_workflow(repo, NEWCOMER, "newcomer.fabro")
    proc = run_fabro("run", "newcomer.fabro", "--dry-run", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    for fix in (
        "newcomer.fabro:4:18: 'parallellogram' -> 'parallelogram'",
        "newcomer.fabro:5:13: 'promt' -> 'prompt'",
        "newcomer.fabro:5:40: 'lable' -> 'label'",
        "newcomer.fabro:7:21: 'conditon' -> 'condition'",
    ):
        assert "  " + fix in lines, proc.stderr
    assert any("4 typos found" in line for line in lines)
    assert "--allow-typos" in proc.stderr
    assert not any(line.startswith("run ") for line in lines)
    refs = subprocess.run(
        ["git", "for-each-ref", "refs/fabro"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert refs.stdout == ""  # nothing was created


def test_validate_strict_fails_on_warnings_and_json_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "newcomer.fabro").write_text(NEWCOMER)
    assert run_fabro("validate", "newcomer.fabro", cwd=tmp_path).returncode == 0
    strict = run_fabro("validate", "--strict", "newcomer.fabro", cwd=tmp_path)
    assert strict.returncode == 1
    assert "valid with" in strict.stdout  # the verdict is Fabro's; only the status differs
    proc = run_fabro("validate", "--json", "newcomer.fabro", cwd=tmp_path)
    (document,) = json.loads(proc.stdout)
    fixes = {
        (d["typo"]["written"], d["typo"]["meant"]) for d in document["diagnostics"] if d["typo"]
    }
    assert fixes == {
        ("parallellogram", "parallelogram"),
        ("promt", "prompt"),
        ("lable", "label"),
        ("conditon", "condition"),
    }
    clean = "digraph C {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  start -> exit\n}\n"
    (tmp_path / "clean.fabro").write_text(clean)
    assert run_fabro("validate", "--strict", "clean.fabro", cwd=tmp_path).returncode == 0


def test_the_standard_success_failure_pair_validates_clean(tmp_path: Path) -> None:
    (tmp_path / "pair.fabro").write_text(
        "digraph P {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  test [shape=parallelogram, script="true"]\n  fix [shape=parallelogram, script="true"]\n'
        '  start -> test\n  test -> exit [condition="outcome=success"]\n'
        '  test -> fix [condition="outcome=fail"]\n  fix -> exit\n}\n'
    )
    proc = run_fabro("validate", "--strict", "pair.fabro", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines() == ["pair.fabro: valid - workflow 'P', 4 nodes, 4 edges"]


def test_the_new_flags_are_completed_in_every_shell() -> None:
    for shell in ("bash", "zsh", "fish"):
        script = run_fabro("completion", shell).stdout
        assert "allow-typos" in script and "strict" in script, shell
