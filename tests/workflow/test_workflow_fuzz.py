"""Property tests: no input makes the workflow layer fail with anything but its own errors.

Workflow files are user input. Whatever the bytes, `parse` either returns a graph or
raises `WorkflowError`; `validate` and `git fabro graph`'s DOT rendering always return.
The inputs are random text, token soup, and the shipped examples with random damage.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fabro_git
from fabro_git.cli.graph import render_dot
from fabro_git.errors import WorkflowError
from fabro_git.workflow import parse, validate
from fabro_git.workflow.conditions import ConditionError, evaluate_condition, parse_condition
from fabro_git.workflow.stylesheet import StylesheetError, parse_stylesheet
from fabro_git.workflow.templates import TemplateError, render, template_variables

EXAMPLES = [
    path.read_text(encoding="utf-8")
    for path in sorted((Path(fabro_git.__file__).parent / "examples").glob("*.fabro"))
]
SEVERITIES = {"error", "warning", "info"}

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

TOKENS = [
    "digraph", "G", "{", "}", "[", "]", "=", ",", ";", "->", "--", "+", "subgraph", "node",
    "edge", "graph", "start", "exit", "a", "b", "shape", "Mdiamond", "Msquare", "hexagon",
    "diamond", "component", "condition", '"outcome=succeeded"', '"outcome=x &&"', "label",
    '"[A] Approve"', "prompt", '"{{ goal }}"', '"{{ nope }}"', '"@missing.md"', "type",
    "model_stylesheet", '"* { model: gpt-5; }"', '"* { model }"', "class", '"a b"',
    "max_visits", "3", "-1", "15m", "true", "freeform", "selection", '"random"', "goal_gate",
    "thread_id", "fidelity", '"full"', "\n", " ", "//c\n", "/*x*/", '"\\"', '"\\\n"', "#x\n",
]  # fmt: skip


def exercise(text: str) -> None:
    try:
        graph = parse(text, Path("fuzz.fabro"))
    except WorkflowError as err:
        assert err.path == "fuzz.fabro"
        assert err.line is None or err.line >= 1
        assert err.column is None or err.column >= 1
        return
    diagnostics = validate(graph)
    for diagnostic in diagnostics:
        assert diagnostic.severity in SEVERITIES
        assert diagnostic.line is None or diagnostic.line >= 1
    assert render_dot(graph).startswith("digraph ")


@FUZZ
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    exercise(text)


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_token_soup(tokens: list[str]) -> None:
    exercise(" ".join(tokens))


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
def test_token_soup_inside_a_graph(tokens: list[str]) -> None:
    exercise(
        "digraph G {\n start [shape=Mdiamond] exit [shape=Msquare]\n" + " ".join(tokens) + "\n}"
    )


@st.composite
def damaged_example(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(EXAMPLES))
    for _ in range(draw(st.integers(1, 6))):
        if not text:
            break
        start = draw(st.integers(0, len(text) - 1))
        end = draw(st.integers(start, min(len(text), start + 20)))
        action = draw(st.sampled_from(["delete", "insert", "duplicate", "token"]))
        if action == "delete":
            text = text[:start] + text[end:]
        elif action == "insert":
            text = text[:start] + draw(st.text(max_size=5)) + text[start:]
        elif action == "duplicate":
            text = text[:end] + text[start:end] + text[end:]
        else:
            text = text[:start] + draw(st.sampled_from(TOKENS)) + text[start:]
    return text


@FUZZ
@given(damaged_example())
def test_damaged_examples(text: str) -> None:
    exercise(text)


@FUZZ
@given(st.text(max_size=80), st.sampled_from(["succeeded", "failed", "fail", ""]))
def test_conditions_raise_only_condition_error(text: str, outcome: str) -> None:
    try:
        condition = parse_condition(text)
    except ConditionError as err:
        assert 0 <= err.offset <= len(text)
        return
    context: dict[str, object] = {"x": "1", "flag": True, "items": ["a"]}
    assert isinstance(
        evaluate_condition(condition, outcome=outcome, preferred_label="A", context=context), bool
    )


@FUZZ
@given(st.text(max_size=120))
def test_stylesheets_raise_only_stylesheet_error(text: str) -> None:
    try:
        parse_stylesheet(text)
    except StylesheetError as err:
        assert err.line >= 1 and err.column >= 1


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("{}%#$goalinputs.x '\"-raw end")), max_size=60))
def test_templates_raise_only_template_error(text: str) -> None:
    try:
        template_variables(text)
        render(text, goal="G", inputs={"x": "X"})
    except TemplateError:
        pass
    assert isinstance(render(text, goal="G", inputs={}, strict=False), str)
