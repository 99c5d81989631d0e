"""Prompt and agent nodes: the prompt they are given and the outcome their reply makes.

Shared by every way such a stage runs (`fabro_git.handlers.llm` picks one): the
prompt's assembly, the preamble of earlier stages, and the outcome read from a reply.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fabro_git import redact
from fabro_git.engine.context import HIDDEN_FROM_PROMPT, said_by_a_stage
from fabro_git.engine.outcome import Outcome, StageRecord, normalize_status
from fabro_git.engine.stage import StageRequest
from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.outputs.artifacts import TextFile, offloads
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


# Rough characters per token, for the summary levels' budgets (Fabro's prompts doc:
# about 1,500 tokens for summary:medium, 600 for summary:low).
CHARS_PER_TOKEN = 4
SUMMARY_BUDGET = {"summary:medium": 1500 * CHARS_PER_TOKEN, "summary:low": 600 * CHARS_PER_TOKEN}


def preamble(req: StageRequest) -> str:
    """What the stage is told of the run before its prompt, by its fidelity: `full` and
    `truncate` the goal alone; `compact` (the default) a nested list per stage;
    `summary:high` a Markdown report per stage; `summary:medium` outcomes and notable
    findings; `summary:low` outcomes alone. The medium and low levels keep to a budget,
    dropping the oldest stages first."""
    fidelity = fidelity_of(req)
    goal = req.goal
    head = [f"Goal: {goal}" if goal else f"Run: {req.run_id}"]
    if fidelity in ("truncate", "full"):
        return "\n".join(head) + "\n\n"
    # The engine's failure bookkeeping (`failure_signature`, `failure_class`) is not for
    # a model: what failed is said in words under the stage, in its summary.
    public = {k: v for k, v in req.context.items() if not k.startswith(HIDDEN_FROM_PROMPT)}
    summarise = {
        "summary:high": stage_report,
        "summary:medium": stage_findings,
        "summary:low": lambda graph, node_id, record: [f"- {node_id}: {record.get('status')}"],
    }.get(fidelity, stage_summary)
    stages = [summarise(req.graph, node_id, record) for node_id, record in req.completed.items()]
    context: list[str] = []
    if public and fidelity != "summary:low":
        width = 2000 if fidelity == "summary:high" else 200
        context = ["", "## Context"]
        context += [f"- {key}: {str(value)[:width]}" for key, value in sorted(public.items())]
    budget = SUMMARY_BUDGET.get(fidelity)
    dropped = 0
    if budget is not None:
        size = sum(len(line) + 1 for line in head + context) + 40
        while stages and size + sum(len(line) + 1 for s in stages for line in s) > budget:
            stages.pop(0)
            dropped += 1
        while len(context) > 2 and size > budget:
            size -= len(context.pop()) + 1  # the context alone is over: its last keys go
    lines = list(head)
    if stages or dropped:
        lines += ["", "## Completed stages"]
        if dropped:
            lines.append(f"- [{dropped} earlier stages left out]")
        for summary in stages:
            lines += summary
    lines += context
    return "\n".join(lines) + "\n\n"


# What a preamble shows of an inline command output: its first and last lines, each cut
# at PREAMBLE_LINE_LIMIT characters.
PREAMBLE_HEAD_LINES = 10
PREAMBLE_TAIL_LINES = 20
PREAMBLE_LINE_LIMIT = 200


def stage_summary(graph: Graph, node_id: str, record: StageRecord) -> list[str]:
    """One completed stage in a preamble: status, model, files, and where its response or
    output is. An offloaded value is named by its path ("See: ..."), never inlined."""
    from fabro_git.outputs.artifacts import pointer_path

    lines = [f"- **{node_id}**: {record.get('status')}"]
    error = record.get("error")
    if record.get("status") == "failed" and isinstance(error, str) and error.strip():
        lines.append(f"  - What failed: {_one_line(error, PREAMBLE_LINE_LIMIT)}")
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


def stage_findings(graph: Graph, node_id: str, record: StageRecord) -> list[str]:
    """One completed stage for `summary:medium`: its outcome, and what it found: the
    reason it failed, its notes, its files, its reply's opening, its output's end."""
    from fabro_git.outputs.artifacts import pointer_path

    lines = [f"- **{node_id}**: {record.get('status')}"]
    for value, label in ((record.get("error"), "Error"), (record.get("notes"), "Notes")):
        if value:
            lines.append(f"  - {label}: {_one_line(value, 300)}")
    if record.get("files_touched"):
        files = list(record["files_touched"])
        more = f" and {len(files) - 10} more" if len(files) > 10 else ""
        lines.append("  - Files: " + ", ".join(files[:10]) + more)
    updates = record.get("context_updates")
    if isinstance(updates, Mapping):
        reply = updates.get("last_response")
        if isinstance(reply, str) and reply.strip() and pointer_path(reply) is None:
            lines.append(f"  - Reply: {_one_line(reply, 200)}")
        output = updates.get("command.output")
        if isinstance(output, str) and output.strip() and pointer_path(output) is None:
            tail = [
                line[:PREAMBLE_LINE_LIMIT]
                for line in redact.masked(output).strip("\n").splitlines()[-5:]
            ]
            lines.append("  - Output ends:")
            lines += ["    " + line for line in tail]
    return lines


def stage_report(graph: Graph, node_id: str, record: StageRecord) -> list[str]:
    """One completed stage for `summary:high`: a Markdown section with everything
    `compact` shows, and its error, notes, routing and the context keys it set."""
    lines = ["", f"### {node_id}: {record.get('status')}"]
    details = stage_summary(graph, node_id, record)[1:]
    for value, label in (
        (record.get("error"), "Error"),
        (record.get("failure_class"), "Failure class"),
        (record.get("notes"), "Notes"),
        (record.get("preferred_label"), "Preferred label"),
    ):
        if value:
            lines.append(f"- {label}: {_one_line(value, 2000)}")
    lines += [line[2:] if line.startswith("  ") else line for line in details]
    updates = record.get("context_updates")
    if isinstance(updates, Mapping):
        reply = updates.get("last_response")
        if isinstance(reply, str) and reply.strip():
            lines.append(f"- Reply: {_one_line(reply, 2000)}")
        keys = sorted(k for k in updates if not k.startswith(("internal.", "response.")))
        if keys:
            lines.append("- Context set: " + ", ".join(keys))
    return lines


def _one_line(value: object, limit: int) -> str:
    text = " ".join(redact.masked(str(value)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tokens(count: object) -> str:
    n = count if isinstance(count, int) else 0
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _head_and_tail(text: str) -> str:
    lines = [line[:PREAMBLE_LINE_LIMIT] for line in redact.masked(text).strip("\n").splitlines()]
    if len(lines) > PREAMBLE_HEAD_LINES + PREAMBLE_TAIL_LINES:
        omitted = len(lines) - PREAMBLE_HEAD_LINES - PREAMBLE_TAIL_LINES
        lines = [
            *lines[:PREAMBLE_HEAD_LINES],
            f"[... {omitted} lines omitted ...]",
            *lines[-PREAMBLE_TAIL_LINES:],
        ]
    return "\n".join(lines)


# Bytes at the end of a long reply's file read for its routing directive.
_DIRECTIVE_TAIL = 1 << 20


async def recorded_reply(
    req: StageRequest, text: str, file: str | None = None, chars: int = 0
) -> str | TextFile:
    """Record a stage's reply as its `response.md`, and return what `response.<node>`
    takes: the text, or, for a reply that is offloaded, the file that holds it, so that
    git keeps the reply once (its response.md and its offloaded value are one blob, see
    `fabro_git.outputs.artifacts`). `file` is where the provider streamed a long reply
    (`chars` characters), and `text` is then only its start."""
    import trio

    if file is not None:
        req.files["response.md"] = Path(file)
        return TextFile(file, chars)
    if not offloads(text):
        req.files["response.md"] = text.encode("utf-8", "backslashreplace")
        return text
    path = req.stage_dir / "response.md"
    await trio.to_thread.run_sync(path.write_bytes, text.encode("utf-8", "backslashreplace"))
    req.files["response.md"] = path
    return TextFile(str(path), len(text))


async def _reply_tail(value: TextFile) -> str:
    """The end of a long reply's file, where its routing directive is."""
    import trio

    def read() -> str:
        with open(value.path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(value.path) - _DIRECTIVE_TAIL))
            return fh.read().decode("utf-8", "ignore")

    return await trio.to_thread.run_sync(read)


async def outcome_from_reply(
    node_id: str, text: str, value: str | TextFile, status_file: StatusFile | None = None
) -> Outcome:
    """`outcome_from_response` for a reply `recorded_reply` kept: a long reply's
    directive is looked for in its last megabyte, then in its start (`text`)."""
    if not isinstance(value, TextFile):
        return outcome_from_response(node_id, text, status_file)
    directives = extract_directives(await _reply_tail(value)) or extract_directives(text)
    return outcome_from_response(node_id, text, status_file, value=value, directives=directives)


def outcome_from_response(
    node_id: str,
    response: str,
    status_file: StatusFile | None = None,
    *,
    value: str | TextFile | None = None,
    directives: JsonObject | None = None,
) -> Outcome:
    """The stage's outcome from its reply; a `status.json` the stage wrote stands in only
    when the reply carries no directive. `value` is what `response.<node>` takes when it
    is not `response` (a long reply's file), `directives` those found in it."""
    if directives is None:
        directives = extract_directives(response)
    directives = directives or (status_file and status_file.directives()) or {}
    status = normalize_status(str(directives.get("outcome", "succeeded"))) or "succeeded"
    # A long reply's value is its `TextFile` until the runner offloads it to a pointer;
    # `Outcome.context_updates` is typed as the JSON it holds from then on, so this one
    # value that is not JSON yet is why the updates are cast below.
    updates: dict[str, JsonValue | TextFile] = {
        "last_stage": node_id,
        "last_response": redact.clip(response, 200),
        f"response.{node_id}": response if value is None else value,
    }
    extra = directives.get("context_updates")
    refused: list[str] = []
    if isinstance(extra, dict):
        kept, refused = said_by_a_stage(extra)
        updates.update(kept)
    suggested = directives.get("suggested_next_ids")
    label = directives.get("preferred_next_label")
    return Outcome(
        status=status,
        error=str(directives["failure_reason"])
        if status == "failed" and directives.get("failure_reason")
        else None,
        preferred_label=None if label is None else str(label),
        suggested_next_ids=[str(s) for s in suggested] if isinstance(suggested, list) else [],
        context_updates=cast(JsonObject, updates),
        response=response,
        directive_given=bool(directives),
        notes=f"context_updates left out (keys the engine keeps): {', '.join(refused)}"
        if refused
        else None,
    )
