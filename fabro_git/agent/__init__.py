"""The coding agent an `agent` stage runs: a model with file and shell tools in a worktree.

A stage creates an `session.AgentSession` with the worktree, the resolved target and
its fallbacks, the stage's system prompt, `session.AgentLimits`, the stage's
environment and an `emit` callback for the `agent.*` event Structs, then awaits
`run(prompt, preamble=...)` inside its own cancel scope:

    agent = AgentSession(worktree, target=target, fallbacks=fallbacks, emit=forward,
                         system_prompt=system, limits=AgentLimits(max_turns=50), env=env)
    result = await agent.run(prompt, preamble=preamble)
    # result.status, result.text, result.usage, result.cost, result.files_touched

`forward` stamps each event with the stage's scope and `agent.session_id`, except
`agent.session.started` and `agent.session.ended`, which are not stage-scoped. The
conversation (`agent.conversation`, a `session.Conversation`) serialises with
`to_bytes()` and can be passed back in to continue a thread on a later visit. While it
runs, `agent.steer(text)` queues guidance for the next model call, and the optional
`on_process_group(pgid, running)` hook reports each shell command's process group so
the stage can record it. After a cancellation, `agent.result()` reports what was done.

Tools beyond the built-in ones come from `toolsets=`, entered for each run; the stage
passes `subagents.SubAgents(stamp).toolsets()`, the four sub-agent tools.

The modules: `session` (the loop, compaction, loop detection), `tools` (schemas and
implementations), `subagents` (child sessions), `workspace` (path confinement), `shell`
(process groups and timeouts), `patch` (the v4a format), `truncation`, `memory`
(AGENTS.md and friends) and `skills`. The provider SDKs load only when the first
request is sent.
"""
