"""The run's retro at its end: `retro.json` derived from the events, and, on request,
its narrative.

The narrative is one model call that reads the run's derived retro and says, in
Fabro's terms, how smoothly it went, what it was for, what came of it, what was learnt,
where it got stuck and what is left to do.

Off unless the run asks (`run --retro-narrative`): it costs a model call at every run
end. It uses the run's model choice (`--model`/`--provider`, `[run.model]`, else the
provider whose key is present), and is skipped in a dry run and after an interrupt. A
narrative that cannot be had (no key, a provider error, a reply that is no JSON object)
is reported as a `run.notice` and left out; it never changes how the run ended.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import trio

from fabro_git import redact
from fabro_git.engine.outcome import FAILED
from fabro_git.errors import FabroError
from fabro_git.events.catalogue import RunNotice
from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.outputs import retro
from fabro_git.store import runs as runrefs

if TYPE_CHECKING:
    from fabro_git.engine.runner import Runtime

SMOOTHNESS = ("effortless", "smooth", "bumpy", "struggled", "failed")
LEARNING_CATEGORIES = ("repo", "code", "workflow", "tool")
FRICTION_KINDS = ("retry", "timeout", "wrong_approach", "tool_failure", "ambiguity")
OPEN_ITEM_KINDS = ("tech_debt", "follow_up", "investigation", "test_gap")

MAX_TOKENS = 2000
# The retro sent to the model is cut here: a run of thousands of stages needs no more.
RETRO_CHARS = 60_000

INSTRUCTIONS = f"""\
You write the retrospective of one run of an AI-agent workflow. Below are its goal and
its retro: each stage with status, duration, retries, errors, cost and files touched,
and the run's totals. Judge how smoothly the run went and what it leaves behind.

Reply with one JSON object and nothing else, with these fields:
- "smoothness": one of {", ".join(SMOOTHNESS)} (effortless: done first time; smooth:
  one or two retries; bumpy: real friction; struggled: much recovery; failed: the goal
  was not reached);
- "intent": what the run set out to do, one sentence;
- "outcome": what actually happened, one or two sentences;
- "learnings": a list of {{"category": one of {", ".join(LEARNING_CATEGORIES)}, "text": ...}};
- "friction_points": a list of {{"kind": one of {", ".join(FRICTION_KINDS)}, "description": ...,
  "stage_id": the stage it happened in, or null}};
- "open_items": a list of {{"kind": one of {", ".join(OPEN_ITEM_KINDS)}, "description": ...}}.
"""


async def narrate(
    retro: JsonObject, *, model: str | None, provider: str | None
) -> tuple[JsonObject | None, str | None]:
    """(the narrative, None), or (None, why there is none)."""
    from fabro_git.llm.client import complete
    from fabro_git.llm.resolve import ModelChoice, resolve_target
    from fabro_git.llm.types import Message, Request
    from fabro_git.llm.usage import estimate_cost

    facts = redact.clip(json.dumps(retro, indent=1, sort_keys=True), RETRO_CHARS)
    prompt = f"{INSTRUCTIONS}\nGoal: {retro.get('goal') or '(none given)'}\n\nRetro:\n{facts}\n"
    try:
        choice = ModelChoice(model=model, provider=provider) if (model or provider) else None
        target = resolve_target([choice], os.environ)
        response = await complete(
            Request(messages=(Message.user(prompt),), max_tokens=MAX_TOKENS),
            target,
            env=os.environ,
        )
    except FabroError as err:
        return None, str(err)
    narrative = parse(response.text)
    if narrative is None:
        return None, "the model's reply held no JSON object with a smoothness rating"
    narrative["model"] = response.target.model
    narrative["usage"] = {
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "cost": estimate_cost(response.target.model, response.usage),
    }
    return narrative, None


def parse(text: str) -> JsonObject | None:
    """The narrative in a reply: its outermost JSON object (fenced or not), with the
    known fields kept and checked; None when there is none or it has no rating."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(text[start : end + 1])
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    smoothness = str(value.get("smoothness") or "").strip().lower()
    if smoothness not in SMOOTHNESS:
        return None
    return {
        "smoothness": smoothness,
        "intent": _text(value.get("intent")),
        "outcome": _text(value.get("outcome")),
        "learnings": _items(value.get("learnings"), "category", LEARNING_CATEGORIES, "text"),
        "friction_points": _items(
            value.get("friction_points"), "kind", FRICTION_KINDS, "description", stage=True
        ),
        "open_items": _items(value.get("open_items"), "kind", OPEN_ITEM_KINDS, "description"),
    }


def _text(value: JsonValue) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _items(
    value: JsonValue, kind_key: str, kinds: tuple[str, ...], text_key: str, *, stage: bool = False
) -> list[JsonValue]:
    items: list[JsonValue] = []
    for entry in value if isinstance(value, list) else []:
        if not isinstance(entry, dict) or _text(entry.get(text_key)) is None:
            continue
        kind = str(entry.get(kind_key) or "").strip().lower()
        item: JsonObject = {
            kind_key: kind if kind in kinds else None,
            text_key: _text(entry.get(text_key)),
        }
        if stage:
            item["stage_id"] = _text(entry.get("stage_id"))
        items.append(item)
    return items


def retro_document(runtime: Runtime, status: str, error: str | None) -> JsonObject:
    """The run's retro, from every event of the run: those git holds and those the next
    snapshot is about to add."""
    recorder = runtime.recorder
    cp, manifest = runtime.cp, runtime.manifest
    events = runrefs.read_events(runtime.repo, recorder.meta_tip) if recorder.meta_tip else b""
    return retro.derive(
        events + recorder.pending_events(),
        run_id=runtime.run_id,
        workflow=manifest.workflow_slug,
        goal=manifest.goal,
        status=status,
        error=error,
        started_at=cp.started_at,
        finished_at=cp.finished_at,
        duration_ms=cp.active_ms,
    )


def retro_files(
    runtime: Runtime, status: str, error: str | None, narrative: JsonObject | None
) -> dict[str, bytes]:
    """`retro.json` for the finalize snapshot. A retro that cannot be made is reported
    and left out; it never changes how the run ended."""
    try:
        document = retro_document(runtime, status, error)
    except FabroError as exc:
        runtime.emit(
            RunNotice(level="warn", code="retro_failed", message=f"no retro written: {exc}")
        )
        return {}
    if narrative is not None:
        document["narrative"] = narrative
    return {runrefs.RETRO: retro.encode(document)}


# A run's end waits this long at most for its retro's narrative.
NARRATIVE_TIMEOUT = 300.0


async def narrative_for(runtime: Runtime, status: str, error: str | None) -> JsonObject | None:
    """The narrative of the run's retro (`run --retro-narrative`), or None, said why."""
    why: str | None = "a dry run calls no model"
    narrative = None
    if not runtime.options.dry_run:
        try:
            document = retro_document(runtime, status, error if status == FAILED else None)
        except FabroError as exc:
            document, why = None, str(exc)
        if document is not None:
            with trio.move_on_after(NARRATIVE_TIMEOUT) as deadline:
                narrative, why = await narrate(
                    document, model=runtime.options.model, provider=runtime.options.provider
                )
            if deadline.cancelled_caught:
                why = f"the model did not answer within {NARRATIVE_TIMEOUT:g}s"
    if narrative is None:
        runtime.emit(
            RunNotice(
                level="warn",
                code="retro_narrative_failed",
                message=f"the retro has no narrative: {why}",
            )
        )
    return narrative
