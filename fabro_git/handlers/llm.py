"""Prompt and agent nodes: the prompt they are given and the outcome their reply makes.

Real providers run the stage in `fabro_git.handlers.llm_api`. `--dry-run` swaps in a
simulator, labelled as such everywhere it shows, that exercises the whole stage
contract (prompt assembly, `prompt.md`/`response.md`, context keys, routing directives)
without a model, so every workflow can be run end to end offline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fabro_git.engine.outcome import Outcome, normalize_status
from fabro_git.engine.stage import StageRequest
from fabro_git.events.catalogue import StagePrompt
from fabro_git.outputs.directives import StatusFile, extract_directives

if TYPE_CHECKING:
    from fabro_git.workflow import Graph


def build_prompt(req: StageRequest) -> str:
    return preamble(req) + prompt_body(req)


def prompt_body(req: StageRequest) -> str:
    """The node's own prompt, rendered (its label when it has none)."""
    from fabro_git.workflow.templates import load_prompt, render

    text = load_prompt(req.node, req.graph) or req.node.label
    return render(text, goal=req.goal, inputs=req.inputs)


def _edge_attr(req: StageRequest, key: str) -> str | None:
    """`key` of the edge the run came in by: the edges from the stage completed last to
    this node, when they all say the same (with none, or edges that disagree, None)."""
    previous = req.previous_node
    if previous is None:
        return None
    values = {
        (edge.attrs.get(key) or "").strip()
        for edge in req.graph.outgoing(previous)
        if edge.target == req.node.id
    }
    return (values.pop() or None) if len(values) == 1 else None


def fidelity_of(req: StageRequest) -> str:
    """The stage's fidelity: the incoming edge's, the node's own (or its subgraph's),
    else the graph's default."""
    return (
        _edge_attr(req, "fidelity")
        or req.node.get("fidelity")
        or req.graph.attrs.get("default_fidelity")
        or "compact"
    )


def thread_of(req: StageRequest) -> str | None:
    """The conversation the stage continues: its `thread_id` (the incoming edge's, else
    the node's), when its fidelity is `full` (validation warns of a thread_id without
    it, which starts afresh)."""
    thread = (_edge_attr(req, "thread_id") or req.node.get("thread_id") or "").strip()
    return thread if thread and fidelity_of(req) == "full" else None


def preamble(req: StageRequest) -> str:
    fidelity = fidelity_of(req)
    goal = req.goal
    lines = [f"Goal: {goal}" if goal else f"Run: {req.run_id}"]
    if fidelity in ("truncate", "full"):
        return "\n".join(lines) + "\n\n"
    outcomes = req.completed
    if outcomes:
        lines += ["", "## Completed stages"]
        for node_id, record in outcomes.items():
            lines += stage_summary(req.graph, node_id, record)
    # The engine's failure bookkeeping (`failure_signature`, `failure_class`) is not for
    # a model: what failed is said in words under the stage, above.
    public = {
        k: v
        for k, v in req.context.items()
        if not k.startswith(
            (
                "internal.",
                "graph.",
                "response.",
                "command.",
                "current_node",
                "human.gate",
                "failure_",
            )
        )
    }
    if public and fidelity != "summary:low":
        lines += ["", "## Context"]
        for key, value in sorted(public.items()):
            lines.append(f"- {key}: {str(value)[:200]}")
    return "\n".join(lines) + "\n\n"


# What a preamble shows of an inline command output: its first and last lines, each cut
# at PREAMBLE_LINE_LIMIT characters.
PREAMBLE_HEAD_LINES = 10
PREAMBLE_TAIL_LINES = 20
PREAMBLE_LINE_LIMIT = 200


def stage_summary(graph: Graph, node_id: str, record: Mapping[str, Any]) -> list[str]:
    """One completed stage in a preamble: status, model, files, and where its response or
    output is. An offloaded value is named by its path ("See: ..."), never inlined."""
    from fabro_git.outputs.artifacts import pointer_path

    lines = [f"- **{node_id}**: {record.get('status')}"]
    error = record.get("error")
    if record.get("status") == "failed" and isinstance(error, str) and error.strip():
        lines.append(f"  - What failed: {' '.join(error.split())[:PREAMBLE_LINE_LIMIT]}")
    usage = record.get("usage")
    if isinstance(usage, Mapping) and usage.get("model"):
        lines.append(
            f"  - Model: {usage['model']}, {_tokens(usage.get('input_tokens'))} tokens in / "
            f"{_tokens(usage.get('output_tokens'))} out"
        )
    if record.get("files_touched"):
        lines.append("  - Files: " + ", ".join(record["files_touched"]))
    updates = record.get("context_updates")
    if not isinstance(updates, Mapping):
        return lines
    response = pointer_path(updates.get(f"response.{node_id}"))
    if response is not None:
        lines.append(f"  - Response: See: {response}")
    if "command.output" in updates:
        node = graph.nodes.get(node_id)
        script = (node.get("script") or node.get("tool_command")) if node is not None else None
        if script:
            lines.append(f"  - Script: `{' '.join(str(script).split())[:200]}`")
        output = updates["command.output"]
        path = pointer_path(output)
        if path is not None:
            lines.append(f"  - Stdout: See: {path}")
        elif isinstance(output, str) and output.strip():
            lines.append("  - Stdout:")
            lines += ["    " + line for line in _head_and_tail(output).splitlines()]
    return lines


def _tokens(count: object) -> str:
    n = count if isinstance(count, int) else 0
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _head_and_tail(text: str) -> str:
    lines = [line[:PREAMBLE_LINE_LIMIT] for line in text.strip("\n").splitlines()]
    if len(lines) > PREAMBLE_HEAD_LINES + PREAMBLE_TAIL_LINES:
        omitted = len(lines) - PREAMBLE_HEAD_LINES - PREAMBLE_TAIL_LINES
        lines = [
            *lines[:PREAMBLE_HEAD_LINES],
            f"[... {omitted} lines omitted ...]",
            *lines[-PREAMBLE_TAIL_LINES:],
        ]
    return "\n".join(lines)


def outcome_from_response(
    node_id: str, response: str, status_file: StatusFile | None = None
) -> Outcome:
    """The stage's outcome from its reply; a `status.json` the stage wrote stands in only
    when the reply carries no directive."""
    directives = extract_directives(response) or (status_file and status_file.directives()) or {}
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
        directive_given=bool(directives),
    )


async def execute(req: StageRequest) -> Outcome:
    node = req.node
    # Taken before the stage does anything: what it finds there is not its own directive.
    status_file = StatusFile(req.worktree)
    if not req.dry_run:
        from fabro_git.handlers import llm_api

        body, lead = prompt_body(req), preamble(req)
        if node.handler_type == "prompt":
            return await llm_api.run_prompt(req, body, lead, status_file)
        return await llm_api.run_agent(req, body, lead, status_file)
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
    result = outcome_from_response(node.id, response, status_file)
    result.notes = "dry-run: simulated backend"
    return result
