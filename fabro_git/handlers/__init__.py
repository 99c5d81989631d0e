"""Node handlers: one module per node type, each an async function returning an Outcome.

A handler does the stage's work and nothing else: the engine owns timeouts, retries,
routing, events around the stage, worktrees and checkpoints. Handlers that need the
engine (parallel branches, sub-workflows, fan-in) ask through the `StageRequest` they
are given, never the runtime or the store. The engine does not import this package:
the CLI hands `handler_for` to it.
"""

from __future__ import annotations

from fabro_git.engine.stage import Handler


def handler_for(handler_type: str) -> Handler | None:
    from fabro_git.handlers import basic, command, human, llm, parallel, subworkflow

    table: dict[str, Handler] = {
        "start": basic.start,
        "exit": basic.exit_,
        "conditional": basic.conditional,
        "wait": basic.wait,
        "command": command.execute,
        "tool": command.execute,
        "human": human.execute,
        "wait.human": human.execute,
        "agent": llm.execute,
        "codergen": llm.execute,
        "prompt": llm.execute,
        "parallel": parallel.fan_out,
        "parallel.fan_in": parallel.fan_in,
        "stack.manager_loop": subworkflow.execute,
    }
    return table.get(handler_type)
