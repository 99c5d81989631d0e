"""The condition language: parsing, errors with columns, and evaluation semantics."""

from __future__ import annotations

import pytest

from fabro_git.workflow.conditions import (
    AllOf,
    AnyOf,
    Clause,
    ConditionError,
    Not,
    evaluate_condition,
    parse_condition,
)


def holds(
    text: str, outcome: str = "succeeded", label: str | None = None, **context: object
) -> bool:
    return evaluate_condition(text, outcome=outcome, preferred_label=label, context=context)


def test_and_binds_tighter_than_or() -> None:
    expr = parse_condition("a=1 && b=2 || c").expr
    assert isinstance(expr, AnyOf)
    assert isinstance(expr.operands[0], AllOf)
    assert expr.operands[1] == Clause("c", None, "", 14)


def test_not_and_clause_offsets() -> None:
    expr = parse_condition("!!outcome=failed").expr
    assert isinstance(expr, Not) and isinstance(expr.operand, Not)
    assert expr.operand.operand == Clause("outcome", "=", "failed", 2)


@pytest.mark.parametrize(
    ("text", "op", "value"),
    [
        ("k=v", "=", "v"),
        ("k == v", "=", "v"),
        ("k!=v", "!=", "v"),
        ("k > 8", ">", "8"),
        ("k<8", "<", "8"),
        ("k>=8", ">=", "8"),
        ("k <= 8", "<=", "8"),
        ("k contains err", "contains", "err"),
        (r"k matches ^v\d+", "matches", r"^v\d+"),
        ('k = "two words && more"', "=", "two words && more"),
        (r'k="say \"hi\""', "=", 'say "hi"'),
    ],
)
def test_operators_and_values(text: str, op: str, value: str) -> None:
    clause = next(parse_condition(text).clauses())
    assert (clause.key, clause.op, clause.value) == ("k", op, value)


@pytest.mark.parametrize(
    ("text", "offset", "fragment"),
    [
        ("", 0, "empty condition"),
        ("outcome=", 8, "expected a value after '='"),
        ("outcome=succeeded &&", 20, "expected a key"),
        ("&& x", 0, "expected a key"),
        ("outcome succeeded", 8, "expected '&&', '||' or the end"),
        ('x="open', 2, "unterminated quoted value"),
        ("x matches (", 0, "invalid regular expression"),
        ("x. = 1", 0, "malformed key"),
        ("a=1 || || b", 7, "expected a key"),
    ],
)
def test_syntax_errors_carry_offsets(text: str, offset: int, fragment: str) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert info.value.offset == offset
    assert fragment in info.value.detail
    assert f"column {offset + 1}" in str(info.value)


def test_empty_condition_always_holds_when_evaluated_directly() -> None:
    assert holds("") and holds("   ")


@pytest.mark.parametrize(
    ("text", "outcome", "expected"),
    [
        ("outcome=succeeded", "succeeded", True),
        ("outcome=success", "succeeded", True),
        ("outcome=succeeded", "success", True),
        ("outcome=fail", "failed", True),
        ("outcome=failed", "fail", True),
        ("outcome=partial_success", "partially_succeeded", True),
        ("outcome!=success", "failed", True),
        ("outcome!=success", "succeeded", False),
        ("!outcome=failed", "succeeded", True),
        ("outcome=succeeded || outcome=partially_succeeded", "partially_succeeded", True),
        ("outcome=skipped", "succeeded", False),
    ],
)
def test_outcome_and_its_aliases(text: str, outcome: str, expected: bool) -> None:
    assert holds(text, outcome=outcome) is expected


def test_preferred_label() -> None:
    assert holds("preferred_label=Fix", label="Fix")
    assert not holds("preferred_label=Fix", label="Approve")
    assert not holds("preferred_label=Fix", label=None)
    assert holds('preferred_label="[A] Approve"', label="[A] Approve")


def test_context_lookup_forms() -> None:
    ctx = {"tests_passed": True, "human.gate.selected": "A", "nested": {"deep": {"v": 3}}}

    def in_ctx(text: str) -> bool:
        return evaluate_condition(text, outcome="succeeded", preferred_label=None, context=ctx)

    assert in_ctx("context.tests_passed=true")
    assert in_ctx("tests_passed=true")
    assert in_ctx("context.human.gate.selected=A")
    assert in_ctx("human.gate.selected=A")
    assert in_ctx("context.nested.deep.v=3")
    assert not in_ctx("context.nested.deep.v=4")
    assert evaluate_condition(
        "context.x=1", outcome="succeeded", preferred_label=None, context={"context.x": "1"}
    )


def test_missing_keys_are_empty() -> None:
    assert holds("missing=''") is False
    assert holds('missing=""')
    assert holds("missing!=anything")
    assert not holds("missing")
    assert not holds("missing contains x")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("yes", True), ("", False), ("false", False), ("False", False), ("0", False), (0, False),
     (False, False), (True, True), (None, False), ("0.0", True), (2, True)],
)  # fmt: skip
def test_bare_key_truthiness(value: object, expected: bool) -> None:
    assert holds("flag", flag=value) is expected
    assert holds("!flag", flag=value) is (not expected)


def test_numeric_comparisons() -> None:
    assert holds("score > 80", score=81)
    assert not holds("score > 80", score="80")
    assert holds("score >= 80", score="80.0")
    assert holds("context.count < 5", count="4")
    assert holds("count <= 10", count=10)
    assert holds("score > 9", score="10")  # numbers, not strings: "10" < "9" as text
    assert not holds("score > 80", score="high")
    assert not holds("score > eighty", score=90)
    assert not holds("score > 80")
    assert holds("n = 1.0", n=1)


def test_contains_substring_and_membership() -> None:
    assert holds("context.log contains error", log="an error occurred")
    assert not holds("log contains error", log="all good")
    assert holds("tags contains urgent", tags=["urgent", "bug"])
    assert not holds("tags contains urg", tags=["urgent"])


def test_matches_regex() -> None:
    assert holds(r"context.version matches ^v2\.", version="v2.1")
    assert not holds(r"version matches ^v2\.", version="v3.0")


def test_and_or_not_combinations() -> None:
    text = "outcome=succeeded && context.ready=true || context.override"
    assert holds(text, ready="true")
    assert not holds(text, outcome="failed", ready="true")
    assert holds(text, outcome="failed", override="yes")
    assert holds("a=1&&b=2", a=1, b=2)
    assert not holds("a=1&&b=2", a=1, b=3)


def test_parsed_condition_can_be_reused() -> None:
    condition = parse_condition("x=1")
    assert evaluate_condition(
        condition, outcome="succeeded", preferred_label=None, context={"x": 1}
    )
    assert not condition.evaluate(outcome="succeeded", preferred_label=None, context={"x": 2})
