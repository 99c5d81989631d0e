"""Prompt and agent nodes: the prompt they are given and the outcome their reply makes.

Real providers run the stage in `fabro_git.handlers.llm_api`. `--dry-run` swaps in a
simulator, labelled as such everywhere it shows, that exercises the whole stage
contract (prompt assembly, `prompt.md`/`response.md`, context keys, routing directives)
without a model, so every workflow can be run end to end offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabro_git.engine.outcome import Outcome, normalize_status
from fabro_git.engine.stage import StageRequest
from fabro_git.events.catalogue import StagePrompt
from fabro_git.outputs.directives import directives_from_status_file, extract_directives


def build_prompt(req: StageRequest) -> str:
    return preamble(req) + prompt_body(req)


def prompt_body(req: StageRequest) -> str:
    """The node's own prompt, rendered (its label when it has none)."""
    from fabro_git.workflow.templates import load_prompt, render

    text = load_prompt(req.node, req.graph) or req.node.label
    return render(text, goal=req.goal, inputs=req.inputs)


def preamble(req: StageRequest) -> str:
    fidelity = req.node.get("fidelity") or req.graph.attrs.get("default_fidelity") or "compact"
    goal = req.goal
    lines = [f"Goal: {goal}" if goal else f"Run: {req.run_id}"]
    if fidelity in ("truncate", "full"):
        return "\n".join(lines) + "\n\n"
    outcomes = req.completed
    if outcomes:
        lines += ["", "## Completed stages"]
        for node_id, record in outcomes.items():
            lines.append(f"- **{node_id}**: {record.get('status')}")
            if record.get("files_touched"):
                lines.append("  - Files: " + ", ".join(record["files_touched"]))
    public = {
        k: v
        for k, v in req.context.items()
        if not k.startswith(
            ("internal.", "graph.", "response.", "command.", "current_node", "human.gate")
        )
    }
    if public and fidelity != "summary:low":
        lines += ["", "## Context"]
        for key, value in sorted(public.items()):
            lines.append(f"- {key}: {str(value)[:200]}")
    return "\n".join(lines) + "\n\n"


def outcome_from_response(node_id: str, response: str, worktree: Path | None = None) -> Outcome:
    """The stage's outcome from its reply; the worktree's `status.json` stands in only
    when the reply carries no directive."""
    directives = extract_directives(response) or directives_from_status_file(worktree) or {}
    status = normalize_status(str(directives.get("outcome", "succeeded"))) or "succeeded"
    updates: dict[str, Any] = {
        "last_stage": node_id,
        "last_response": response[:200],
        f"response.{node_id}": response,
    }
    extra = directives.get("context_updates")
    if isinstance(extra, dict):
        updates.update(extra)
    suggested = directives.get("suggested_next_ids")
    return Outcome(
        status=status,
        error=str(directives["failure_reason"])
        if status == "failed" and directives.get("failure_reason")
        else None,
        preferred_label=directives.get("preferred_next_label"),
        suggested_next_ids=[str(s) for s in suggested] if isinstance(suggested, list) else [],
        context_updates=updates,
        response=response,
    )


async def execute(req: StageRequest) -> Outcome:
    node = req.node
    if not req.dry_run:
        from fabro_git.handlers import llm_api

        body, lead = prompt_body(req), preamble(req)
        if node.handler_type == "prompt":
            return await llm_api.run_prompt(req, body, lead)
        return await llm_api.run_agent(req, body, lead)
    prompt = build_prompt(req)
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
    req.files["response.md"] = response.encode()
    result = outcome_from_response(node.id, response, req.worktree)
    result.notes = "dry-run: simulated backend"
    return result
