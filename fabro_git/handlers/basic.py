"""Handlers with no work of their own: start, exit, conditional and wait."""

from __future__ import annotations

import trio

from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import WorkflowError


async def start(req: StageRequest) -> Outcome:
    return Outcome.success()


async def exit_(req: StageRequest) -> Outcome:
    return Outcome.success(notes="workflow reached its exit")


async def conditional(req: StageRequest) -> Outcome:
    # Routing happens in the engine's edge selection; the outcome of the previous stage
    # stays visible to the conditions because a conditional node passes it through.
    previous = req.context.get("outcome")
    if isinstance(previous, str) and previous in (
        "succeeded",
        "failed",
        "partially_succeeded",
        "skipped",
    ):
        label = req.context.get("preferred_label")
        return Outcome(status=previous, preferred_label=label if isinstance(label, str) else None)
    return Outcome.success()


async def wait(req: StageRequest) -> Outcome:
    seconds = req.node.get_duration("duration", None)
    if seconds is None:
        raise WorkflowError(
            f'wait node {req.node.id!r} needs a duration, e.g. duration="30s"',
            path=req.graph.path,
            line=req.node.line,
            column=req.node.column,
        )
    await trio.sleep(seconds)
    return Outcome.success(notes=f"waited {seconds:g}s")
