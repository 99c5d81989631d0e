"""Agent stages with `backend="cli"`: an installed coding agent does the work.

The stage writes its prompt (the preamble and the node's rendered prompt, as for the
built-in agent) to `prompt.md` in its scratch dir and runs the agent CLI the node's
provider selects (`fabro_git.llm.cli`) in the stage's worktree, through the engine's
process machinery: its own process group, the stage's environment (with its own
provider's key, and no other secret-named variable), the prompt on
stdin, and its output streamed to files. A timeout or Ctrl-C stops the whole group;
either way the agent session ends, and a stage its timeout cut off still tells the
files the CLI touched before it was stopped.

The CLI's reply is read from its machine output and handled exactly as an `api`
agent's: `response.md`, routing directives, context keys, usage and cost. Which files
it touched is told from the worktree before and after, since there are no tool events
to read them from: from the last checkpoint's scan and the stage's own when nothing
can have run in between (`fabro_git.engine.clean_start`), else from snapshots of the
dirty set (`fabro_git.store.touched`).
Commits the CLI makes on the run branch are adopted by the checkpoint.

The stage's permission level becomes the CLI's own flags where its profile knows them
(`fabro_git.llm.cli.PERMISSION_FLAGS`); a `cli_command` of the user's gets a
`run.notice` that the level cannot be enforced for it.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from fabro_git import redact
from fabro_git.config.locations import open_private
from fabro_git.engine.outcome import DETERMINISTIC, TRANSIENT, Outcome, Usage
from fabro_git.engine.process import META_LIMIT, excerpt, run_script
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import ConfigError
from fabro_git.events.catalogue import (
    AgentError,
    AgentMessage,
    AgentProcessingEnd,
    AgentSessionEnded,
    AgentSessionStarted,
    RunNotice,
    StagePrompt,
)
from fabro_git.handlers.command import stage_environment
from fabro_git.handlers.llm_api import stage_usage
from fabro_git.handlers.prompting import outcome_from_reply, recorded_reply
from fabro_git.llm import cli
from fabro_git.llm import types as llm
from fabro_git.llm.choice import CLI_ALTERNATIVES, CliChoice, cli_choice
from fabro_git.outputs.directives import StatusFile

# Paths listed at most in one stage's files_touched (as for command stages).
FILES_TOUCHED_LIMIT = 1000

# What the CLI printed, in the stage's scratch dir and (its start) on the meta ref.
STDOUT_LOG = "cli-stdout.log"
STDERR_LOG = "cli-stderr.log"


async def run_cli_agent(
    req: StageRequest, body: str, preamble: str, status_file: StatusFile
) -> Outcome:
    node = req.node
    agent = req.agent_config
    custom = list(agent.cli_command or []) or None
    model, provider = req.run_model
    choice = cli_choice(node, model=model, provider=provider, env=os.environ, custom=custom)
    prompt = preamble + body
    req.emit(StagePrompt(text=prompt))
    req.files["prompt.md"] = prompt.encode()
    prompt_path = req.stage_dir / "cli-prompt.md"
    call = _invocation(req, choice, prompt, prompt_path, custom, agent.cli_output)
    argv = [choice.program, *call.argv[1:]]
    stdout_path = req.stage_dir / STDOUT_LOG
    stderr_path = req.stage_dir / STDERR_LOG

    session_id = f"ses_{uuid.uuid4().hex[:16]}"
    label_model = choice.model or call.argv[0]
    req.emit_session(
        AgentSessionStarted(provider=choice.provider, model=label_model),
        session_id=session_id,
    )
    try:
        before = await req.snapshot_worktree()

        async def timed_out(seconds: float) -> Outcome:
            # Awaited once the CLI's process group is gone: what it changed stays, and is
            # told as a finished stage's is.
            _keep_output(req, call.argv, prompt)
            return Outcome.failure(
                f"agent CLI {call.argv[0]} for {node.id} timed out after {seconds:g}s",
                TRANSIENT,
                files_touched=await req.touched_since(before, limit=FILES_TOUCHED_LIMIT),
            )

        req.on_timeout(timed_out)
        code, _ = await run_script(
            argv,
            cwd=req.worktree,
            stdout=stdout_path,
            stderr=stderr_path,
            env=stage_environment(req, keys=_provider_keys(choice.provider)),
            timeout=None,
            groups=req.process_groups,
            stdin=prompt_path if call.prompt_on_stdin else None,
        )
        files = await req.touched_since(before, limit=FILES_TOUCHED_LIMIT)
        stderr_text = _keep_output(req, call.argv, prompt)
        reply = cli.parse_output(call.output, stdout_path.read_bytes())
        spent = _told_reply(req, reply, label_model, session_id)
        # A long reply's response.md and its offloaded value are one blob.
        value = await recorded_reply(req, reply.text)
        req.emit(AgentProcessingEnd(), session_id=session_id)
        failure = _failure(call.argv[0], code, reply, stderr_text)
        if failure is not None:
            req.emit(
                AgentError(error={"kind": "cli", "command": call.argv[0], "message": failure}),
                session_id=session_id,
            )
            return Outcome.failure(
                failure,
                DETERMINISTIC,
                files_touched=files,
                usage=spent,
                response=reply.text or None,
                notes=f"exit code {code}",
            )
        result = await outcome_from_reply(node.id, reply.text, value, status_file)
        result.files_touched = files
        result.usage = spent
        result.notes = f"{call.argv[0]} exited 0"
        return result
    finally:
        # Reached when the stage's timeout or Ctrl-C cuts the CLI off too: every session
        # that started ends.
        req.emit_session(AgentSessionEnded(), session_id=session_id)


def _keep_output(req: StageRequest, argv: list[str], prompt: str) -> str:
    """Records the CLI's command line and the start of its output; its stderr's start."""
    req.files["cli-command.json"] = _argv_record(argv, prompt)
    req.files[STDOUT_LOG] = excerpt(req.stage_dir / STDOUT_LOG, META_LIMIT)
    err = req.files[STDERR_LOG] = excerpt(req.stage_dir / STDERR_LOG, META_LIMIT)
    return err.decode("utf-8", "replace")


def _warn_unenforced(req: StageRequest, program: str, level: str, source: str) -> None:
    """A custom agent CLI gets no permission flags: the stage says so."""
    req.emit(
        RunNotice(
            level="warn",
            code="permissions_not_enforced",
            message=f"node {req.node.id}: the permission level {level} ({source}) cannot be "
            f"enforced for the agent CLI {program} ([run.agent] cli_command): it runs "
            "with whatever permissions it gives itself",
        )
    )


def _invocation(
    req: StageRequest,
    choice: CliChoice,
    prompt: str,
    prompt_path: Path,
    custom: list[str] | None,
    custom_output: str | None,
) -> cli.CliInvocation:
    """The CLI's argv and how its output reads, for this stage at its permission level
    (which a custom command is told it does not enforce); the prompt is written to
    `prompt_path` for a CLI that reads it from a file or stdin."""
    from fabro_git.handlers.llm_api import permission_level

    level, source = permission_level(req)
    if custom:
        _warn_unenforced(req, custom[0], level, source)
    with open(open_private(prompt_path, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        fh.write(prompt.encode())
    node = req.node
    try:
        return cli.invocation(
            choice.provider,
            model=choice.model,
            prompt=prompt,
            prompt_file=str(prompt_path),
            worktree=str(req.worktree),
            node_id=node.id,
            custom=custom,
            custom_output=custom_output,
            permissions=level,
        )
    except cli.NoProfile as err:  # check_stages refuses this before the run
        raise ConfigError(f"node {node.id!r}: no agent CLI for provider {err}") from None


def _told_reply(
    req: StageRequest, reply: cli.CliReply, label_model: str, session_id: str
) -> Usage | None:
    """Emits the CLI's reply as the session's message; the stage's usage when the CLI
    reported any."""
    from fabro_git.llm import usage as llm_usage

    used = reply.usage
    served = reply.model or label_model
    spent = None
    if used is not None:
        cost = reply.cost if reply.cost is not None else llm_usage.estimate_cost(served, used)
        spent = stage_usage(served, used, cost)
    if used is not None or reply.text:
        # A CLI that reports no usage (plain text output) shows as zero tokens here;
        # the stage then records no usage at all rather than a false zero.
        req.emit(
            AgentMessage(
                text=reply.text,
                model=served,
                usage=llm_usage.token_usage(used or llm.Usage()),
                tool_call_count=reply.tool_calls,
            ),
            session_id=session_id,
        )
    return spent


def _provider_keys(provider: str) -> tuple[str, ...]:
    """The variables that hold the key of the CLI's provider: the only secret-named
    host variables it gets, beside what `[run.sandbox.env]` passes."""
    from fabro_git.llm.catalogue import PROVIDERS

    info = PROVIDERS.get(provider)
    return info.key_env if info is not None else ()


def _failure(program: str, code: int | None, reply: cli.CliReply, stderr: str) -> str | None:
    if code == 126 and stderr.startswith("cannot start"):
        missing = "No such file" in stderr or "Permission denied" in stderr
        return stderr.strip() + (f"; {CLI_ALTERNATIVES}" if missing else "")
    if code != 0:
        last = stderr.strip().splitlines()[-1:] or [reply.error or ""]
        detail = f": {redact.clip(last[0], 300)}" if last[0] else ""
        return f"agent CLI {program} exited with status {code}{detail}"
    if reply.error is not None:
        return reply.error
    return None


def _argv_record(argv: list[str], prompt: str) -> bytes:
    """The command line as run, for the meta ref; the prompt itself is in prompt.md."""
    import json

    shown = ["<prompt>" if item == prompt and len(item) > 200 else item for item in argv]
    return (json.dumps(shown, indent=2) + "\n").encode()
