"""Values never become code, and regex conditions run in linear time: through real runs.

A goal, an input or a context value is data. These runs hand the tool the values an
attacker would (shell syntax in `--goal` and `-V`, a backtracking regex against a long
context value) and check that nothing runs and nothing hangs.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers import git, meta_file, run_events, run_fabro, run_json, write_workflow

ECHO_GOAL = """
digraph E {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    say [shape=parallelogram, script="%s"]
    start -> say -> exit
}
"""


def stdout_of(repo: Path, run_id: str, node: str) -> str:
    return meta_file(repo, run_id, f"nodes/{node}/stdout.log")


def hostile(marker: Path) -> str:
    """A value that runs `touch marker` in every way a shell could be talked into it."""
    return (
        f"x $(touch {marker}) `touch {marker}` ; touch {marker} ' ; touch {marker} ; ' "
        f'" ; touch {marker} ; " \\ $HOME *'
    )


def test_goal_with_command_substitution_is_printed_not_run(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    write_workflow(repo, ECHO_GOAL % r"echo \"{{ goal }}\"")
    goal = f"x $(touch {marker})"
    proc, result = run_json("run", "wf.fabro", "--goal", goal, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert stdout_of(repo, result["run_id"], "say") == goal + "\n"


def test_input_with_a_command_separator_is_data_even_bare(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    write_workflow(repo, ECHO_GOAL % "echo {{ inputs.name }}")
    proc, result = run_json("run", "wf.fabro", "-V", f"name=a; touch {marker}", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert stdout_of(repo, result["run_id"], "say") == f"a; touch {marker}\n"
    # The recorded script holds the reference, not the value.
    script = meta_file(repo, result["run_id"], "nodes/say/script.sh")
    assert script == "echo ${FABRO_INPUT_NAME}"


def test_every_quoting_prints_a_hostile_value_verbatim(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = hostile(marker)
    script = (
        r"""printf '%s\n' \"{{ goal }}\" '{{ goal }}' \"$(echo '{{ goal }}')\" $'{{ goal }}'; """
        r"""cat <<EOF\n{{ goal }}\nEOF\n"""
    )
    write_workflow(repo, ECHO_GOAL % script)
    proc, result = run_json("run", "wf.fabro", "--goal", value, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert stdout_of(repo, result["run_id"], "say") == (value + "\n") * 5


def test_hostile_value_through_tool_command_and_setup(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    write_workflow(
        repo,
        """
        digraph S {
            graph [setup="echo setup {{ inputs.x }} > setup.txt"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            legacy [shape=parallelogram, tool_command="echo {{ inputs.x }} > legacy.txt"]
            start -> legacy -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", "-V", f"x=$(touch {marker})", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    branch = f"fabro/run/{result['run_id']}"
    assert git(repo, "show", f"{branch}:legacy.txt") == f"$(touch {marker})\n"
    assert git(repo, "show", f"{branch}:setup.txt") == f"setup $(touch {marker})\n"


def test_legacy_goal_is_the_shells_variable_in_scripts_and_the_goal_in_prompts(
    repo: Path,
) -> None:
    write_workflow(
        repo,
        """
        digraph L {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            say [shape=parallelogram, script="goal=from-shell; echo \\"$goal\\""]
            ask [prompt="Work on: $goal"]
            start -> say -> ask -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--goal", "the goal", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(repo, result["run_id"], "say") == "from-shell\n"
    assert "Work on: the goal" in meta_file(repo, result["run_id"], "nodes/ask/prompt.md")


def test_values_reach_commands_and_setup_through_the_environment(repo: Path) -> None:
    (repo / "run.toml").write_text(
        '_version = 1\n[workflow]\ngraph = "wf.fabro"\n'
        '[run.inputs]\nrepo-url = "https://example.com/r.git"\n'
        '[[run.prepare.steps]]\nscript = "echo \\"$FABRO_GOAL|$FABRO_INPUT_REPO_URL|$FABRO_RUN_ID\\" > prep.txt"\n'
    )
    write_workflow(
        repo,
        """
        digraph V {
            graph [goal="test {{ inputs.repo-url }}"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            env [shape=parallelogram, script="env | grep '^FABRO_' | grep -v -e STAGE_ID -e WORKTREE | sort"]
            start -> env -> exit
        }
        """,
    )
    git(repo, "add", "run.toml")
    git(repo, "commit", "-q", "-m", "config")
    # A variable the user happens to have set must not pose as an input of this run.
    proc = run_fabro("run", "run.toml", "--json", cwd=repo, env={"FABRO_INPUT_STALE": "old"})
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    lines = stdout_of(repo, run_id, "env").splitlines()
    goal = "test https://example.com/r.git"
    assert f"FABRO_GOAL={goal}" in lines
    assert "FABRO_INPUT_REPO_URL=https://example.com/r.git" in lines
    assert f"FABRO_RUN_ID={run_id}" in lines
    assert "FABRO_NODE_ID=env" in lines
    assert not any(line.startswith("FABRO_INPUT_STALE") for line in lines)
    prep = git(repo, "show", f"fabro/run/{run_id}:prep.txt")
    assert prep == f"{goal}|https://example.com/r.git|{run_id}\n"
    assert json.loads(meta_file(repo, run_id, "manifest.json"))["goal"] == goal


def test_input_names_that_collide_as_variables_are_refused(repo: Path) -> None:
    write_workflow(repo, ECHO_GOAL % "echo hi")
    proc = run_fabro("run", "wf.fabro", "-V", "foo-bar=1", "-V", "foo_bar=2", cwd=repo)
    assert proc.returncode == 1
    assert (
        "'foo-bar' and 'foo_bar' would both be passed to scripts as FABRO_INPUT_FOO_BAR"
        in proc.stderr
    )
    bad = run_fabro("run", "wf.fabro", "-V", "a.b=1", cwd=repo)
    assert bad.returncode == 1
    assert "input name 'a.b' cannot be passed to scripts" in bad.stderr
    for p in (proc, bad):
        assert "Traceback" not in p.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""


def test_python_script_refuses_templates_and_reads_the_environment(
    repo: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    write_workflow(
        repo,
        "digraph P {\n"
        "    start [shape=Mdiamond]\n"
        "    exit [shape=Msquare]\n"
        '    py [shape=parallelogram, language=python, script="print(\\"{{ goal }}\\")"]\n'
        "    start -> py -> exit\n"
        "}\n",
    )
    check = run_fabro("validate", "wf.fabro", cwd=repo)
    assert check.returncode == 1
    assert (
        "wf.fabro:4:63: error: [script_template] node 'py' script: {{ goal }} cannot be used "
        "in a python script" in check.stdout
    )
    assert "read os.environ['FABRO_GOAL'] instead" in check.stdout
    goal = f'"); open("{marker}", "w"); print("'
    refused = run_fabro("run", "wf.fabro", "--goal", goal, cwd=repo)
    assert refused.returncode == 1
    assert "[script_template]" in refused.stderr
    assert not marker.exists()

    write_workflow(
        repo,
        ECHO_GOAL.replace("shape=parallelogram", "shape=parallelogram, language=python")
        % r"import os; print(os.environ[\"FABRO_GOAL\"])",
    )
    proc, result = run_json("run", "wf.fabro", "--goal", goal, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert stdout_of(repo, result["run_id"], "say") == goal + "\n"


def test_quoted_heredoc_template_is_a_validation_error(repo: Path) -> None:
    write_workflow(repo, ECHO_GOAL % r"cat <<'EOF'\n{{ goal }}\nEOF")
    proc = run_fabro("validate", "wf.fabro", cwd=repo)
    assert proc.returncode == 1
    assert "[script_template]" in proc.stdout
    assert "here-document with a quoted delimiter" in proc.stdout


REDOS = """
digraph R {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    emit [shape=parallelogram, script="head -c 20000 /dev/zero | tr '\\\\0' a; printf %%s \\"{{ inputs.tail }}\\""]
    matched [shape=parallelogram, script="echo matched"]
    unmatched [shape=parallelogram, script="echo unmatched"]
    start -> emit
    emit -> matched [condition="context.command.output matches %s"]
    emit -> unmatched
    matched -> exit
    unmatched -> exit
}
"""


def test_backtracking_regex_against_a_long_value_finishes(repo: Path) -> None:
    write_workflow(repo, REDOS % "^(a+)+$")
    # A backtracking engine takes longer than the universe's age on 20,000 a's and a '!';
    # the timeout only guards the suite, the assertion is the routing.
    for tail, expected in (("!", "unmatched"), ("", "matched")):
        proc, result = run_json("run", "wf.fabro", "-V", f"tail={tail}", cwd=repo, timeout=60)
        assert proc.returncode == 0, proc.stderr
        events = run_events(result["run_id"], repo)
        done = [e["node_id"] for e in events if e["event"] == "stage.completed"]
        assert expected in done and ({"matched", "unmatched"} - {expected}).isdisjoint(done)


def test_patterns_re2_rejects_are_condition_syntax_errors(repo: Path) -> None:
    for pattern, reason in (
        (r"(a)\\1", "invalid escape sequence"),
        ("(?=x)", "invalid perl operator"),
    ):
        write_workflow(repo, REDOS % pattern)
        check = run_fabro("validate", "wf.fabro", cwd=repo)
        assert check.returncode == 1
        line = next(ln for ln in check.stdout.splitlines() if "[condition_syntax]" in ln)
        assert line.startswith("wf.fabro:9:")
        assert reason in line and "no backreferences or lookaround" in line
        assert "absl" not in check.stderr and "re2.cc" not in check.stderr
        proc = run_fabro("run", "wf.fabro", "-V", "tail=", cwd=repo)
        assert proc.returncode == 1
        assert "[condition_syntax]" in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""


def test_a_goal_too_long_for_a_scripts_environment_is_refused_or_fails_the_stage(
    repo: Path, tmp_path: Path
) -> None:
    goal_file = tmp_path / "goal.txt"
    goal_file.write_text("g" * 200_000)
    write_workflow(repo, ECHO_GOAL % "echo hi")
    proc = run_fabro("run", "wf.fabro", "--goal-file", str(goal_file), cwd=repo)
    assert proc.returncode == 1
    assert "the goal is 200000 bytes, too long for the environment" in proc.stderr
    assert git(repo, "for-each-ref", "refs/fabro") == ""
    # A child workflow's scripts are only known when it starts: there the stage fails.
    write_workflow(repo, ECHO_GOAL % "echo hi", name="child.fabro")
    write_workflow(
        repo,
        """
        digraph Parent {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            child [shape=house, stack.child_workflow="child.fabro"]
            start -> child -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--goal-file", str(goal_file), cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
    assert "cannot start" in proc.stderr and "too long" in proc.stderr
    assert result["status"] == "failed"
