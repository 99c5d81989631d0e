"""Sub-workflows travel with their run, and validate with their parent.

A child workflow is found relative to the parent file, inside the repository; it and
its `@file` prompts are recorded under `graphs/<path>` on the meta ref, so a clone on
another machine (the original checkout gone, no scratch dir) resumes the run from git
alone; its templates render like the parent's. A child that is missing, invalid, or
that includes itself is a validation error at the parent's attribute.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from helpers import assert_fsck_clean, bare_remote, git, meta_file, run_fabro, write_workflow

PARENT = """\
digraph Parent {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    prep  [shape=parallelogram, script="echo \\"{{ goal }}\\" > parent.txt"]
    sub   [shape=house, stack.child_workflow="flows/child.fabro"]
    start -> prep -> sub -> exit
}
"""

# `work` fails until $HOME/ok exists: the fix a user makes before resuming.
CHILD = """\
digraph Child {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    ask   [prompt="@prompts/ask.md"]
    work  [shape=parallelogram, script="test -f \\"$HOME/ok\\" && echo \\"{{ goal }} / {{ inputs.thing }}\\" > child.txt"]
    start -> ask -> work -> exit
}
"""

ASK = "Ask about {{ goal }}\n"


def test_a_run_with_a_child_workflow_resumes_in_a_clone(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    (repo / "flows" / "prompts").mkdir(parents=True)
    (repo / "flows" / "child.fabro").write_text(CHILD)
    (repo / "flows" / "prompts" / "ask.md").write_text(ASK)
    git(repo, "add", "flows")
    write_workflow(repo, PARENT)
    args = ("wf.fabro", "--dry-run", "--goal", "port it", "-V", "thing=far", "--json")
    proc = run_fabro("run", *args, cwd=repo)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["status"] == "failed"
    run_id = result["run_id"]
    assert meta_file(repo, run_id, "graphs/flows/child.fabro") == CHILD
    assert meta_file(repo, run_id, "graphs/flows/prompts/ask.md") == ASK

    origin = bare_remote(tmp_path, origin_of=repo)
    pushed = run_fabro("push", "origin", cwd=repo)
    assert pushed.returncode == 0, pushed.stderr

    # Another machine: the original checkout and the local scratch dir are gone.
    shutil.rmtree(repo)
    shutil.rmtree(os.environ["FABRO_HOME"], ignore_errors=True)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    (hermetic_env / "ok").touch()
    resumed = run_fabro("resume", run_id, cwd=clone, timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr

    run_ref = f"refs/heads/fabro/run/{run_id}"
    assert git(clone, "show", f"{run_ref}:parent.txt") == "port it\n"
    assert git(clone, "show", f"{run_ref}:child.txt") == "port it / far\n"
    assert meta_file(clone, run_id, "graphs/flows/child.fabro") == CHILD
    assert "Ask about port it" in meta_file(clone, run_id, "nodes/sub/nodes/ask/prompt.md")
    inspect = json.loads(run_fabro("inspect", run_id, "--json", cwd=clone).stdout)
    assert inspect["status"] == "succeeded"
    assert_fsck_clean(clone)


def _validate(repo: Path, name: str = "wf.fabro") -> list[str]:
    proc = run_fabro("validate", name, cwd=repo)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1, proc.stdout
    return [line for line in proc.stdout.splitlines() if ": error: " in line]


def _house(target: str, name: str = "Parent") -> str:
    return (
        f"digraph {name} {{\n    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        f'    sub [shape=house, stack.child_workflow="{target}"]\n'
        "    start -> sub -> exit\n}\n"
    )


def test_a_missing_child_is_an_error_at_the_parent_attribute(repo: Path) -> None:
    write_workflow(repo, _house("flows/nowhere.fabro"))
    (error,) = _validate(repo)
    assert error.startswith("wf.fabro:4:44: error: [child_workflow] node 'sub': ")
    assert "child workflow 'flows/nowhere.fabro' not found" in error
    run = run_fabro("run", "wf.fabro", cwd=repo)
    assert run.returncode == 1 and "[child_workflow]" in run.stderr
    assert git(repo, "for-each-ref", "refs/fabro", "refs/heads/fabro") == ""


def test_an_invalid_child_is_an_error_at_the_parent_attribute(repo: Path) -> None:
    (repo / "flows").mkdir()
    (repo / "flows" / "child.fabro").write_text(
        "digraph Child {\n    start [shape=Mdiamond]\n"
        '    go [shape=parallelogram, script="echo {{ inputs.x }} {{ nope }}"]\n'
        "    start -> go\n}\n"
    )
    git(repo, "add", "flows")
    write_workflow(repo, _house("flows/child.fabro"))
    errors = _validate(repo)
    assert errors, errors
    assert all(e.startswith("wf.fabro:4:44: error: [child_workflow] node 'sub'") for e in errors)
    child = repo.resolve() / "flows" / "child.fabro"
    text = "\n".join(errors)
    assert f"{child}:1:1: [terminal_node]" in text  # no exit node
    assert f"{child}:3:" in text and "{{ nope }}" in text  # the child's own line


def test_a_child_that_includes_itself_is_an_error(repo: Path) -> None:
    (repo / "flows").mkdir()
    (repo / "flows" / "a.fabro").write_text(_house("b.fabro", "A"))
    (repo / "flows" / "b.fabro").write_text(_house("../wf.fabro", "B"))
    git(repo, "add", "flows")
    write_workflow(repo, _house("flows/a.fabro"))
    text = "\n".join(_validate(repo))
    assert "wf.fabro:4:44: error: [child_workflow]" in text
    assert "includes a workflow that includes it" in text
    assert "wf.fabro -> flows/a.fabro -> flows/b.fabro -> wf.fabro" in text

    write_workflow(repo, _house("self.fabro", "Self"), name="self.fabro")
    (error,) = _validate(repo, "self.fabro")
    assert "self.fabro:4:44: error: [child_workflow]" in error
    assert "includes itself" in error


def test_child_workflows_nest_only_so_deep(repo: Path) -> None:
    (repo / "deep").mkdir()
    for level in range(12):
        (repo / "deep" / f"{level}.fabro").write_text(_house(f"{level + 1}.fabro", f"L{level}"))
    (repo / "deep" / "12.fabro").write_text(
        "digraph Leaf {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n start -> exit\n}\n"
    )
    git(repo, "add", "deep")
    write_workflow(repo, _house("deep/0.fabro"))
    text = "\n".join(_validate(repo))
    assert "nests child workflows deeper than 8 levels" in text
    # Eight levels are fine.
    write_workflow(repo, _house("deep/5.fabro"), name="shallow.fabro")
    ok = run_fabro("validate", "shallow.fabro", cwd=repo)
    assert ok.returncode == 0, ok.stdout
    run = run_fabro("run", "shallow.fabro", cwd=repo)
    assert run.returncode == 0, run.stderr
