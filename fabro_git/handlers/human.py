"""Human gates: the outgoing edge labels are the choices; the answer becomes the
preferred label the engine routes on. No answer means failure, never a silent pass."""

from __future__ import annotations

import time
from collections.abc import Mapping

import trio

from fabro_git.engine.edges import accelerator_key
from fabro_git.engine.interviewer import Choice, Question, match
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import StageRequest
from fabro_git.events.catalogue import InterviewCompleted, InterviewStarted, InterviewTimeout
from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.workflow import Graph, Node


def gate_choices(graph: Graph, node: Node) -> list[Choice]:
    """A gate's choices: one per outgoing edge, labelled by the edge."""
    result = []
    for edge in graph.outgoing(node.id):
        label = edge.label or edge.target
        result.append(Choice(accelerator_key(label), label, edge.target, edge.freeform))
    return result


def _what_it_is_about(context: Mapping[str, JsonValue]) -> str:
    """The previous stage's response, or else the latest command output: what a person
    is being asked to approve. A response's routing directive is said in words."""
    from fabro_git.outputs.artifacts import resolved
    from fabro_git.outputs.directives import in_words

    last = context.get("last_stage")
    response = f"response.{last}" if last else ""
    for key in (response, "command.output"):
        # An offloaded value is shown as what it holds, not as its `file://` pointer.
        value = resolved(context.get(key)) if key else None
        if isinstance(value, str) and value.strip():
            return in_words(value) if key == response else value
    return ""


async def execute(req: StageRequest) -> Outcome:
    node = req.node
    choices = gate_choices(req.graph, node)
    default_name = node.get("human.default_choice")
    default = None
    if default_name:
        default = match(default_name, choices) or next(
            (c for c in choices if c.target == default_name), None
        )
    question = Question(
        text=node.get("question") or node.label,
        choices=choices,
        default=default,
        details=_what_it_is_about(req.context),
    )
    question_type = (
        "freeform" if any(c.freeform for c in choices) and len(choices) == 1 else "multiple_choice"
    )
    if len(choices) == 2 and question_type == "multiple_choice":
        question_type = "approval"
    req.emit(InterviewStarted(question=question.text, question_type=question_type))
    started = time.monotonic()

    def waited() -> int:
        return int((time.monotonic() - started) * 1000)

    def no_answer(reason: str) -> Outcome:
        return Outcome.failure(
            f"human gate {node.id!r} {reason}; failing closed"
            " (answer it with --answer TEXT, or take its default with --auto-approve)",
            "canceled",
        )

    async def timed_out(_seconds: float) -> Outcome:
        req.emit(InterviewTimeout(question=question.text, duration_ms=waited()))
        if default is None:
            return no_answer("timed out")
        return answered(default.label)

    def answered(answer: str) -> Outcome:
        req.emit(InterviewCompleted(question=question.text, answer=answer, duration_ms=waited()))
        return _route_on(node, choices, answer)

    # The node's `timeout` is the engine's (for every stage); `human.timeout` is the gate's.
    req.on_timeout(timed_out)
    own_timeout = node.get_duration("human.timeout", None)
    answer: str | None = None
    with trio.move_on_after(own_timeout if own_timeout else float("inf")) as scope:
        answer = await req.interviewer.ask(question)
    if scope.cancelled_caught:
        return await timed_out(own_timeout or 0.0)
    if answer is None:
        return no_answer("was not answered")
    return answered(answer)


def _route_on(node: Node, choices: list[Choice], answer: str) -> Outcome:
    chosen = match(answer, choices)
    text = None
    if chosen is None:
        chosen = next((c for c in choices if c.freeform), None)
        text = answer
    if chosen is None:
        options = ", ".join(c.label for c in choices)
        return Outcome.failure(
            f"human gate {node.id!r}: answer {answer!r} matches none of: {options}", "deterministic"
        )
    updates: JsonObject = {
        "human.gate.selected": "freeform" if chosen.freeform else (chosen.key or chosen.label),
        "human.gate.label": chosen.label,
    }
    if text is not None:
        updates["human.gate.text"] = text
    return Outcome.success(
        preferred_label=chosen.label,
        suggested_next_ids=[chosen.target],
        context_updates=updates,
        notes=f"answered {answer!r}",
    )
