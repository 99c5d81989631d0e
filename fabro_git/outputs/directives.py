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
import os
import re
from pathlib import Path

from fabro_git.jsondata import JsonObject

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


def extract_directives(text: str) -> JsonObject | None:
    """The last JSON object in `text` with at least one recognised field, or None."""
    found = find_directives(text)
    return found[0] if found is not None else None


def find_directives(text: str) -> tuple[JsonObject, int, int] | None:
    """The directive `extract_directives` reads, with where it starts and ends in `text`."""
    found: tuple[JsonObject, int, int] | None = None
    pos = text.find("{")
    while pos >= 0:
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):  # not an object here, or nested absurdly deep
            pos = text.find("{", pos + 1)
            continue
        if isinstance(value, dict) and any(key in value for key in ROUTING_FIELDS):
            found = (value, pos, end)
            pos = text.find("{", end)
        else:
            pos = text.find("{", pos + 1)
    return found


_FENCE_OPEN = re.compile(r"```[A-Za-z]*\s*$")
_FENCE_CLOSE = re.compile(r"\s*```")


def in_words(text: str) -> str:
    """A reply as a person reads it: its directive, if any, said in words in its place
    (`the stage asks to go to: deploy`), not as the JSON a model wrote for the engine."""
    found = find_directives(text)
    if found is None:
        return text
    directive, start, end = found
    said = []
    outcome = directive.get("outcome")
    if outcome is not None:
        reason = directive.get("failure_reason")
        said.append(f"the stage reports: {outcome}" + (f" ({reason})" if reason else ""))
    label = directive.get("preferred_next_label")
    if label:
        said.append(f"the stage asks to go to: {label}")
    suggested = directive.get("suggested_next_ids")
    if isinstance(suggested, list) and suggested:
        said.append("the stage suggests next: " + ", ".join(str(s) for s in suggested))
    updates = directive.get("context_updates")
    if isinstance(updates, dict) and updates:
        said.append("the stage sets: " + ", ".join(f"{k}={v}" for k, v in updates.items()))
    before, after = text[:start], text[end:]
    fence_open, fence_close = _FENCE_OPEN.search(before), _FENCE_CLOSE.match(after)
    if fence_open and fence_close:  # a fence around the directive alone goes with it
        before, after = before[: fence_open.start()], after[fence_close.end() :]
    return before + "\n".join(f"({line})" for line in said) + after


class StatusFile:
    """The `status.json` at the top of a stage's worktree, as it stood when the stage
    started: for agents that write their outcome to a file instead of their reply.

    Only a file the stage wrote counts. One the repository carries, or an earlier stage
    left, is the same file afterwards and steers nothing: a committed `status.json` must
    not route every stage whose reply has no directive. Written means created, removed and
    created again, or changed in its bytes or its stat data (a rewrite with the same
    bytes, as a loop's second visit may make, still counts)."""

    def __init__(self, worktree: Path | None) -> None:
        self.path = None if worktree is None else worktree / "status.json"
        self._before = self._state()

    def _state(self) -> tuple[int, int, int, bytes] | None:
        """(inode, size, mtime, bytes) of the file, or None when there is none to read."""
        from fabro_git.files import UnreadableFile, read_input_file

        if self.path is None:
            return None
        try:
            info = os.stat(self.path)
            data = read_input_file(self.path, limit=STATUS_FILE_LIMIT)
        except (OSError, UnreadableFile):
            return None
        return (info.st_ino, info.st_size, info.st_mtime_ns, data)

    def directives(self) -> JsonObject | None:
        """The directives in the file, when the stage wrote it since it started."""
        state = self._state()
        if state is None or state == self._before:
            return None
        try:
            text = state[3].decode("utf-8-sig")
        except UnicodeDecodeError:
            return None
        return extract_directives(text)
