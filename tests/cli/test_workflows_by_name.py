"""Workflows by name and `exec`, through the real command: `init` then `run hello` runs
the project's own hello, `workflow list` shows the project's and the user's workflows,
an ambiguous name is refused, and `exec` makes a run that `ps`, `show` and `resume`
know."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from helpers import git, run_fabro, run_json, write_workflow
from llm_server import LlmServer, Reply, ToolUse, unauthorized

PERSONAL = """\
digraph Mine {
    graph [goal="My own checks"]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    check [shape=parallelogram, script="echo mine > mine.txt"]
    start -> check -> exit
}
"""


def _personal_dir() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "git-fabro" / "workflows"


def test_init_then_run_hello_runs_the_projects_own_hello(repo: Path) -> None:
    proc = run_fabro("init", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert (repo / ".fabro" / "project.toml").is_file()
    hello = repo / ".fabro" / "workflows" / "hello" / "workflow.fabro"
    assert hello.is_file()
    git(repo, "add", ".fabro")
    git(repo, "commit", "-q", "-m", "fabro init")

    proc, result = run_json("run", "hello", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    greeting = git(repo, "show", f"fabro/run/{result['run_id']}:hello.txt")
    assert greeting == "Hello from the hello workflow of this project.\n"
    # The run takes the workflow's name, not its file's (`workflow.fabro`).
    listed = run_fabro("ps", "--filter", "workflow=hello", "--json", cwd=repo)
    assert result["run_id"] in listed.stdout, listed.stderr

    # A second init overwrites nothing.
    hello.write_text(hello.read_text() + "// mine now\n")
    again = run_fabro("init", cwd=repo)
    assert again.returncode == 1 and "already exist" in again.stderr
    assert hello.read_text().endswith("// mine now\n")


def test_workflow_list_shows_project_and_personal_workflows(repo: Path) -> None:
    proc = run_fabro("workflow", "create", "review", "--goal", 'Review "the" code', cwd=repo)
    assert proc.returncode == 0, proc.stderr
    mine = _personal_dir() / "mine"
    mine.mkdir(parents=True)
    (mine / "workflow.fabro").write_text(PERSONAL)

    proc = run_fabro("workflow", "list", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    rows = {(row["name"], row["origin"]): row for row in json.loads(proc.stdout)}
    assert rows[("review", "project")]["goal"] == 'Review "the" code'
    assert rows[("review", "project")]["path"] == ".fabro/workflows/review/workflow.fabro"
    assert rows[("mine", "personal")]["goal"] == "My own checks"
    assert ("hello", "example") in rows

    plain = run_fabro("workflow", "list", cwd=repo).stdout
    assert "review" in plain and "mine" in plain and "personal" in plain
    # Completion offers them, first the project's, with the shipped examples after.
    offered = run_fabro("__complete", "workflows", cwd=repo).stdout.split()
    assert offered[:2] == ["review", "mine"] and "hello" in offered

    # The created starter is valid, and a name is found by validate too.
    assert run_fabro("validate", "review", cwd=repo).returncode == 0
    assert run_fabro("workflow", "create", "review", cwd=repo).returncode == 1

    # The personal workflow runs by name, from any repository.
    write_workflow(repo, PERSONAL, name="unrelated.fabro")
    proc, result = run_json("run", "mine", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:mine.txt") == "mine\n"


def test_a_project_workflow_shadows_a_personal_one_and_an_ambiguous_name_is_refused(
    repo: Path,
) -> None:
    for name in ("review-code", "review-docs"):
        assert run_fabro("workflow", "create", name, cwd=repo).returncode == 0
    proc = run_fabro("run", "review", cwd=repo)
    assert proc.returncode == 1
    assert "ambiguous" in proc.stderr
    assert "review-code (project)" in proc.stderr and "review-docs (project)" in proc.stderr
    assert git(repo, "for-each-ref", "refs/heads/fabro") == ""
    assert run_fabro("graph", "review", "--format", "dot", cwd=repo).returncode == 1
    # A file name that is missing is not taken for the start of a workflow's name.
    missing = run_fabro("validate", "review.fabro", cwd=repo)
    assert missing.returncode == 1 and "review-code" not in missing.stdout + missing.stderr

    # A project workflow is found before a personal one of the same name.
    personal = _personal_dir() / "review-code"
    personal.mkdir(parents=True)
    (personal / "workflow.fabro").write_text(PERSONAL)
    proc = run_fabro("graph", "review-code", "--format", "dot", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert "Do the work" in proc.stdout and "Mine" not in proc.stdout


def test_exec_makes_a_run_that_ps_show_and_resume_know(repo: Path, llm_server: LlmServer) -> None:
    llm_server.script(
        Reply(
            text="Writing.",
            tool_calls=(ToolUse("write_file", {"path": "note.txt", "content": "n\n"}, id="w"),),
        ),
        unauthorized(),
    )
    proc = run_fabro("exec", "Write a note", "--model", "claude-sonnet-4-6", cwd=repo)
    assert proc.returncode != 0
    [run_id] = git(
        repo, "for-each-ref", "--format=%(refname:lstrip=4)", "refs/heads/fabro/run"
    ).split()
    assert "resume" in proc.stderr

    ps = run_fabro("ps", "--json", cwd=repo)
    assert ps.returncode == 0, ps.stderr
    [listed] = [json.loads(line) for line in ps.stdout.splitlines() if run_id in line]
    assert listed["workflow"] == "exec" and listed["status"] == "failed"

    llm_server.script(Reply(text="The note is written."))
    proc = run_fabro("resume", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    shown = run_fabro("show", run_id, "agent", cwd=repo)
    assert shown.returncode == 0, shown.stderr
    assert "The note is written." in shown.stdout
    # The first visit's write was checkpointed before the failure, or redone on resume.
    assert "Write a note" in llm_server.requests[-1].body["messages"][0]["content"]

    llm_server.script(Reply(text="Nothing to do."))
    proc, result = run_json("exec", "Say hello", "--permissions", "read-only", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["reply"] == "Nothing to do." and result["status"] == "succeeded"
    assert result["run_branch"] == f"fabro/run/{result['run_id']}"
    plain = run_fabro("exec", "Say hello again", cwd=repo)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "ok"  # the server's default reply
    assert "fabro/run/" in plain.stderr


def test_bash_completes_a_project_workflows_name(repo: Path, tmp_path: Path) -> None:
    assert run_fabro("workflow", "create", "release-notes", cwd=repo).returncode == 0
    script = tmp_path / "completion.bash"
    script.write_text(run_fabro("completion", "bash").stdout)
    proc = subprocess.run(
        [
            "bash",
            "--norc",
            "--noprofile",
            "-c",
            f"source {script}; COMP_WORDS=(git-fabro run rel); COMP_CWORD=2; "
            '_git_fabro_standalone; echo "${COMPREPLY[*]}"',
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["release-notes"]
