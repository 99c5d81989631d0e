"""What answers a lifecycle hook of type `agent`: an agent session in the run's worktree.

It lives above the engine, which fires hooks but does not import agents (the packages
import downwards only); `git fabro run` and `resume` hand it to the run's hooks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fabro_git.engine.lifecycle import Hook, LifecycleHooks
    from fabro_git.llm import types as llm


async def agent_hook_reply(
    hooks: LifecycleHooks,
    hook: Hook,
    question: str,
    target: llm.Target,
    fallbacks: list[llm.Target],
) -> tuple[str, str | None]:
    """An agent session whose tools reach only the run's worktree, for at most
    `max_tool_rounds` rounds of tool calls and then its answer: its text, or why it
    gave none."""
    from fabro_git.agent.session import AgentLimits, AgentSession
    from fabro_git.engine import process_groups
    from fabro_git.engine.lifecycle import HOOK_MAX_TOKENS, JUDGE_INSTRUCTIONS, unheard
    from fabro_git.engine.stage_env import stage_environment

    worktree = hooks.worktree
    if worktree is None or not worktree.is_dir():
        return "", "the run has no worktree for an agent hook to work in"
    records = process_groups.records_dir(hooks.scratch)
    groups: dict[int, Path | None] = {}

    def on_process_group(pgid: int, running: bool) -> None:
        # Recorded as a hook's, so nothing its shell starts outlives the run.
        if running:
            groups[pgid] = process_groups.record(records, pgid, kind="hook")
        elif not process_groups.alive(pgid):
            process_groups.forget(groups.pop(pgid, None))

    in_place = worktree.resolve() == hooks.host_dir.resolve()
    session = AgentSession(
        worktree,
        target=target,
        fallbacks=fallbacks,
        emit=unheard,
        system_prompt=JUDGE_INSTRUCTIONS,
        # Its rounds of tool calls, and the call that answers after the last.
        limits=AgentLimits(max_turns=hook.max_tool_rounds + 1, max_tokens=HOOK_MAX_TOKENS),
        env=os.environ,
        shell_env=stage_environment(
            sandbox=hooks.sandbox_env,
            mark=process_groups.process_mark(records, "hook"),
        ),
        skill_dirs=[],
        on_process_group=on_process_group,
        # An in-place run's `.fabro/` is the user's configuration: no tool changes it.
        guard_config=worktree if in_place else None,
    )
    try:
        result = await session.run(question)
    finally:
        done = session.result()
        hooks.spent(target.model, done.usage, done.cost)
    if result.status == "failed":
        error = result.error or {}
        return "", str(error.get("message") or error.get("kind") or "the agent failed")
    if result.status == "turn_limit":
        return "", (
            f"it used its {hook.max_tool_rounds} tool rounds (max_tool_rounds) without answering"
        )
    return result.text, None
