"""Node handlers: one module per node type, each an async function returning an Outcome.

A handler does the stage's work and nothing else: the engine owns timeouts, retries,
routing, events around the stage, worktrees and checkpoints. Handlers that need the
engine (parallel branches, sub-workflows, fan-in) ask through the `StageRequest` they
are given, never the runtime or the store. The engine does not import this package:
the CLI hands `handler_for` to it.
"""

from __future__ import annotations

import importlib

from fabro_git.engine.stage import Handler

# Each node type's handler, as (module, function): a module is imported only when a
# workflow has a stage of its kind, so a run of commands loads no LLM client code.
_HANDLERS: dict[str, tuple[str, str]] = {
    "start": ("basic", "start"),
    "exit": ("basic", "exit_"),
    "conditional": ("basic", "conditional"),
    "wait": ("basic", "wait"),
    "command": ("command", "execute"),
    "tool": ("command", "execute"),
    "human": ("human", "execute"),
    "wait.human": ("human", "execute"),
    "agent": ("llm", "execute"),
    "codergen": ("llm", "execute"),
    "prompt": ("llm", "execute"),
    "parallel": ("parallel", "fan_out"),
    "parallel.fan_in": ("parallel", "fan_in"),
    "stack.manager_loop": ("subworkflow", "execute"),
}


def handler_for(handler_type: str) -> Handler | None:
    found = _HANDLERS.get(handler_type)
    if found is None:
        return None
    module, function = found
    handler: Handler = getattr(importlib.import_module(f"fabro_git.handlers.{module}"), function)
    return handler
