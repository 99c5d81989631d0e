"""The words events are told in: durations, costs, statuses, edges, errors, one line
each, shared by `logs --pretty` (`fabro_git.events.pretty`) and the live progress
(`fabro_git.events.render`)."""

from __future__ import annotations

import json
import re

from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.terminal import printable


def format_duration(ms: JsonValue) -> str:
    """`340ms`, `8.0s`, `2m05s`, `1h02m`; `?` for no number (an event without it)."""
    if not isinstance(ms, int | float):
        return "?"
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    secs = ms // 1000
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def status_word(value: object) -> str:
    return str(value or "?").replace("_", " ")


_SPACES = re.compile(r"[ \t\n]+")


def shorten(value: object, limit: int = 80) -> str:
    """`value` on one line of at most `limit` characters: runs of spaces and newlines
    become one space, and every other control character is shown as its escape."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = printable(_SPACES.sub(" ", text).strip(), one_line=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_sha(value: object) -> str:
    return str(value)[:10] if value else "?"


def format_cost(dollars: float) -> str:
    """A cost in one format wherever one is shown: `$12.34`; under a dollar, four places,
    so a small run's cost is seen (`$0.0067`, not `$0.01`)."""
    if dollars >= 1:
        return f"${dollars:,.2f}"
    if 0 < dollars < 0.00005:
        return "<$0.0001"
    return f"${dollars:.4f}"


def cost_text(value: object) -> str:
    return format_cost(value) if isinstance(value, int | float) else ""


def node_name(event: JsonObject) -> str:
    node_id = event.get("node_id")
    label = event.get("node_label")
    if not node_id:
        return str(label or "")
    if label and label != node_id:
        return f"{label} ({node_id})"
    return str(node_id)


def joined(*parts: str) -> str:
    return "  ".join(p for p in parts if p)


_EDGE_WHY = {
    "preferred_label": "chosen label",
    "suggested_next": "suggested next",
    "retry_target": "retry target",
    "fallback_retry_target": "fallback retry target",
    "goal_gate": "goal gate",
    "jump": "jump",
}


def edge_text(p: JsonObject) -> str:
    """`fix -> test`, with the label and why the edge was taken when that is news:
    a condition that held, a chosen label; an edge that is the only way on says nothing."""
    text = f"{p.get('from_node', '?')} -> {p.get('to_node', '?')}"
    label = str(p.get("label") or "")
    if label:
        text += f"  {label}" if label.startswith("[") else f"  [{label}]"
    reason = str(p.get("reason") or "")
    if p.get("condition"):
        text += f"  (when {p['condition']})"
    elif reason and reason not in ("unconditional", "condition"):
        text += f"  ({_EDGE_WHY.get(reason, reason.replace('_', ' '))})"
    return text


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def attempt_text(p: JsonObject) -> str:
    attempt, most = p.get("attempt"), p.get("max_attempts")
    if attempt is None or (attempt == 1 and most in (None, 1)):
        return ""
    return f"attempt {attempt}/{most}" if most else f"attempt {attempt}"


def error_said(error: object) -> str:
    """An `agent.error`'s error as a person reads it: its message (and whose), not the
    record it travels as."""
    if not isinstance(error, dict):
        return str(error)
    message = str(error.get("message") or error.get("kind") or "failed")
    who = "/".join(str(error[k]) for k in ("provider", "model") if error.get(k))
    return f"{who}: {message}" if who else message


def error_text(p: JsonObject) -> str:
    err = p.get("error")
    if not err:
        return ""
    return f"error: {shorten(err, 160)}"
