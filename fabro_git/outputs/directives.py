"""Routing directives: the JSON an agent or prompt stage puts in its reply to steer the run.

A reply is prose written by a model, so the scan expects anything: fenced blocks, inline
objects, objects nested in others, braces in strings, and stray or unmatched braces. Every
`{` is a place an object may start, and `json.JSONDecoder.raw_decode` from there either
reads a whole object or fails at once, so one broken brace never hides a later object.
An object with a recognised field is a candidate (the last one wins) and is skipped as a
whole, so its own `context_updates` cannot stand in for it; an object without one is
looked into, since the directive may be nested inside it. Each character is visited at
most once per level of nesting, so the scan stays linear for prose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROUTING_FIELDS = (
    "outcome",
    "failure_reason",
    "preferred_next_label",
    "suggested_next_ids",
    "context_updates",
)

# A status.json larger than this is not a directive file, whatever it holds.
STATUS_FILE_LIMIT = 1024 * 1024

_DECODER = json.JSONDecoder()


def extract_directives(text: str) -> dict[str, Any] | None:
    """The last JSON object in `text` with at least one recognised field, or None."""
    found: dict[str, Any] | None = None
    pos = text.find("{")
    while pos >= 0:
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):  # not an object here, or nested absurdly deep
            pos = text.find("{", pos + 1)
            continue
        if isinstance(value, dict) and any(key in value for key in ROUTING_FIELDS):
            found = value
            pos = text.find("{", end)
        else:
            pos = text.find("{", pos + 1)
    return found


def directives_from_status_file(worktree: Path | None) -> dict[str, Any] | None:
    """The directives in a `status.json` the stage left at the top of its worktree, for
    agents that write their outcome to a file instead of their reply."""
    if worktree is None:
        return None
    from fabro_git.files import UnreadableFile, read_input_text

    try:
        text = read_input_text(worktree / "status.json", limit=STATUS_FILE_LIMIT)
    except UnreadableFile:
        return None
    return extract_directives(text)
