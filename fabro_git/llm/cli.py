"""Agent CLIs as a backend: how each is invoked, and how its output is read.

An agent stage with `backend="cli"` hands its prompt to an installed coding agent
(`claude`, `codex`, `gemini`) that runs its own tool loop. The node's provider picks
the profile; `[run.agent] cli_command` names any other program. A command is always an
argv list, never a shell line: the prompt reaches the program on its standard input
(and, where a CLI takes it no other way, as one argv item), so no part of it is ever
parsed as shell code.

Each profile reads its CLI's machine output: the final response text, the tokens used
and, where the CLI says, the cost and the model that answered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fabro_git import redact
from fabro_git.jsondata import JsonObject
from fabro_git.llm.types import Usage

# A prompt longer than this does not go into an argv item (Linux caps one at 128 KiB).
ARGV_PROMPT_LIMIT = 100_000


@dataclass(frozen=True)
class CliProfile:
    provider: str
    program: str
    output: str  # "claude-json", "codex-jsonl", "gemini-json" or "text"


PROFILES: dict[str, CliProfile] = {
    "anthropic": CliProfile("anthropic", "claude", "claude-json"),
    "openai": CliProfile("openai", "codex", "codex-jsonl"),
    "gemini": CliProfile("gemini", "gemini", "gemini-json"),
}


@dataclass(frozen=True)
class CliInvocation:
    argv: list[str]
    output: str
    custom: bool  # from `[run.agent] cli_command`
    prompt_on_stdin: bool = True


class NoProfile(Exception):
    """The provider has no built-in CLI and the run config names none."""


def program_for(provider: str, custom: Sequence[str] | None) -> str:
    """The program a CLI stage of `provider` runs (argv[0])."""
    if custom:
        return custom[0]
    profile = PROFILES.get(provider)
    if profile is None:
        raise NoProfile(provider)
    return profile.program


# Each CLI's own flags for the agents' permission levels (`fabro_git.agent.permissions`):
# claude's permission modes, codex's sandboxes, gemini's approval modes. Nobody can
# answer a CLI's own prompts, so what a level does not allow is refused, not asked.
PERMISSION_FLAGS: dict[str, dict[str, list[str]]] = {
    "claude": {
        "read-only": ["--permission-mode", "plan"],
        "read-write": ["--permission-mode", "acceptEdits"],
        "full": ["--permission-mode", "bypassPermissions"],
    },
    "codex": {
        "read-only": ["--sandbox", "read-only"],
        "read-write": ["--full-auto"],
        "full": ["--sandbox", "danger-full-access"],
    },
    "gemini": {
        "read-only": ["--approval-mode", "default"],
        "read-write": ["--approval-mode", "auto_edit"],
        "full": ["--approval-mode", "yolo"],
    },
}


def invocation(
    provider: str,
    *,
    model: str | None,
    prompt: str,
    prompt_file: str,
    worktree: str,
    node_id: str,
    custom: Sequence[str] | None = None,
    custom_output: str | None = None,
    permissions: str = "read-write",
) -> CliInvocation:
    """The argv for one stage. Placeholders in a custom command are replaced item by
    item; the prompt never passes through a shell. A built-in profile passes its CLI's
    flags for the `permissions` level; a custom command gets none (the caller says the
    level cannot be enforced)."""
    if custom:
        values = {
            "{prompt_file}": prompt_file,
            "{prompt}": prompt,
            "{model}": model or "",
            "{worktree}": worktree,
            "{node_id}": node_id,
        }
        argv = [_fill(item, values) for item in custom]
        return CliInvocation(argv, custom_output or "text", custom=True)
    profile = PROFILES.get(provider)
    if profile is None:
        raise NoProfile(provider)
    with_model = ["--model", model] if model else []
    level = PERMISSION_FLAGS[profile.program][permissions]
    if profile.program == "claude":
        # The prompt comes on stdin.
        argv = ["claude", "-p", "--output-format", "json", *level, *with_model]
    elif profile.program == "codex":
        # `-` reads the prompt from stdin.
        argv = ["codex", "exec", "--json", *level, *with_model, "-"]
    else:
        # gemini appends -p to what stdin holds; a short prompt goes in -p alone.
        inline = len(prompt.encode()) <= ARGV_PROMPT_LIMIT
        argv = [
            "gemini",
            "--output-format",
            "json",
            *level,
            *with_model,
            "-p",
            prompt if inline else "Carry out the task given above.",
        ]
        return CliInvocation(argv, profile.output, custom=False, prompt_on_stdin=not inline)
    return CliInvocation(argv, profile.output, custom=False)


def _fill(item: str, values: Mapping[str, str]) -> str:
    # One pass: a value that itself holds "{model}" is left as it is.
    return re.sub(r"\{[a-z_]+\}", lambda m: values.get(m[0], m[0]), item)


@dataclass
class CliReply:
    """What a CLI said: its final text, the tokens it reports, and any error it gave."""

    text: str
    usage: Usage | None = None
    cost: float | None = None
    model: str | None = None
    tool_calls: int = 0
    error: str | None = None
    raw: JsonObject = field(default_factory=dict)


def parse_output(output: str, stdout: bytes) -> CliReply:
    """The reply in `stdout` for the output format `output`; a reply with `error` set
    when the output is not what the format promises."""
    text = stdout.decode("utf-8", "replace")
    if output == "text":
        return CliReply(text=text.strip())
    objects = _json_objects(text)
    if not objects:
        tail = text.strip().splitlines()[-1:] or ["no output"]
        return CliReply(
            text="", error=f"expected {output} output, got: {redact.clip(tail[0], 200)}"
        )
    if output == "claude-json":
        return _claude(objects)
    if output == "codex-jsonl":
        return _codex(objects)
    return _gemini(objects)


def _json_objects(text: str) -> list[JsonObject]:
    """The JSON objects of a document or of JSON lines, in order."""
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    if isinstance(whole, list):
        return [item for item in whole if isinstance(item, dict)]
    found = []
    # JSON lines end at "\n" alone: a CLI written in JavaScript or Rust leaves U+2028,
    # U+2029 and U+0085 raw in a string, where `str.splitlines` would cut a line.
    for line in text.split("\n"):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            found.append(item)
    return found


def _table(parent: JsonObject, key: str) -> JsonObject:
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _claude(objects: list[JsonObject]) -> CliReply:
    """`claude -p --output-format json` (one result object) or `stream-json` (lines,
    the last of type "result")."""
    results = [o for o in objects if o.get("type") == "result" or "result" in o]
    tool_calls = 0
    for item in objects:
        message = item.get("message")
        if item.get("type") == "assistant" and isinstance(message, dict):
            content = message.get("content")
            parts = content if isinstance(content, list) else []
            tool_calls += sum(
                1 for part in parts if isinstance(part, dict) and part.get("type") == "tool_use"
            )
    if not results:
        return CliReply(text="", error="claude printed no result object")
    result = results[-1]
    used = _table(result, "usage")
    cache_read = _int(used.get("cache_read_input_tokens"))
    cache_write = _int(used.get("cache_creation_input_tokens"))
    usage = Usage(
        # Anthropic reports cached input apart; the usage records count all input.
        input_tokens=_int(used.get("input_tokens")) + cache_read + cache_write,
        output_tokens=_int(used.get("output_tokens")),
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )
    models = result.get("modelUsage")
    model = next(iter(models), None) if isinstance(models, dict) and models else None
    cost = result.get("total_cost_usd", result.get("cost_usd"))
    text = result.get("result")
    error = None
    if result.get("is_error") or str(result.get("subtype", "success")) != "success":
        error = f"claude ended with {result.get('subtype') or 'an error'}" + (
            f": {redact.clip(str(text), 200)}" if text else ""
        )
    return CliReply(
        text=text if isinstance(text, str) else "",
        usage=usage,
        cost=float(cost) if isinstance(cost, (int, float)) else None,
        model=model,
        tool_calls=tool_calls,
        error=error,
        raw=result,
    )


def _codex(objects: list[JsonObject]) -> CliReply:
    """`codex exec --json`: JSON lines of thread, turn and item events."""
    texts: list[str] = []
    tool_calls = 0
    input_tokens = cached = output_tokens = 0
    error = None
    for event in objects:
        kind = event.get("type")
        item = _table(event, "item")
        if kind == "item.completed":
            text = item.get("text")
            if item.get("type") == "agent_message" and isinstance(text, str):
                texts.append(text)
            elif item.get("type") in ("command_execution", "file_change", "mcp_tool_call"):
                tool_calls += 1
        elif kind == "turn.completed" and "usage" in event:
            used = _table(event, "usage")
            input_tokens += _int(used.get("input_tokens"))
            cached += _int(used.get("cached_input_tokens"))
            output_tokens += _int(used.get("output_tokens"))
        elif kind in ("turn.failed", "error"):
            detail = _table(event, "error") or event
            error = f"codex: {redact.clip(str(detail.get('message') or kind), 300)}"
    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cached)
    return CliReply(
        text=texts[-1] if texts else "",
        usage=usage,
        tool_calls=tool_calls,
        error=error if not texts else None,
    )


def _gemini(objects: list[JsonObject]) -> CliReply:
    """`gemini -p --output-format json`: one object with `response`, `stats`, `error`."""
    result = objects[-1]
    text = result.get("response")
    stats = _table(result, "stats")
    models = _table(stats, "models")
    input_tokens = output_tokens = cached = thoughts = 0
    model = None
    for name, figures in models.items():
        model = model or name
        tokens = figures.get("tokens") if isinstance(figures, dict) else None
        if isinstance(tokens, dict):
            input_tokens += _int(tokens.get("prompt"))
            output_tokens += _int(tokens.get("candidates")) + _int(tokens.get("thoughts"))
            thoughts += _int(tokens.get("thoughts"))
            cached += _int(tokens.get("cached"))
    tools = _table(stats, "tools")
    error = None
    problem = _table(result, "error")
    if problem:
        error = f"gemini: {redact.clip(str(problem.get('message') or problem), 300)}"
    return CliReply(
        text=text if isinstance(text, str) else "",
        usage=Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            reasoning_tokens=thoughts,
            cache_read_tokens=cached,
        ),
        model=model,
        tool_calls=_int(tools.get("totalCalls")),
        error=error,
    )
