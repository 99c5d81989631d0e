"""Cutting tool output down to what the model is sent.

The model sees at most a per-tool number of characters, then of lines; the events keep
the whole output. Characters are cut first because a file of two 10 MB lines passes any
line limit. The cut keeps the head and the tail (a file's imports and its end, a
command's start-up and its result) or, for listings, only the tail, and says in the text
how much went, so the model never mistakes a part for the whole. A secret across a cut
is left out whole (`Redactor.widen_cut`): the conversation is written to git masked,
and a half secret kept there would be a half no pattern recognises.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from fabro_git import redact

Mode = Literal["head_tail", "tail"]


class OutputLimit(msgspec.Struct, frozen=True, kw_only=True):
    max_chars: int
    mode: Mode
    max_lines: int | None = None


DEFAULT_LIMITS: dict[str, OutputLimit] = {
    "read_file": OutputLimit(max_chars=50_000, mode="head_tail"),
    "shell": OutputLimit(max_chars=30_000, mode="head_tail", max_lines=256),
    "grep": OutputLimit(max_chars=20_000, mode="tail", max_lines=200),
    "glob": OutputLimit(max_chars=20_000, mode="tail", max_lines=500),
    "edit_file": OutputLimit(max_chars=10_000, mode="tail"),
    "apply_patch": OutputLimit(max_chars=10_000, mode="tail"),
    "write_file": OutputLimit(max_chars=1_000, mode="tail"),
    "use_skill": OutputLimit(max_chars=50_000, mode="head_tail"),
}
FALLBACK_LIMIT = OutputLimit(max_chars=20_000, mode="head_tail")


def truncate_chars(output: str, max_chars: int, mode: Mode) -> str:
    if len(output) <= max_chars:
        return output
    redactor = redact.for_process()
    if mode == "tail":
        _, end = redactor.widen_cut(output, 0, len(output) - max_chars)
        return (
            f"[output truncated: the first {end} characters were removed; "
            "the full output is in the run's events]\n\n" + output[end:]
        )
    start, end = redactor.widen_cut(
        output, max_chars // 2, len(output) - (max_chars - max_chars // 2)
    )
    return (
        output[:start]
        + f"\n\n[output truncated: {end - start} characters were removed from the middle; "
        "the full output is in the run's events. Ask for a narrower range to see them.]\n\n"
        + output[end:]
    )


def truncate_lines(output: str, max_lines: int) -> str:
    lines = output.split("\n")
    if len(lines) <= max_lines:
        return output
    head = max_lines // 2
    tail = max_lines - head
    start = sum(len(line) + 1 for line in lines[:head])
    end = len(output) - sum(len(line) + 1 for line in lines[len(lines) - tail :]) + 1
    start, end = redact.for_process().widen_cut(output, start, end)
    omitted = output.count("\n", start, end)
    return f"{output[:start]}[... {omitted} lines omitted ...]\n{output[end:]}"


def truncate_tool_output(output: str, limit: OutputLimit) -> str:
    result = truncate_chars(output, limit.max_chars, limit.mode)
    if limit.max_lines is not None:
        result = truncate_lines(result, limit.max_lines)
    return result
