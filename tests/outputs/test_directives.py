"""Routing directives are found wherever a reply puts them, and nothing in the prose
around them (stray braces, strings, other JSON) can hide or replace them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fabro_git.outputs.directives import StatusFile, extract_directives

# Prose that cannot spell a recognised field, but has every character that trips a
# scanner: braces, brackets, quotes, backslashes, colons, commas.
PROSE = st.text(alphabet='{}[]":,\\ abxyz\n`0123456789', max_size=80)
DIRECTIVES = st.fixed_dictionaries(
    {"preferred_next_label": st.sampled_from(["fix", "ship", 'x {y} "z"'])},
    optional={
        "outcome": st.sampled_from(["success", "fail", "partial_success", "retry", "skipped"]),
        "context_updates": st.dictionaries(st.sampled_from(["k", "n"]), st.integers(), max_size=2),
    },
)


@given(before=PROSE, directive=DIRECTIVES, after=PROSE)
def test_a_directive_is_found_whatever_prose_surrounds_it(
    before: str, directive: dict, after: str
) -> None:
    text = before + " " + json.dumps(directive) + " " + after
    assert extract_directives(text) == directive


def test_a_stray_brace_does_not_hide_a_later_object() -> None:
    reply = 'I used a set {1, 2 and then { more.\n{"outcome": "fail", "failure_reason": "tests"}'
    assert extract_directives(reply) == {"outcome": "fail", "failure_reason": "tests"}


def test_fenced_inline_nested_and_last_wins() -> None:
    fenced = 'Done.\n```json\n{"preferred_next_label": "fix"}\n```\n'
    assert extract_directives(fenced) == {"preferred_next_label": "fix"}
    two = '{"outcome": "fail"} then later {"outcome": "success"}'
    assert extract_directives(two) == {"outcome": "success"}
    nested = '{"report": {"suggested_next_ids": ["a", "b"]}, "note": "}"}'
    assert extract_directives(nested) == {"suggested_next_ids": ["a", "b"]}
    # A recognised object is taken whole: its own context_updates do not replace it.
    whole = '{"preferred_next_label": "a", "context_updates": {"outcome": "x"}}'
    assert extract_directives(whole) == {
        "preferred_next_label": "a",
        "context_updates": {"outcome": "x"},
    }
    braces_in_strings = '{"failure_reason": "expected } or {", "outcome": "fail"}'
    assert extract_directives(braces_in_strings)["failure_reason"] == "expected } or {"


def test_json_without_recognised_fields_is_ignored() -> None:
    assert extract_directives('{"coverage": 72} and {"x": {"y": 1}}') is None
    assert extract_directives("no braces at all") is None
    assert extract_directives("{" * 5000 + "}" * 4000) is None  # deep, unbalanced


def test_status_file_counts_only_once_the_stage_wrote_it(tmp_path: Path) -> None:
    assert StatusFile(tmp_path).directives() is None
    assert StatusFile(None).directives() is None
    status = tmp_path / "status.json"
    status.write_text('{"outcome": "skipped"}')
    already_there = StatusFile(tmp_path)
    assert already_there.directives() is None
    status.write_text('{"outcome": "fail"}')
    assert already_there.directives() == {"outcome": "fail"}
    rewritten = StatusFile(tmp_path)
    status.unlink()
    status.write_text('{"outcome": "fail"}')  # the same bytes, written again later
    later = status.stat().st_mtime_ns + 1_000_000_000
    os.utime(status, ns=(later, later))
    assert rewritten.directives() == {"outcome": "fail"}
    status.write_text("not json")
    assert rewritten.directives() is None
