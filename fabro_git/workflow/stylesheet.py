"""Model stylesheets: CSS-like rules that pick models for nodes.

A workflow names its models in one place (`model_stylesheet`) instead of on every node.
Rules match by `*`, shape, `.class` or `#id`; the most specific rule wins, a later rule
wins a tie, and anything written on the node itself wins over every rule. Applying the
stylesheet at load time means every consumer (engine, `graph`, `inspect`) sees the same
resolved `model`/`provider`/... attributes.
"""

from __future__ import annotations

import re

import msgspec

from fabro_git.errors import FabroError
from fabro_git.workflow.model import Graph, Node

PROPERTIES: tuple[str, ...] = ("model", "provider", "reasoning_effort", "speed", "backend")
ALIASES: dict[str, str] = {"llm_model": "model", "llm_provider": "provider"}

SPECIFICITY = {"*": 0, "shape": 1, "class": 2, "id": 3}

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_CLASS_RE = re.compile(r"[A-Za-z0-9_-]+")
_PROPERTY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class StylesheetError(FabroError):
    """A stylesheet that does not parse; `line`/`column` are within the stylesheet text."""

    def __init__(self, message: str, *, offset: int, text: str) -> None:
        self.offset = offset
        self.line = text.count("\n", 0, offset) + 1
        self.column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        self.detail = message
        super().__init__(f"model_stylesheet line {self.line}, column {self.column}: {message}")


class Declaration(msgspec.Struct, frozen=True):
    property: str
    value: str
    offset: int


class Rule(msgspec.Struct, frozen=True):
    kind: str  # "*", "shape", "class" or "id"
    name: str  # empty for "*"
    declarations: tuple[Declaration, ...]
    offset: int

    @property
    def specificity(self) -> int:
        return SPECIFICITY[self.kind]

    def matches(self, node: Node) -> bool:
        if self.kind == "*":
            return True
        if self.kind == "shape":
            return node.shape == self.name
        if self.kind == "class":
            return self.name in node.classes
        return node.id == self.name


class Stylesheet(msgspec.Struct, frozen=True):
    rules: tuple[Rule, ...]

    def resolve(self, node: Node) -> dict[str, str]:
        """Properties the rules give `node`, ignoring what the node sets itself."""
        matching = [rule for rule in self.rules if rule.matches(node)]
        # A stable sort keeps file order within one specificity: later rules apply last.
        matching.sort(key=lambda rule: rule.specificity)
        out: dict[str, str] = {}
        for rule in matching:
            for declaration in rule.declarations:
                out[declaration.property] = declaration.value
        return out


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, offset: int | None = None) -> StylesheetError:
        return StylesheetError(
            message, offset=self.pos if offset is None else offset, text=self.text
        )

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def found(self) -> str:
        return repr(self.peek()) if self.peek() else "the end of the stylesheet"

    def match(self, pattern: re.Pattern[str]) -> str | None:
        found = pattern.match(self.text, self.pos)
        if not found:
            return None
        self.pos = found.end()
        return found.group(0)

    def rules(self) -> tuple[Rule, ...]:
        rules: list[Rule] = []
        self.skip_space()
        while self.pos < len(self.text):
            rules.append(self.rule())
            self.skip_space()
        return tuple(rules)

    def rule(self) -> Rule:
        start = self.pos
        char = self.peek()
        if char == "*":
            self.pos += 1
            kind, name = "*", ""
        elif char in ".#":
            self.pos += 1
            pattern = _CLASS_RE if char == "." else _NAME_RE
            name_or_none = self.match(pattern)
            if name_or_none is None:
                what = "class name" if char == "." else "node id"
                raise self.error(f"expected a {what} after '{char}', found {self.found()}")
            kind, name = ("class" if char == "." else "id"), name_or_none
        else:
            shape = self.match(_NAME_RE)
            if shape is None:
                raise self.error(
                    f"expected a selector ('*', a shape, '.class' or '#id'), found {self.found()}"
                )
            kind, name = "shape", shape
        self.skip_space()
        if self.peek() != "{":
            raise self.error(f"expected '{{' after the selector, found {self.found()}")
        self.pos += 1
        declarations: list[Declaration] = []
        while True:
            self.skip_space()
            if self.peek() == "}":
                self.pos += 1
                break
            if self.peek() == ";":
                self.pos += 1
                continue
            if not self.peek():
                raise self.error("unterminated rule: expected '}'", start)
            declarations.append(self.declaration(start))
        return Rule(kind, name, tuple(declarations), start)

    def declaration(self, rule_start: int) -> Declaration:
        start = self.pos
        prop = self.match(_PROPERTY_RE)
        if prop is None:
            raise self.error(f"expected a property name, found {self.found()}")
        canonical = ALIASES.get(prop, prop)
        if canonical not in PROPERTIES:
            raise self.error(
                f"unknown property {prop!r}: expected one of {', '.join(PROPERTIES)}", start
            )
        self.skip_space()
        if self.peek() != ":":
            raise self.error(f"expected ':' after {prop!r}, found {self.found()}")
        self.pos += 1
        self.skip_space()
        value_at = self.pos
        if self.peek() in ('"', "'"):
            quote = self.peek()
            end = self.text.find(quote, self.pos + 1)
            if end < 0:
                raise self.error("unterminated quoted value", value_at)
            value = self.text[self.pos + 1 : end]
            self.pos = end + 1
        else:
            while self.pos < len(self.text) and self.text[self.pos] not in ";}\n":
                self.pos += 1
            value = self.text[value_at : self.pos].strip()
        if not value:
            raise self.error(f"expected a value for {prop!r}", value_at)
        self.skip_space()
        if not self.peek():
            raise self.error("unterminated rule: expected '}'", rule_start)
        if self.peek() not in (";", "}"):
            raise self.error(
                f"expected ';' or '}}' after the value of {prop!r}, found {self.found()}"
            )
        return Declaration(canonical, value, value_at)


def parse_stylesheet(text: str) -> Stylesheet:
    """Parse stylesheet text; raises `StylesheetError` with its position."""
    return Stylesheet(_Reader(text).rules())


def apply_stylesheet(graph: Graph) -> None:
    """Fill each node's model settings from the graph's stylesheet.

    `llm_model`/`llm_provider` written on a node count as `model`/`provider`. A
    stylesheet that does not parse changes nothing; the validator reports it.
    """
    for node in graph.nodes.values():
        for alias, canonical in ALIASES.items():
            if alias in node.attrs and canonical not in node.attrs:
                node.attrs[canonical] = node.attrs[alias]
                if alias in node.positions:
                    node.positions[canonical] = node.positions[alias]
    text = graph.attrs.get("model_stylesheet", "")
    if not text.strip():
        return
    try:
        sheet = parse_stylesheet(text)
    except StylesheetError:
        return
    for node in graph.nodes.values():
        for key, value in sheet.resolve(node).items():
            if key not in node.attrs:
                node.attrs[key] = value
                node.styled.add(key)
