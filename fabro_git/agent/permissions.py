"""Permission levels: which tools an agent may call without a person saying yes.

A review stage has no business editing files, and a stage that edits files need not
run arbitrary programs. Each tool falls in one category (reading, writing, sub-agents,
and "shell" for everything that can reach past the worktree: the shell, MCP tools,
and any tool this table does not know), and each level lets through the categories
up to it. A call beyond the level is put to the person at the run's terminal ("yes",
"always", "no"); "always" raises the level for the rest of the session. With nobody
to ask (no terminal, `--auto-approve`) the call is denied, and the model reads why
as the tool's error.

The check sits in the agent loop's tool dispatch (`AgentSession._execute`), so every
tool a session has passes it: built-in ones, MCP servers' and sub-agents' own. One
`PermissionGate` serves a stage's whole session tree: a sub-agent works at its
parent's level, and an "always" raises it for all of them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal, get_args

import trio

from fabro_git.config.run_config import (
    DEFAULT_PERMISSION_LEVEL,
    PERMISSION_LEVELS,
    PermissionLevel,
    permission_level,
)
from fabro_git.events.catalogue import AgentWarning
from fabro_git.events.envelope import EventProps
from fabro_git.jsondata import JsonObject, JsonValue

Level = PermissionLevel
Category = Literal["read", "write", "subagent", "shell"]
Answer = Literal["yes", "always", "no"]

LEVELS = PERMISSION_LEVELS
DEFAULT_LEVEL = DEFAULT_PERMISSION_LEVEL
check_level = permission_level

_CATEGORIES: dict[str, Category] = {
    "read_file": "read",
    "grep": "read",
    "glob": "read",
    "use_skill": "read",
    "write_file": "write",
    "edit_file": "write",
    "apply_patch": "write",
    "spawn_agent": "subagent",
    "send_input": "subagent",
    "wait": "subagent",
    "close_agent": "subagent",
}
_LEAST_LEVEL: dict[Category, Level] = {
    "read": "read-only",
    "subagent": "read-only",
    "write": "read-write",
    "shell": "full",
}

# Asks a person about one call (tool name, arguments); None when nobody answered.
Ask = Callable[[str, Mapping[str, JsonValue]], Awaitable[Answer | None]]
Emit = Callable[[EventProps], object]


def category_of(tool: str) -> Category:
    """The tool's category; a tool not in the table (an MCP server's, a new one) is
    treated as the shell, the most a tool can do."""
    return _CATEGORIES.get(tool, "shell")


def level_needed(tool: str) -> Level:
    return _LEAST_LEVEL[category_of(tool)]


def allows(level: Level, tool: str) -> bool:
    return LEVELS.index(level) >= LEVELS.index(level_needed(tool))


def answer_of(text: str) -> Answer | None:
    """`text` as an answer to the question, or None when it is none."""
    for answer in get_args(Answer):
        if text == answer:
            return answer
    return None


def describe_call(tool: str, arguments: Mapping[str, JsonValue], limit: int = 200) -> str:
    """`shell(command="make test")`: a call as a person is asked about it."""
    parts = [f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in arguments.items()]
    text = f"{tool}({', '.join(parts)})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PermissionGate:
    """The level of one stage's agent sessions, and who may be asked to go beyond it
    (`ask`; None: nobody, so such calls are denied)."""

    def __init__(self, level: Level, *, ask: Ask | None = None, source: str = "") -> None:
        self.level: Level = level
        self.ask = ask
        # Where the level came from, for the refusal (`permissions=read-only` on the node).
        self.source = source
        # One question at a time: sub-agents run side by side, and a second call waits
        # for the first answer, which may have raised the level meanwhile.
        self._asking = trio.Lock()

    def prompt_section(self) -> str:
        """What the model is told of its level, so it need not learn it by refusals."""
        allowed = {
            "read-only": "read and search files",
            "read-write": "read, search and change files",
            "full": "use every tool you have",
        }[self.level]
        return (
            f"Your permission level is {self.level}: you may {allowed}. Other tool calls "
            "are refused unless the user allows them."
        )

    async def check(self, tool: str, arguments: Mapping[str, JsonValue], emit: Emit) -> str | None:
        """None to run the call; else why it was not run, for the model to read."""
        if allows(self.level, tool):
            return None
        if self.ask is None:
            return self._refusal(tool, "nobody could be asked (no terminal, or --auto-approve)")
        async with self._asking:
            if allows(self.level, tool):
                return None
            answer = await self.ask(tool, arguments)
            needed = level_needed(tool)
            details: JsonObject = {
                "tool": tool,
                "level": self.level,
                "needed": needed,
                "answer": answer,
            }
            if answer == "always":
                emit(
                    AgentWarning(
                        kind="permission_raised",
                        message=f"permission level raised from {self.level} to {needed} "
                        f"for the rest of the session (allowed {tool} always)",
                        details=details,
                    )
                )
                self.level = needed
                return None
            if answer == "yes":
                emit(
                    AgentWarning(
                        kind="permission_granted",
                        message=f"{tool} allowed once beyond the {self.level} level",
                        details=details,
                    )
                )
                return None
            emit(
                AgentWarning(
                    kind="permission_denied",
                    message=f"{tool} denied at the {self.level} level",
                    details=details,
                )
            )
            return self._refusal(
                tool, "the user said no" if answer == "no" else "the question was not answered"
            )

    def _refusal(self, tool: str, why: str) -> str:
        source = f" ({self.source})" if self.source else ""
        allowed = sorted(name for name in _CATEGORIES if allows(self.level, name))
        return (
            f"This {tool} call was not run: the agent's permission level is "
            f"{self.level}{source}, and {tool} needs {level_needed(tool)}; {why}. "
            f"Carry on with the tools the level allows ({', '.join(allowed)}), or say in "
            "your answer what you could not do."
        )
