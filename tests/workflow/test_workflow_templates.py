"""Prompt templates and @file references."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabro_git.errors import WorkflowError
from fabro_git.workflow import parse
from fabro_git.workflow.paths import PathRefused, disk_origin, is_file_ref
from fabro_git.workflow.templates import (
    TemplateError,
    load_prompt,
    render,
    template_variables,
)


def r(text: str, **inputs: str) -> str:
    return render(text, goal="Ship v2", inputs=inputs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Plan: {{ goal }}", "Plan: Ship v2"),
        ("{{goal}}!", "Ship v2!"),
        ("{{  goal  }}", "Ship v2"),
        ("Repo {{ inputs.repo_name }} in {{inputs.lang}}", "Repo fabro in rust"),
        ("legacy $goal here", "legacy Ship v2 here"),
        ("$goals and $goal_x stay", "$goals and $goal_x stay"),
        (
            "{% raw %}{{ goal }} and $goal{% endraw %} but {{ goal }}",
            "{{ goal }} and $goal but Ship v2",
        ),
        ("{{ '{{' }} literal", "{{ literal"),
        ('a {{ "}}" }} b', "a }} b"),
        ("{# a comment #}kept", "kept"),
        ("no templates at all { }", "no templates at all { }"),
        ("shell ${#array[@]} and ${HOME}", "shell ${#array[@]} and ${HOME}"),
        ("{{- goal -}}", "Ship v2"),
    ],
)
def test_render(text: str, expected: str) -> None:
    assert r(text, repo_name="fabro", lang="rust") == expected


def test_goal_is_not_rendered_twice() -> None:
    assert render("{{ goal }}", goal="{{ inputs.x }} $goal", inputs={}) == "{{ inputs.x }} $goal"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{{ foo }}", "unknown template variable {{ foo }}"),
        (
            "{{ inputs.missing }}",
            "undefined input {{ inputs.missing }}: pass it with -V missing=VALUE",
        ),
        ("{{ goal | upper }}", "unknown template variable {{ goal | upper }}"),
        ("{% if goal %}x{% endif %}", "unsupported template tag"),
        ("open {{ goal", "'{{' without a matching '}}'"),
        ("{% raw %} never closed", "without a matching '{% endraw %}'"),
    ],
)
def test_strict_errors(text: str, fragment: str) -> None:
    with pytest.raises(TemplateError) as info:
        r(text)
    assert fragment in str(info.value)


def test_lenient_mode_leaves_unknown_text_alone() -> None:
    text = "{{ foo }} {{ inputs.nope }} {% if x %} {{ goal }} $goal"
    assert (
        render(text, goal="G", inputs={}, strict=False)
        == "{{ foo }} {{ inputs.nope }} {% if x %} G G"
    )
    assert render("open {{ goal", goal="G", inputs={}, strict=False) == "open {{ goal"


def test_template_variables() -> None:
    text = (
        "{{ goal }} {{inputs.name}} $goal {% raw %}{{ hidden }}{% endraw %} {{ a  b }} {{ 'lit' }}"
    )
    assert template_variables(text) == {"goal", "inputs.name", "a b"}
    assert template_variables("$goal") == {"goal"}
    assert template_variables("{% for x in y %}") == {"%for x in y"}
    with pytest.raises(TemplateError):
        template_variables("{{ unclosed")


def test_file_refs_resolve_relative_to_the_workflow(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "plan.md").write_text("Plan it")
    origin = disk_origin(tmp_path / "flow.fabro")
    assert origin.root == tmp_path.resolve()
    assert origin.resolve("prompts/plan.md") == "prompts/plan.md"
    assert origin.read("prompts/plan.md") == b"Plan it"
    assert origin.resolve("prompts/none.md") == "prompts/none.md"
    assert not is_file_ref("not a ref")
    assert not is_file_ref("@mention someone")
    assert not is_file_ref("@")


def test_file_refs_outside_the_root_are_refused(tmp_path: Path, hermetic_env: Path) -> None:
    # No `~/.fabro` fallback, no home, no absolute path, no way up: a workflow outside
    # any repository names files in its own directory tree only.
    (hermetic_env / ".fabro" / "prompts").mkdir(parents=True)
    (hermetic_env / ".fabro" / "prompts" / "review.md").write_text("fallback")
    workflow_dir = tmp_path / "flows"
    workflow_dir.mkdir()
    origin = disk_origin(workflow_dir / "flow.fabro")
    for ref, reason in (
        ("~/shared.md", "names a home directory"),
        ("/etc/passwd", "is an absolute path"),
        ("../up.md", "leads outside"),
        ("a/../../up.md", "leads outside"),
        (".git/config", "is inside .git"),
    ):
        with pytest.raises(PathRefused, match=reason):
            origin.resolve(ref)
    assert origin.resolve("prompts/review.md") == "prompts/review.md"
    with pytest.raises(PathRefused, match="not found"):
        origin.read("prompts/review.md")


def test_load_prompt_inline_file_and_missing(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text("From file {{ goal }}", encoding="utf-8")
    workflow = tmp_path / "flow.fabro"
    graph = parse(
        'digraph G {\n a [prompt="inline"]\n b [prompt="@p.md"]\n c\n d [prompt="@gone.md"]\n}',
        workflow,
    )
    assert load_prompt(graph.nodes["a"], graph) == "inline"
    assert load_prompt(graph.nodes["b"], graph) == "From file {{ goal }}"
    assert load_prompt(graph.nodes["c"], graph) is None
    with pytest.raises(WorkflowError) as info:
        load_prompt(graph.nodes["d"], graph)
    assert (info.value.line, info.value.column) == (5, 12)
    assert "prompt file '@gone.md' not found" in info.value.detail
