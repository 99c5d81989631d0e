"""`matches` conditions: RE2 syntax, linear time, and rejected patterns as syntax errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabro_git.workflow import parse, validate
from fabro_git.workflow.conditions import ConditionError, evaluate_condition, parse_condition


def holds(text: str, **context: object) -> bool:
    return evaluate_condition(text, outcome="succeeded", preferred_label=None, context=context)


def test_nested_quantifier_against_a_long_near_miss_is_linear() -> None:
    # Python's `re` backtracks through 2**n ways to split the a's; RE2 does not.
    value = "a" * 100_000 + "!"
    assert not holds("context.x matches ^(a+)+$", x=value)
    assert holds("context.x matches ^(a+)+$", x="a" * 100_000)
    assert not holds(r"x matches ^(\w+\s?)*$", x="word " * 20_000 + "!")


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", "invalid escape sequence"),
        ("(?=x)", "invalid perl operator"),
        ("(?!x)", "invalid perl operator"),
        ("(?<=x)a", "invalid perl operator"),
        ("(", "missing )"),
        (r"a\Z", "invalid escape sequence"),
    ],
)
def test_patterns_outside_re2_are_syntax_errors(pattern: str, reason: str) -> None:
    with pytest.raises(ConditionError) as caught:
        parse_condition(f"context.x matches {pattern}")
    assert reason in caught.value.detail
    assert caught.value.offset == 0


def test_rust_regex_syntax_that_re2_shares() -> None:
    assert holds(r"x matches ^v\d+\.\d+$", x="v2.10")
    assert holds(r"x matches (?i)^ERROR\b", x="error: boom")
    assert holds(r"x matches (?P<word>ab)+\z", x="abab")
    assert holds("x matches é", x="café")
    assert not holds(r"x matches ^a$", x="a\nb")


def test_validation_reports_rejected_patterns_at_the_condition() -> None:
    text = (
        "digraph R {\n"
        "  start [shape=Mdiamond]\n"
        "  exit [shape=Msquare]\n"
        '  start -> exit [condition="context.x matches (a)\\\\1"]\n'
        "  start -> exit\n"
        "}\n"
    )
    diags = [d for d in validate(parse(text)) if d.rule == "condition_syntax"]
    assert len(diags) == 1
    assert diags[0].severity == "error"
    assert (diags[0].line, diags[0].column) == (4, 29)
    assert "no backreferences or lookaround" in diags[0].message


def test_re2_is_loaded_only_by_a_matches_condition() -> None:
    code = (
        "import sys\n"
        "from fabro_git.workflow.conditions import parse_condition\n"
        "parse_condition('outcome=succeeded && context.x contains y')\n"
        "assert 're2' not in sys.modules\n"
        "parse_condition('context.x matches ^y')\n"
        "assert 're2' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    # A rejected pattern does not make RE2 print its own log lines.
    code = "from fabro_git.workflow.conditions import compile_pattern as c\ntry: c('(?=x)')\nexcept ValueError: pass\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stderr == ""
