"""`git fabro exec PROMPT`: one agent session in the repository, without a workflow file.

It is a run of a one-node workflow shipped with the package (`workflows/exec.fabro`),
with the prompt as the run's goal, made by the same path as `git fabro run`: so it is
checkpointed, listed by `ps`, shown by `show`, resumable and pushable like any run, and
its agent works at the permission level `--permissions` gives (read-write by default).
It prints the agent's reply on stdout and, on stderr, where the result is and how to
take it.
"""

from __future__ import annotations

from pathlib import Path

from fabro_git.errors import ConfigError

EXEC_WORKFLOW = Path(__file__).parent / "workflows" / "exec.fabro"
REPLY_NODE = "agent"


def run(
    prompt: str,
    *,
    permissions: str | None,
    model: str | None,
    provider: str | None,
    in_place: bool,
    json_output: bool,
    auto_approve: bool,
) -> int:
    from fabro_git.cli import run as run_command

    if not prompt.strip():
        raise ConfigError("the prompt is empty", hint='say what to do: git fabro exec "..."')
    return run_command.run(
        str(EXEC_WORKFLOW),
        goal=prompt,
        goal_file=None,
        inputs=[],
        auto_approve=auto_approve,
        answers=[],
        dry_run=False,
        in_place=in_place,
        labels=[],
        model=model,
        provider=provider,
        detach=False,
        json_output=json_output,
        retro=False,
        permissions=permissions,
        reply_node=REPLY_NODE,
    )
