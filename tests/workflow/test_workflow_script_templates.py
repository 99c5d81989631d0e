"""Templates in scripts become environment references fitted to the shell's quoting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabro_git.errors import ConfigError
from fabro_git.workflow import parse, validate
from fabro_git.workflow.templates import (
    TemplateError,
    check_input_names,
    input_env_name,
    render,
    render_script,
    script_environment,
)


def rs(text: str, *inputs: str) -> str:
    return render_script(text, inputs=set(inputs))


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ('echo "{{ goal }}"', 'echo "${FABRO_GOAL}"'),
        ("echo {{ goal }}", "echo ${FABRO_GOAL}"),
        ("echo '{{ goal }}'", """echo ''"${FABRO_GOAL}"''"""),
        ("echo 'a {{ inputs.repo-url }} b'", """echo 'a '"${FABRO_INPUT_REPO_URL}"' b'"""),
        ("echo $'{{ goal }}\\n'", """echo $''"${FABRO_GOAL}"$'\\n'"""),
        ("""echo "it's {{ goal }}" '{{ goal }}'""", """echo "it's ${FABRO_GOAL}" ''"${FABRO_GOAL}"''"""),
        ("""echo \\'{{ goal }}""", """echo \\'${FABRO_GOAL}"""),
        ("""x=$(echo '{{ goal }}')""", """x=$(echo ''"${FABRO_GOAL}"'')"""),
        ("""echo "$(echo '{{ goal }}')\"""", """echo "$(echo ''"${FABRO_GOAL}"'')\""""),
        ("echo `echo '{{ goal }}'`", """echo `echo ''"${FABRO_GOAL}"''`"""),
        ("# it's {{ goal }}\necho '{{ goal }}'", """# it's ${FABRO_GOAL}\necho ''"${FABRO_GOAL}"''"""),
        ("echo $((1 << 2)) '{{ goal }}'", """echo $((1 << 2)) ''"${FABRO_GOAL}"''"""),
        ("cat <<EOF\n'{{ goal }}'\nEOF\necho '{{ goal }}'", """cat <<EOF\n'${FABRO_GOAL}'\nEOF\necho ''"${FABRO_GOAL}"''"""),
        ("cat <<-EOF # note\n\t{{ goal }}\n\tEOF\n'{{ goal }}'", """cat <<-EOF # note\n\t${FABRO_GOAL}\n\tEOF\n''"${FABRO_GOAL}"''"""),
        ("cat <<< '{{ goal }}'", """cat <<< ''"${FABRO_GOAL}"''"""),
    ],
)  # fmt: skip
def test_reference_fits_the_quoting(script: str, expected: str) -> None:
    assert rs(script, "repo-url") == expected


def test_author_text_stays_and_dollar_goal_is_the_shells() -> None:
    assert rs('echo {{ "{{ goal }}" }} $goal ${goal}') == "echo {{ goal }} $goal ${goal}"
    assert rs("{% raw %}{{ goal }}{% endraw %} {{ goal }}") == "{{ goal }} ${FABRO_GOAL}"
    # Prompts are text for a model: there the value itself goes in, `$goal` included.
    assert render("{{ goal }} / $goal", goal="g", inputs={}) == "g / g"


def test_undefined_input_and_unknown_name_still_fail() -> None:
    with pytest.raises(TemplateError, match="undefined input"):
        rs("echo {{ inputs.nope }}")
    with pytest.raises(TemplateError, match="unknown template variable"):
        rs("echo {{ context.x }}")


def test_python_scripts_refuse_templates() -> None:
    with pytest.raises(TemplateError, match=r"read os.environ\['FABRO_INPUT_N'\] instead"):
        render_script('print("{{ inputs.n }}")', inputs={"n"}, language="python")
    literal = render_script('print({{ "1" }})  # $goal', inputs=set(), language="python")
    assert literal == "print(1)  # $goal"


def test_quoted_heredoc_cannot_take_a_template() -> None:
    for opener in ("<<'EOF'", '<<"EOF"', "<<\\EOF", "<<-'EOF'"):
        with pytest.raises(TemplateError, match="quoted delimiter"):
            rs(f"cat {opener}\n{{{{ goal }}}}\nEOF")
    assert rs("cat <<'EOF'\nEOF\necho {{ goal }}") == "cat <<'EOF'\nEOF\necho ${FABRO_GOAL}"


SHAPES = [
    'printf "%s\\n" "{{ goal }}"',
    "printf '%s\\n' '{{ goal }}'",
    "printf '%s\\n' $'{{ goal }}'",
    "printf '%s\\n' \"$(printf '%s' '{{ goal }}')\"",
    "cat <<EOF\n{{ goal }}\nEOF",
]


@settings(max_examples=25, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40))
def test_any_value_prints_verbatim_in_every_quoting(value: str) -> None:
    script = "\n".join(rs(shape) for shape in SHAPES)
    env = script_environment(os.environ, goal=value, inputs={}, run_id="r")
    proc = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    # $(...) drops trailing newlines, as it would of any value; none are generated.
    assert proc.stdout == (value + "\n") * len(SHAPES)


def test_hostile_value_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    value = f"$(touch {marker}) `touch {marker}` '; touch {marker}; ' \"; touch {marker}; \""
    script = "\n".join(rs(shape) for shape in [*SHAPES, "echo {{ goal }}"])
    env = script_environment(os.environ, goal=value, inputs={}, run_id="r")
    proc = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    # It ran to the end, printing the value as text in every quoting.
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith((value + "\n") * len(SHAPES)), proc.stdout
    assert not marker.exists()


def test_input_names_map_to_environment_names() -> None:
    assert input_env_name("repo-url") == "FABRO_INPUT_REPO_URL"
    assert input_env_name("Name") == "FABRO_INPUT_NAME"
    check_input_names(["a", "b-c", "_d"])
    with pytest.raises(ConfigError, match="'foo' and 'FOO' would both"):
        check_input_names(["foo", "FOO"])
    for bad in ("a.b", "1x", "a b", ""):
        with pytest.raises(ConfigError, match="cannot be passed to scripts"):
            check_input_names([bad])


def test_script_environment_has_exactly_the_runs_values() -> None:
    base = {"PATH": "/bin", "FABRO_INPUT_OLD": "x", "FABRO_NODE_ID": "stale"}
    env = script_environment(base, goal="g", inputs={"new-one": "v"}, run_id="R", node_id="n")
    assert env == {
        "PATH": "/bin",
        "FABRO_GOAL": "g",
        "FABRO_INPUT_NEW_ONE": "v",
        "FABRO_RUN_ID": "R",
        "FABRO_NODE_ID": "n",
    }
    setup = script_environment(base, goal="", inputs={}, run_id="R")
    assert "FABRO_NODE_ID" not in setup and setup["FABRO_GOAL"] == ""


def test_validation_flags_python_templates_at_their_column() -> None:
    text = (
        "digraph P {\n"
        "  start [shape=Mdiamond]\n"
        "  exit [shape=Msquare]\n"
        '  py [shape=parallelogram, language=python, script="x = 1; print({{ inputs.n }})"]\n'
        "  sh [shape=parallelogram, script=\"echo '{{ inputs.n }}' $goal\"]\n"
        "  start -> py -> sh -> exit\n"
        "}\n"
    )
    diags = [d for d in validate(parse(text)) if d.rule == "script_template"]
    assert [(d.node_id, d.line, d.column, d.severity) for d in diags] == [("py", 4, 66, "error")]
    assert "os.environ['FABRO_INPUT_N']" in diags[0].message
