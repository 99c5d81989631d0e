"""Prompt templates and `@file` prompt references.

Only two names exist in a template, `goal` and `inputs.NAME`, so this is a small
scanner rather than a template engine: it is strict by default (a typo must fail the
run before a model sees the literal braces), it supports `{% raw %}` for text that
contains braces, and `$goal` from older workflows. The validator uses the same scanner
through `template_variables`, so what validates is exactly what renders.

Values never become code. In prompts, labels and questions a template is replaced by
the value's text, for a model or a person to read. In a shell `script` (and the legacy
`tool_command`) it is replaced by a reference to an environment variable that holds the
value (`{{ goal }}` becomes `${FABRO_GOAL}`, `{{ inputs.name }}` becomes
`${FABRO_INPUT_NAME}`): the shell expands a variable after parsing the command, so the
value is data whatever it contains, where quoting it by hand would still let `$(...)`
run inside double quotes. The reference is fitted to the quoting around it (see
`shell`), so `echo '{{ goal }}'` prints the goal too. A python script cannot take either form safely (inside a
string literal an expression is just text), so templates there are refused and the
script reads `os.environ`. Literal expressions (`{{ "text" }}`) and `{% raw %}` are
written by the workflow's author and stay text, and `$goal` in a script is the shell's
own variable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping

from fabro_git.errors import ConfigError, FabroError
from fabro_git.workflow.model import Graph, Node
from fabro_git.workflow.paths import is_file_ref as is_file_ref

_RAW_OPEN = re.compile(r"\{%-?\s*raw\s*-?%\}")
_RAW_CLOSE = re.compile(r"\{%-?\s*endraw\s*-?%\}")
_INPUT_RE = re.compile(r"inputs\.([A-Za-z_][A-Za-z0-9_-]*)\Z")
_LITERAL_RE = re.compile(r"""(?:'([^']*)'|"([^"]*)")\Z""")
_LEGACY_GOAL = re.compile(r"\$goal(?![A-Za-z0-9_])")
_INPUT_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")

GOAL_ENV = "FABRO_GOAL"
INPUT_ENV_PREFIX = "FABRO_INPUT_"


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
    """Substitute `{{ goal }}`, `{{ inputs.NAME }}` and `$goal` in `text` by their values.

    For text that a model or a person reads, never for a script (see `render_script`).
    With `strict`, an unknown name, an unsupported tag or an unclosed brace raises
    `TemplateError`; without it such text is left as written.
    """

    def value(name: str, _offset: int, _before: list[str]) -> str | None:
        if name == "goal":
            return goal
        match = _INPUT_RE.match(name)
        if match and match.group(1) in inputs:
            return str(inputs[match.group(1)])
        return None

    return _substitute(text, value, legacy_goal=goal, strict=strict)


def render_script(
    text: str, *, inputs: Collection[str], language: str = "shell", strict: bool = True
) -> str:
    """Substitute `{{ goal }}` and `{{ inputs.NAME }}` in a script by variable references.

    The values themselves reach the script through `script_environment`. The reference
    fits the quoting around it (`shell.reference`), so `echo '{{ goal }}'` and
    `echo "{{ goal }}"` both print the goal. `$goal` is left to the shell. In a python
    script a reference raises `TemplateError` naming the `os.environ` key to read instead.
    """
    from fabro_git.workflow import shell

    quoting = shell.ShellQuoting()
    fed = 0

    def reference(name: str, offset: int, before: list[str]) -> str | None:
        nonlocal fed
        match = _INPUT_RE.match(name)
        if name != "goal" and not (match and match.group(1) in inputs):
            return None
        env = variable_env_name(name)
        assert env is not None
        if language == "python":
            raise TemplateError(
                f"{{{{ {name} }}}} cannot be used in a python script (a value pasted into "
                f"python code could run as code): read os.environ[{env!r}] instead",
                offset=offset,
            )
        quoting.feed("".join(before[fed:]))
        fed = len(before) + 1  # the reference itself is appended next
        text = shell.reference(env, quoting.state())
        if text is None:
            raise TemplateError(
                f"{{{{ {name} }}}} is in a here-document with a quoted delimiter, where the "
                f"shell expands nothing: unquote the delimiter or write ${env} outside it",
                offset=offset,
            )
        quoting.feed(text)
        return text

    return _substitute(text, reference, legacy_goal=None, strict=strict)


def variable_env_name(name: str) -> str | None:
    """The environment variable a script reads for template variable `name`."""
    if name == "goal":
        return GOAL_ENV
    match = _INPUT_RE.match(name)
    return input_env_name(match.group(1)) if match else None


def input_env_name(name: str) -> str:
    """The environment variable that carries input `name` to scripts: `FABRO_INPUT_` and
    the name upper-cased, with `-` written `_` (`repo-url` -> `FABRO_INPUT_REPO_URL`)."""
    return INPUT_ENV_PREFIX + name.upper().replace("-", "_")


def check_input_names(inputs: Collection[str]) -> None:
    """Refuse input names that cannot map to one environment variable each."""
    owners: dict[str, str] = {}
    for name in inputs:
        if not _INPUT_NAME_RE.match(name):
            raise ConfigError(
                f"input name {name!r} cannot be passed to scripts as an environment variable",
                hint="name inputs with letters, digits, '_' and '-', starting with a letter or '_'",
            )
        env = input_env_name(name)
        if env in owners:
            raise ConfigError(
                f"inputs {owners[env]!r} and {name!r} would both be passed to scripts as {env}",
                hint="rename one of them: input names may differ only in more than case and '-' vs '_'",
            )
        owners[env] = name


# Linux refuses to start a program with one environment string longer than this
# (MAX_ARG_STRLEN, `NAME=value` and its NUL).
ENV_STRING_LIMIT = 131_072


def check_script_values(goal: str, inputs: Mapping[str, str]) -> None:
    """Refuse, before a run starts, a value too long to hand a script in its environment."""
    values = {GOAL_ENV: goal, **{input_env_name(k): str(v) for k, v in inputs.items()}}
    for env, value in values.items():
        size = len(env.encode()) + 1 + len(value.encode()) + 1
        if size > ENV_STRING_LIMIT:
            what = "the goal" if env == GOAL_ENV else f"input {env[len(INPUT_ENV_PREFIX) :]}"
            raise ConfigError(
                f"{what} is {len(value.encode())} bytes, too long for the environment of this "
                f"workflow's scripts, which read it as ${env} (the limit is about "
                f"{ENV_STRING_LIMIT // 1024} KiB)",
                hint="shorten it, or commit the text to a file in the repository and name the file",
            )


def script_environment(
    base: Mapping[str, str],
    *,
    goal: str,
    inputs: Mapping[str, str],
    run_id: str,
    node_id: str | None = None,
) -> dict[str, str]:
    """`base` with the run's values for a script: FABRO_GOAL, FABRO_INPUT_*, FABRO_RUN_ID
    and, for a stage, FABRO_NODE_ID. Inherited FABRO_INPUT_* are dropped, so a script
    sees exactly this run's inputs."""
    env = {k: v for k, v in base.items() if not k.startswith(INPUT_ENV_PREFIX)}
    env[GOAL_ENV] = goal
    env.update((input_env_name(name), str(value)) for name, value in inputs.items())
    env["FABRO_RUN_ID"] = run_id
    if node_id is not None:
        env["FABRO_NODE_ID"] = node_id
    else:
        env.pop("FABRO_NODE_ID", None)
    return env


def _substitute(
    text: str,
    value: Callable[[str, int, list[str]], str | None],
    *,
    legacy_goal: str | None,
    strict: bool,
) -> str:
    """The one rendering loop: `value(name, offset, output so far)` gives a known name's
    replacement, or None for an input the run lacks; `legacy_goal` replaces `$goal`
    unless None."""

    def legacy(part: str) -> str:
        if legacy_goal is None:
            return part
        return _LEGACY_GOAL.sub(lambda _m: legacy_goal, part)

    out: list[str] = []
    try:
        segments = list(_segments(text))
    except TemplateError:
        if strict:
            raise
        return legacy(text)
    for kind, part, offset in segments:
        if kind == "text":
            out.append(legacy(part))
        elif kind == "raw":
            out.append(part)
        elif kind == "tag":
            if strict:
                raise TemplateError(
                    f"unsupported template tag '{{%{part}%}}': only {{% raw %}} is available",
                    offset=offset,
                )
            out.append("{%" + part + "%}")
        else:
            out.append(_expression_value(part, offset, value, out, strict=strict))
    return "".join(out)


def _expression_value(
    part: str,
    offset: int,
    value: Callable[[str, int, list[str]], str | None],
    out: list[str],
    *,
    strict: bool,
) -> str:
    """What `{{ part }}` renders as; not strict, an unknown name stays as written."""
    name, literal = _expression(part)
    if literal is not None:
        return literal
    replacement = value(name, offset, out)
    if replacement is not None:
        return replacement
    if not strict:
        return "{{" + part + "}}"
    if _INPUT_RE.match(name):
        raise TemplateError(
            f"undefined input {{{{ {name} }}}}: pass it with -V {name[7:]}=VALUE",
            offset=offset,
        )
    raise TemplateError(
        f"unknown template variable {{{{ {name} }}}}: only goal and inputs.NAME exist",
        offset=offset,
    )


def template_variables(text: str) -> set[str]:
    """Names a template refers to, e.g. {"goal", "inputs.name"}.

    Raises `TemplateError` for malformed template syntax. Tags other than raw are
    reported as "%NAME" so callers can flag them.
    """
    return {name for name, _offset in template_references(text)}


def template_references(text: str, *, legacy_goal: bool = True) -> list[tuple[str, int]]:
    """Like `template_variables`, with the offset of each reference in `text`.

    `legacy_goal=False` reads a script, where `$goal` is not a reference."""
    refs: list[tuple[str, int]] = []
    for kind, value, offset in _segments(text):
        if kind == "text" and legacy_goal:
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
