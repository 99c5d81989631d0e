"""Edge conditions: the small boolean language that routes between stages.

Conditions are parsed once into a tree so the validator can reject a bad one before a
run starts (with the column of the mistake), inspect which keys and values it tests,
and so evaluation never re-parses text in the engine's hot path.

Precedence, loosest first: `||`, `&&`, `!`, then a clause (`key op value`, or a bare
key meaning "truthy"). Missing keys read as the empty string. Comparing `outcome`
treats the older spellings (`success`, `fail`, `partial_success`) as the current ones.

`matches` runs RE2 (the `google-re2` package), not Python's `re`: a condition is
evaluated on the engine's event loop, where a backtracking pattern such as `^(a+)+$`
against a long context value would hang the run beyond the reach of Ctrl-C and the
stall watchdog. RE2 matches in linear time and has the syntax of Fabro's Rust `regex`
crate; the price is that backreferences and lookaround are rejected when the condition
is parsed, so validation reports them.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import msgspec

from fabro_git.errors import FabroError

OPERATORS = ("=", "!=", ">", "<", ">=", "<=", "contains", "matches")
OUTCOME_ALIASES: dict[str, str] = {
    "success": "succeeded",
    "fail": "failed",
    "partial_success": "partially_succeeded",
}
STANDARD_OUTCOMES = ("succeeded", "failed", "partially_succeeded", "skipped")

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NUMBER_RE = re.compile(r"\s*[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?\s*\Z")


class ConditionError(FabroError):
    """A condition that does not parse. `offset` is 0-based within the condition text."""

    def __init__(self, message: str, *, offset: int, text: str) -> None:
        self.offset = offset
        self.detail = message
        self.text = text
        super().__init__(f"condition {text!r}, column {offset + 1}: {message}")


class Clause(msgspec.Struct, frozen=True):
    key: str
    op: str | None  # None: a bare key, true when the value is truthy
    value: str
    offset: int


class Not(msgspec.Struct, frozen=True):
    operand: Expr


class AllOf(msgspec.Struct, frozen=True):
    operands: tuple[Expr, ...]


class AnyOf(msgspec.Struct, frozen=True):
    operands: tuple[Expr, ...]


Expr = Clause | Not | AllOf | AnyOf


class Condition(msgspec.Struct, frozen=True):
    text: str
    expr: Expr

    def clauses(self) -> Iterator[Clause]:
        stack: list[Expr] = [self.expr]
        while stack:
            expr = stack.pop()
            if isinstance(expr, Clause):
                yield expr
            elif isinstance(expr, Not):
                stack.append(expr.operand)
            else:
                stack.extend(reversed(expr.operands))

    def evaluate(
        self, *, outcome: str, preferred_label: str | None, context: Mapping[str, object]
    ) -> bool:
        return _eval(self.expr, normalize_outcome(outcome), preferred_label or "", context)


def normalize_outcome(value: str) -> str:
    return OUTCOME_ALIASES.get(value, value)


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, offset: int | None = None) -> ConditionError:
        return ConditionError(
            message, offset=self.pos if offset is None else offset, text=self.text
        )

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def at(self, literal: str) -> bool:
        return self.text.startswith(literal, self.pos)

    def found(self) -> str:
        rest = self.text[self.pos :]
        return repr(rest.split()[0]) if rest.strip() else "the end of the condition"

    def parse(self) -> Expr:
        self.skip()
        if self.pos >= len(self.text):
            raise self.error("empty condition")
        expr = self.any_of()
        self.skip()
        if self.pos < len(self.text):
            raise self.error(
                f"expected '&&', '||' or the end of the condition, found {self.found()}"
            )
        return expr

    def any_of(self) -> Expr:
        operands = [self.all_of()]
        self.skip()
        while self.at("||"):
            self.pos += 2
            operands.append(self.all_of())
            self.skip()
        return operands[0] if len(operands) == 1 else AnyOf(tuple(operands))

    def all_of(self) -> Expr:
        operands = [self.unary()]
        self.skip()
        while self.at("&&"):
            self.pos += 2
            operands.append(self.unary())
            self.skip()
        return operands[0] if len(operands) == 1 else AllOf(tuple(operands))

    def unary(self) -> Expr:
        negations = 0
        self.skip()
        while self.at("!") and not self.at("!="):
            self.pos += 1
            negations += 1
            self.skip()
        expr = self.clause()
        for _ in range(negations):
            expr = Not(expr)
        return expr

    def clause(self) -> Expr:
        self.skip()
        start = self.pos
        found = _KEY_RE.match(self.text, self.pos)
        if not found:
            raise self.error(
                f"expected a key such as outcome or context.NAME, found {self.found()}"
            )
        key = found.group(0)
        if key.endswith(".") or ".." in key:
            raise self.error(f"malformed key {key!r}", start)
        self.pos = found.end()
        self.skip()
        op_at = self.pos
        op = self.operator()
        if op is None:
            return Clause(key, None, "", start)
        written = self.text[op_at : self.pos]
        self.skip()
        value = self.value(written)
        if op == "matches":
            try:
                compile_pattern(value)
            except PatternError as exc:
                raise self.error(f"invalid regular expression {value!r}: {exc}", start) from None
        return Clause(key, op, value, start)

    def operator(self) -> str | None:
        for symbol in ("!=", ">=", "<=", "==", "=", ">", "<"):
            if self.at(symbol):
                self.pos += len(symbol)
                return "=" if symbol == "==" else symbol
        for word in ("contains", "matches"):
            if self.at(word):
                end = self.pos + len(word)
                if end >= len(self.text) or self.text[end].isspace() or self.text[end] == '"':
                    self.pos = end
                    return word
        return None

    def value(self, op: str) -> str:
        if self.at('"'):
            start = self.pos
            self.pos += 1
            parts: list[str] = []
            while True:
                if self.pos >= len(self.text):
                    raise self.error("unterminated quoted value: expected '\"'", start)
                char = self.text[self.pos]
                if char == "\\" and self.pos + 1 < len(self.text):
                    parts.append(self.text[self.pos + 1])
                    self.pos += 2
                    continue
                if char == '"':
                    self.pos += 1
                    return "".join(parts)
                parts.append(char)
                self.pos += 1
        start = self.pos
        while (
            self.pos < len(self.text)
            and not self.text[self.pos].isspace()
            and not self.at("&&")
            and not self.at("||")
        ):
            self.pos += 1
        if self.pos == start:
            raise self.error(f"expected a value after '{op}', found {self.found()}")
        return self.text[start : self.pos]


class Pattern(Protocol):
    """What a condition uses of a compiled RE2 pattern (google-re2 ships no types)."""

    def search(self, text: str) -> object | None: ...


class PatternError(ValueError):
    """A `matches` pattern RE2 does not accept."""


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Pattern:
    """The compiled RE2 pattern; raises `PatternError` with RE2's reason."""
    import re2  # google-re2; loaded only by a `matches` condition

    options = re2.Options()
    options.log_errors = False  # RE2 would print its own copy of the error to stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "not accepted"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        if "perl operator" in reason or "escape sequence" in reason:
            reason += " (RE2 syntax: no backreferences or lookaround)"
        raise PatternError(reason) from None


def parse_condition(text: str) -> Condition:
    """Parse a condition; raises `ConditionError` pointing at the problem."""
    return Condition(text, _Reader(text).parse())


def evaluate_condition(
    condition: str | Condition,
    *,
    outcome: str,
    preferred_label: str | None,
    context: Mapping[str, object],
) -> bool:
    """True when the condition holds; an empty condition always holds."""
    if isinstance(condition, str):
        if not condition.strip():
            return True
        condition = parse_condition(condition)
    return condition.evaluate(outcome=outcome, preferred_label=preferred_label, context=context)


_MISSING = object()


def _lookup(context: Mapping[str, object], key: str) -> object:
    if key in context:
        return context[key]
    # Fall back to walking nested mappings: "a.b" in {"a": {"b": 1}}.
    current: object = context
    for part in key.split("."):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        else:
            return _MISSING
    return current


def _resolve(key: str, outcome: str, preferred_label: str, context: Mapping[str, object]) -> object:
    if key == "outcome":
        return outcome
    if key == "preferred_label":
        return preferred_label
    if key.startswith("context."):
        value = _lookup(context, key)
        if value is _MISSING:
            value = _lookup(context, key[len("context.") :])
    else:
        value = _lookup(context, key)
    return "" if value is _MISSING or value is None else value


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _number(value: str) -> float | None:
    if not _NUMBER_RE.match(value):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _truthy(value: object) -> bool:
    text = _text(value).strip()
    return text != "" and text.lower() != "false" and text != "0"


def _equal(left: str, right: str) -> bool:
    if left == right:
        return True
    a, b = _number(left), _number(right)
    return a is not None and b is not None and a == b


def _clause(
    clause: Clause, outcome: str, preferred_label: str, context: Mapping[str, object]
) -> bool:
    raw = _resolve(clause.key, outcome, preferred_label, context)
    if clause.op is None:
        return _truthy(raw)
    value = clause.value
    if clause.op in ("contains",):
        if isinstance(raw, Sequence | set | frozenset) and not isinstance(raw, str | bytes):
            return any(_text(item) == value for item in raw)
        return value in _text(raw)
    left = _text(raw)
    if clause.key == "outcome":
        value = normalize_outcome(value)
    if clause.op == "=":
        return _equal(left, value)
    if clause.op == "!=":
        return not _equal(left, value)
    if clause.op == "matches":
        try:
            return compile_pattern(value).search(left) is not None
        except PatternError:
            return False
    return _compare(clause.op, left, value)


_ORDER: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}


def _compare(op: str, left: str, right: str) -> bool:
    """`left op right` as numbers; false when either is not one."""
    a, b = _number(left), _number(right)
    if a is None or b is None:
        return False
    return _ORDER.get(op, operator.le)(a, b)


def _eval(expr: Expr, outcome: str, preferred_label: str, context: Mapping[str, object]) -> bool:
    if isinstance(expr, Clause):
        return _clause(expr, outcome, preferred_label, context)
    if isinstance(expr, Not):
        return not _eval(expr.operand, outcome, preferred_label, context)
    if isinstance(expr, AllOf):
        return all(_eval(item, outcome, preferred_label, context) for item in expr.operands)
    return any(_eval(item, outcome, preferred_label, context) for item in expr.operands)
