"""What each summary fidelity keeps of the stages before it, read from the preamble a
dry-run prompt stage renders (`stage.prompt`), in this process.

Fabro's prompts doc: `summary:high` a detailed Markdown report per stage,
`summary:medium` outcomes and notable findings, `summary:low` outcomes alone.
"""

from __future__ import annotations

from pathlib import Path

from engine.inprocess.harness import walk

LONG = "x" * 900

STAGES = """
digraph F {
    graph [goal="tidy the notes"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    build [shape=parallelogram, script="echo compiled 3 files; echo 'warning: old cache'"]
    study [shape=tab, prompt="Study the notes",
           dry_run.response="Found a stale cache. %(long)s {\\"context_updates\\": {\\"finding\\": \\"cache is stale\\"}}"]
    ask   [shape=tab, prompt="What next?", fidelity="%(fidelity)s"]
    start -> build -> study -> ask -> exit
}
"""


def _preamble(tmp_path: Path, fidelity: str) -> str:
    walked = walk(STAGES % {"long": LONG, "fidelity": fidelity}, tmp_path, dry_run=True)
    assert walked.status == "succeeded", walked.error
    [prompt] = [e.properties.text for e in walked.named("stage.prompt") if e.node_id == "ask"]
    preamble, _, body = prompt.rpartition("What next?")
    assert body == ""
    return preamble


def test_summary_low_keeps_each_stages_outcome_alone(tmp_path: Path) -> None:
    text = _preamble(tmp_path, "summary:low")
    assert text.startswith("Run: RUN")
    assert "- build: succeeded" in text and "- study: succeeded" in text
    for detail in ("compiled 3 files", "stale cache", "finding", "## Context", "Stdout"):
        assert detail not in text, detail


def test_summary_medium_keeps_outcomes_and_findings(tmp_path: Path) -> None:
    text = _preamble(tmp_path, "summary:medium")
    assert "- **build**: succeeded" in text and "- **study**: succeeded" in text
    # The notable part of each: the output's last lines, the reply's opening, the context.
    assert "warning: old cache" in text
    assert "Found a stale cache." in text
    assert "finding: cache is stale" in text
    assert LONG not in text  # a reply is cut, not copied whole
    assert len(text) <= 6000


def test_summary_high_is_a_report_per_stage(tmp_path: Path) -> None:
    text = _preamble(tmp_path, "summary:high")
    assert "### build: succeeded" in text and "### study: succeeded" in text
    assert "compiled 3 files" in text and "warning: old cache" in text
    assert "echo compiled 3 files" in text  # the script that ran
    assert "Found a stale cache." in text
    assert "finding" in text and "## Context" in text


def test_the_levels_differ_from_compact_and_from_each_other(tmp_path: Path) -> None:
    texts = {
        level: _preamble(tmp_path / level.replace(":", "-"), level)
        for level in ("compact", "summary:high", "summary:medium", "summary:low")
    }
    assert len(set(texts.values())) == 4
    assert len(texts["summary:low"]) < len(texts["summary:medium"]) < len(texts["summary:high"])
