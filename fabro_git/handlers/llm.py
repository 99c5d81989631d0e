"""Prompt and agent nodes: one table from a stage's backend to what runs it.

A prompt node asks a model once (`llm_api.run_prompt`); an agent node runs the built-in
agent loop (`llm_api.run_agent`) or, with `backend="cli"`, an installed agent CLI
(`llm_cli.run_cli_agent`). `--dry-run` swaps in a simulator, labelled as such
everywhere it shows, that exercises the whole stage contract (prompt assembly,
`prompt.md`/`response.md`, context keys, routing directives) without a model, so every
workflow can be run end to end offline. The prompt and the outcome are built in
`fabro_git.handlers.prompting` for all of them; the backend is chosen in
`fabro_git.llm.choice`, which also says what the stage asks of which model.

Every stage that asks a model comes through `execute`, so this is where a run in a
batch holds one of the batch's LLM slots (`fabro_git.llm.slots`) for the stage's length,
and where a node attribute the model choice refuses is pointed at in the workflow file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable

from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import StageRequest
from fabro_git.engine.stage_choice import located
from fabro_git.events.catalogue import RunNotice, StagePrompt
from fabro_git.handlers.llm_api import run_agent, run_prompt
from fabro_git.handlers.llm_cli import run_cli_agent
from fabro_git.handlers.prompting import (
    outcome_from_reply,
    preamble,
    prompt_body,
    recorded_reply,
    stage_summary,
)
from fabro_git.llm import SLOTS_VARIABLE
from fabro_git.llm.choice import StageChoiceError, backend_of
from fabro_git.outputs.directives import StatusFile

__all__ = ["execute", "stage_summary"]

# (the prompt body, the preamble of earlier stages, the status file found at the start)
Backend = Callable[[StageRequest, str, str, StatusFile], Awaitable[Outcome]]


async def simulate(req: StageRequest, body: str, lead: str, status_file: StatusFile) -> Outcome:
    """The dry-run backend: the node's scripted `dry_run.response`, or a placeholder."""
    node = req.node
    prompt = lead + body
    req.emit(StagePrompt(text=prompt))
    scripted = node.get("dry_run.response")
    if scripted is not None:
        response = scripted
    else:
        # Never echo the prompt: it may hold routing JSON meant as instructions.
        response = (
            f"[dry-run] simulated {node.handler_type} response for {node.id} "
            f"({len(prompt)} characters of prompt)"
        )
    req.files["prompt.md"] = prompt.encode()
    value = await recorded_reply(req, response)  # stored once, as a real reply is
    result = await outcome_from_reply(node.id, response, value, status_file)
    result.notes = "dry-run: simulated backend"
    return result


# (the stage's kind, its backend) -> what runs it. The backend is `dry-run` under
# --dry-run, else the node's (`llm.choice.backend_of`: a prompt stage's is always `api`).
BACKENDS: dict[tuple[str, str], Backend] = {
    ("prompt", "dry-run"): simulate,
    ("prompt", "api"): run_prompt,
    ("agent", "dry-run"): simulate,
    ("agent", "api"): run_agent,
    ("agent", "cli"): run_cli_agent,
}


def backend(req: StageRequest) -> Backend:
    kind = "prompt" if req.node.handler_type == "prompt" else "agent"
    name = "dry-run" if req.dry_run else backend_of(req.node)
    # An unknown backend runs the built-in loop (the check before a run refuses it).
    return BACKENDS.get((kind, name), run_agent)


async def execute(req: StageRequest) -> Outcome:
    try:
        return await _execute(req)
    except StageChoiceError as err:
        raise located(err) from None


async def _execute(req: StageRequest) -> Outcome:
    # Taken before the stage does anything: what it finds there is not its own directive.
    status_file = StatusFile(req.worktree)
    run = backend(req)
    limiter = None if req.dry_run else os.environ.get(SLOTS_VARIABLE)
    if not limiter:
        return await run(req, prompt_body(req), preamble(req), status_file)
    from fabro_git.llm.slots import LlmSlots, SlotsUnreachable

    async def queued() -> None:
        req.emit(
            RunNotice(
                level="info",
                code="llm_slot_wait",
                message=f"stage {req.node_id} waits for an LLM slot: the batch's "
                "--max-parallel model stages are running",
            )
        )

    async with contextlib.AsyncExitStack() as slot:
        try:
            holder = f"{req.run_id}/{req.node_id}"
            with req.timeout_stopped():  # the wait is the batch's, not the stage's
                await slot.enter_async_context(LlmSlots(limiter).held(holder, queued=queued))
        except SlotsUnreachable as err:  # its batch driver has gone: run unlimited
            req.emit(RunNotice(level="warn", code="llm_slots_unreachable", message=err.message))
        return await run(req, prompt_body(req), preamble(req), status_file)
