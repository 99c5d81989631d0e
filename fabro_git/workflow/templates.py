"""Prompt templates and `@file` prompt references.

Only two names exist in a template, `goal` and `inputs.NAME`, so this is a small
scanner rather than a template engine: it is strict by default (a typo must fail the
run before a model sees the literal braces), it supports `{% raw %}` for text that
contains braces, and `$goal` from older workflows. The validator uses the same scanner
through `template_variables`, so what validates is exactly what renders.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from fabro_git.errors import FabroError
from fabro_git.workflow.model import Graph, Node
from fabro_git.workflow.paths import is_file_ref as is_file_ref

_RAW_OPEN = re.compile(r"\{%-?\s*raw\s*-?%\}")
_RAW_CLOSE = re.compile(r"\{%-?\s*endraw\s*-?%\}")
_INPUT_RE = re.compile(r"inputs\.([A-Za-z_][A-Za-z0-9_-]*)\Z")
_LITERAL_RE = re.compile(r"""(?:'([^']*)'|"([^"]*)")\Z""")
_LEGACY_GOAL = re.compile(r"\$goal(?![A-Za-z0-9_])")


class TemplateError(FabroError):
    """A template that cannot be rendered: unknown name or malformed syntax."""

    def __init__(self, message: str, *, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


def _segments(text: str) -> Iterator[tuple[str, str, int]]:
    """Yield ("text", s, offset), ("expr", inner, offset) and ("tag", inner, offset)."""
    pos = 0
    while pos < len(text):
        brace = text.find("{", pos)
        while brace >= 0 and text[brace + 1 : brace + 2] not in ("{", "%", "#"):
            brace = text.find("{", brace + 1)
        if brace < 0:
            yield "text", text[pos:], pos
            return
        if brace > pos:
            yield "text", text[pos:brace], pos
        opener = text[brace + 1]
        if opener == "%":
            raw = _RAW_OPEN.match(text, brace)
            if raw:
                close = _RAW_CLOSE.search(text, raw.end())
                if close is None:
                    raise TemplateError(
                        "'{% raw %}' without a matching '{% endraw %}'", offset=brace
                    )
                yield "raw", text[raw.end() : close.start()], raw.end()
                pos = close.end()
                continue
        closer = {"{": "}}", "%": "%}", "#": "#}"}[opener]
        end = (
            _find_closer(text, brace + 2, closer) if opener == "{" else text.find(closer, brace + 2)
        )
        if end < 0:
            if opener != "{":
                # `${#array[@]}` in a shell script is not a template comment.
                yield "text", text[brace : brace + 2], brace
                pos = brace + 2
                continue
            raise TemplateError("'{{' without a matching '}}'", offset=brace)
        inner = text[brace + 2 : end]
        if opener == "{":
            yield "expr", inner, brace
        elif opener == "%":
            yield "tag", inner, brace
        pos = end + 2


def _find_closer(text: str, start: int, closer: str) -> int:
    """Index of `closer`, skipping quoted strings (`{{ "}}" }}` is one expression)."""
    pos = start
    while pos < len(text):
        char = text[pos]
        if char in "'\"":
            end = text.find(char, pos + 1)
            if end < 0:
                return text.find(closer, pos)
            pos = end + 1
            continue
        if text.startswith(closer, pos):
            return pos
        pos += 1
    return -1


def _expression(inner: str) -> tuple[str, str | None]:
    """(normalised name, literal text or None) for the inside of `{{ ... }}`."""
    expr = inner.strip()
    if expr.startswith("-"):
        expr = expr[1:]
    if expr.endswith("-"):
        expr = expr[:-1]
    expr = expr.strip()
    literal = _LITERAL_RE.match(expr)
    if literal:
        return "", literal.group(1) if literal.group(1) is not None else literal.group(2)
    return re.sub(r"\s+", " ", expr), None


def render(text: str, *, goal: str, inputs: Mapping[str, str], strict: bool = True) -> str:
    """Substitute `{{ goal }}`, `{{ inputs.NAME }}` and `$goal` in `text`.

    With `strict`, an unknown name, an unsupported tag or an unclosed brace raises
    `TemplateError`; without it such text is left as written.
    """
    out: list[str] = []
    try:
        segments = list(_segments(text))
    except TemplateError:
        if strict:
            raise
        return _LEGACY_GOAL.sub(lambda _m: goal, text)
    for kind, value, offset in segments:
        if kind == "text":
            out.append(_LEGACY_GOAL.sub(lambda _m: goal, value))
        elif kind == "raw":
            out.append(value)
        elif kind == "tag":
            if strict:
                raise TemplateError(
                    f"unsupported template tag '{{%{value}%}}': only {{% raw %}} is available",
                    offset=offset,
                )
            out.append("{%" + value + "%}")
        else:
            name, literal = _expression(value)
            if literal is not None:
                out.append(literal)
            elif name == "goal":
                out.append(goal)
            elif (match := _INPUT_RE.match(name)) and match.group(1) in inputs:
                out.append(str(inputs[match.group(1)]))
            elif strict:
                if _INPUT_RE.match(name):
                    raise TemplateError(
                        f"undefined input {{{{ {name} }}}}: pass it with -V {name[7:]}=VALUE",
                        offset=offset,
                    )
                raise TemplateError(
                    f"unknown template variable {{{{ {name} }}}}: only goal and inputs.NAME exist",
                    offset=offset,
                )
            else:
                out.append("{{" + value + "}}")
    return "".join(out)


def template_variables(text: str) -> set[str]:
    """Names a template refers to, e.g. {"goal", "inputs.name"}.

    Raises `TemplateError` for malformed template syntax. Tags other than raw are
    reported as "%NAME" so callers can flag them.
    """
    return {name for name, _offset in template_references(text)}


def template_references(text: str) -> list[tuple[str, int]]:
    """Like `template_variables`, with the offset of each reference in `text`."""
    refs: list[tuple[str, int]] = []
    for kind, value, offset in _segments(text):
        if kind == "text":
            refs.extend(("goal", offset + m.start()) for m in _LEGACY_GOAL.finditer(value))
        elif kind == "expr":
            name, literal = _expression(value)
            if literal is None:
                refs.append((name, offset))
        elif kind == "tag":
            refs.append(("%" + value.strip(), offset))
    return refs


def is_known_variable(name: str) -> bool:
    return name == "goal" or _INPUT_RE.match(name) is not None


def load_prompt(node: Node, graph: Graph) -> str | None:
    """The node's prompt text, reading an `@file` reference; None without a prompt."""
    from fabro_git.workflow.paths import read_prompt

    text = read_prompt(graph, node)
    return text if text is not None else node.prompt
