"""Every workflow in the reference docs parses, and the complete ones validate.

The workflows are copied from the documents into `tests/fixtures/reference_workflows/`,
one `.fabro` file per DOT block, named `<document>-<n>` (n counts the document's blocks
from 1), so the suite runs in a clone without the docs; when the docs sit beside the
repository, a test checks the copies still match them. A parser change that breaks a
documented form fails here. A snippet without a start node is a fragment that
illustrates one attribute; it must still parse. Complete workflows must validate
without errors, except the ones listed in EXPECTED_ERRORS, each with its reason.

To refresh the copies after the docs change:
`PYTHONPATH=tests python tests/workflow/test_workflow_reference_docs.py`.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, SHARED

from fabro_git.workflow import parse, validate

FIXTURES = ROOT / "tests" / "fixtures" / "reference_workflows"
REFERENCE = SHARED / "reference"

# fixture -> rules expected to fire, and why.
EXPECTED_ERRORS: dict[str, tuple[set[str], str]] = {
    "attractor-spec-5": (
        {"all_conditional_edges"},
        "Attractor's smoke test routes agents on success/fail only; an agent can also "
        "finish partially_succeeded or skipped, which would leave it no edge to take",
    ),
}


@dataclass(frozen=True)
class Snippet:
    document: str
    line: int
    text: str


def _digraph_at(text: str, start: int) -> str:
    """The `digraph ... { }` starting at `start`, by brace depth outside strings."""
    depth = 0
    in_string = False
    pos = start
    while pos < len(text):
        char = text[pos]
        if in_string:
            if char == "\\":
                pos += 2
                continue
            if char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start : pos + 1]
        pos += 1
    raise AssertionError(f"unbalanced digraph at offset {start}")


def snippets() -> list[Snippet]:
    if not REFERENCE.is_dir():
        return []
    found: list[Snippet] = []
    documents = [*sorted(REFERENCE.glob("*.mdx")), *sorted(REFERENCE.glob("*.md"))]
    for document in documents:
        text = document.read_text(encoding="utf-8")
        for fence in re.finditer(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```", text, re.S | re.M):
            lang, body = fence.group(1), fence.group(2)
            if lang not in ("dot", "") or "digraph" not in body:
                continue
            body_start = fence.start(2)
            for header in re.finditer(r"^[ \t]*digraph\s+\w+\s*\{", body, re.M):
                offset = body_start + header.start()
                line = text.count("\n", 0, offset) + 1
                found.append(Snippet(document.name, line, _digraph_at(text, offset)))
    return found


def fixture_names(found: list[Snippet]) -> dict[str, Snippet]:
    """The fixture name of each snippet: its document's stem and its place in it."""
    counts: Counter[str] = Counter()
    named: dict[str, Snippet] = {}
    for snippet in found:
        stem = snippet.document.rsplit(".", 1)[0]
        counts[stem] += 1
        named[f"{stem}-{counts[stem]}"] = snippet
    return named


def fixtures() -> dict[str, str]:
    return {
        path.stem: path.read_text(encoding="utf-8") for path in sorted(FIXTURES.glob("*.fabro"))
    }


FIXTURE_TEXTS = fixtures()


def test_the_fixtures_hold_the_workflows_we_expect() -> None:
    names = {(stem.rsplit("-", 1)[0], parse(text).name) for stem, text in FIXTURE_TEXTS.items()}
    assert len(FIXTURE_TEXTS) >= 19
    assert ("fabro-reference-dot-language", "ImplementFeature") in names
    assert ("attractor-spec", "Branch") in names
    assert ("fabro-execution-context", "Example") in names  # from an indented fence
    assert set(EXPECTED_ERRORS) <= set(FIXTURE_TEXTS)


def test_the_fixtures_match_the_reference_docs() -> None:
    if not REFERENCE.is_dir():
        pytest.skip(f"the reference docs are not beside this clone ({REFERENCE})")
    documented = fixture_names(snippets())
    hint = "refresh the fixtures (see the module docstring)"
    assert sorted(FIXTURE_TEXTS) == sorted(documented), hint
    for name, snippet in documented.items():
        where = f"{snippet.document}:{snippet.line}"
        assert FIXTURE_TEXTS[name] == snippet.text + "\n", f"{name} differs from {where}; {hint}"


@pytest.mark.parametrize("name", sorted(FIXTURE_TEXTS))
def test_reference_workflow(name: str) -> None:
    graph = parse(FIXTURE_TEXTS[name], Path(f"{name}.fabro"))
    diagnostics = validate(graph)
    errors = {d.rule for d in diagnostics if d.severity == "error"}
    if graph.start_node() is None:
        # A fragment: it parses, and validation says exactly why it is incomplete.
        assert "start_node" in errors
        return
    expected, _reason = EXPECTED_ERRORS.get(name, (set(), ""))
    assert errors == expected, [d for d in diagnostics if d.severity == "error"]


def test_documented_semantics_survive_parsing() -> None:
    feature = parse(FIXTURE_TEXTS["fabro-reference-dot-language-2"])
    assert feature.name == "ImplementFeature"
    assert feature.nodes["implement"].classes == ["coding", "implementation"]
    assert feature.nodes["implement"].attrs["model"] == "claude-sonnet-4-5"
    assert feature.nodes["plan"].attrs["model"] == "claude-haiku-4-5"
    assert feature.nodes["test"].attrs["thread_id"] == "impl"
    pipeline = parse(FIXTURE_TEXTS["attractor-spec-4"])
    assert pipeline.name == "Pipeline"
    assert pipeline.nodes["critical_review"].attrs["model"] == "gpt-5.2"
    assert pipeline.nodes["implement"].attrs["model"] == "claude-opus-4-6"
    assert pipeline.nodes["plan"].attrs["provider"] == "anthropic"
    smoke = parse(FIXTURE_TEXTS["attractor-spec-5"])
    assert smoke.name == "test_pipeline"
    assert smoke.goal == "Create a hello world Python script"
    assert (len(smoke.nodes), len(smoke.edges)) == (5, 6)


def write_fixtures() -> None:
    """Rewrite the fixtures from the reference docs."""
    if not REFERENCE.is_dir():
        sys.exit(f"no reference docs at {REFERENCE}")
    for old in FIXTURES.glob("*.fabro"):
        old.unlink()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, snippet in fixture_names(snippets()).items():
        (FIXTURES / f"{name}.fabro").write_text(snippet.text + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_fixtures()
