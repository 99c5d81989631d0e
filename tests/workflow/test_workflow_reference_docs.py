"""Every workflow in the reference docs parses, and the complete ones validate.

The snippets are extracted from the documents themselves, so a parser change that
breaks a documented form fails here. A snippet without a start node is a fragment that
illustrates one attribute; it must still parse. Complete workflows must validate
without errors, except the ones listed in EXPECTED_ERRORS, each with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SHARED

from fabro_git.workflow import parse, validate

REFERENCE = SHARED / "reference"

# (document, graph name) -> rules expected to fire, and why.
EXPECTED_ERRORS: dict[tuple[str, str], tuple[set[str], str]] = {
    ("attractor-spec.md", "test_pipeline"): (
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

    @property
    def name(self) -> str:
        match = re.match(r"\s*digraph\s+(\w+)", self.text)
        assert match is not None
        return match.group(1)

    def __str__(self) -> str:
        return f"{self.document}:{self.line}:{self.name}"


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
    documents = [*sorted(REFERENCE.glob("*.mdx")), REFERENCE / "attractor-spec.md"]
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


SNIPPETS = snippets()
pytestmark = pytest.mark.skipif(not SNIPPETS, reason="reference docs not available")


def test_the_docs_contain_the_workflows_we_expect() -> None:
    names = {(s.document, s.name) for s in SNIPPETS}
    assert len(SNIPPETS) >= 19
    assert ("fabro-reference-dot-language.mdx", "ImplementFeature") in names
    assert ("attractor-spec.md", "Branch") in names
    assert ("fabro-execution-context.mdx", "Example") in names  # an indented fence
    assert set(EXPECTED_ERRORS) <= names


@pytest.mark.parametrize("snippet", SNIPPETS, ids=str)
def test_reference_workflow(snippet: Snippet) -> None:
    graph = parse(snippet.text, Path(snippet.document))
    diagnostics = validate(graph)
    errors = {d.rule for d in diagnostics if d.severity == "error"}
    if graph.start_node() is None:
        # A fragment: it parses, and validation says exactly why it is incomplete.
        assert "start_node" in errors
        return
    expected, _reason = EXPECTED_ERRORS.get((snippet.document, snippet.name), (set(), ""))
    assert errors == expected, [d for d in diagnostics if d.severity == "error"]


def test_documented_semantics_survive_parsing() -> None:
    by_name = {(s.document, s.name): s for s in SNIPPETS}
    feature = parse(by_name["fabro-reference-dot-language.mdx", "ImplementFeature"].text)
    assert feature.nodes["implement"].classes == ["coding", "implementation"]
    assert feature.nodes["implement"].attrs["model"] == "claude-sonnet-4-5"
    assert feature.nodes["plan"].attrs["model"] == "claude-haiku-4-5"
    assert feature.nodes["test"].attrs["thread_id"] == "impl"
    pipeline = parse(by_name["attractor-spec.md", "Pipeline"].text)
    assert pipeline.nodes["critical_review"].attrs["model"] == "gpt-5.2"
    assert pipeline.nodes["implement"].attrs["model"] == "claude-opus-4-6"
    assert pipeline.nodes["plan"].attrs["provider"] == "anthropic"
    smoke = parse(by_name["attractor-spec.md", "test_pipeline"].text)
    assert smoke.goal == "Create a hello world Python script"
    assert (len(smoke.nodes), len(smoke.edges)) == (5, 6)
