"""Human output: `logs --pretty` lines and the progress renderer, plain and live."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import pytest

from fabro_git.events.bus import EventBus
from fabro_git.events.catalogue import (
    AgentToolStarted,
    EdgeSelected,
    ParallelBranchCompleted,
    RunCompleted,
    RunNotice,
    RunStarted,
    StageCompleted,
    StageFailed,
    StageRetrying,
    StageStarted,
)
from fabro_git.events.render import ProgressRenderer, format_duration, format_pretty


def _env(event: str, props: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    return {
        "id": "019234ab-cdef-7890-abcd-ef1234567890",
        "ts": "2026-04-01T12:00:00.123Z",
        "run_id": "01JQXYZ",
        "event": event,
        **envelope,
        "properties": props,
    }


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (340, "340ms"),
        (8000, "8.0s"),
        (59_949, "59.9s"),
        (125_000, "2m05s"),
        (3_720_000, "1h02m"),
        (None, "?"),
    ],
)
def test_format_duration(ms: int | None, text: str) -> None:
    assert format_duration(ms) == text


def test_a_duration_that_is_no_number_reads_as_unknown() -> None:
    # An events file edited by hand or cut short: `logs --pretty` says what it can.
    line = format_pretty(_env("run.failed", {"error": "boom", "duration_ms": "soon"}))
    assert "failed  ?  error: boom" in line
    assert format_duration([1]) == "?"


def test_pretty_stage_completed() -> None:
    line = format_pretty(
        _env(
            "stage.completed",
            {
                "index": 1,
                "duration_ms": 8000,
                "status": "succeeded",
                "suggested_next_ids": [],
                "files_touched": ["a.py", "b.py"],
                "attempt": 2,
                "max_attempts": 3,
            },
            node_id="code",
            node_label="Write Code",
        )
    )
    assert line.startswith("12:00:00.123  stage.completed ")
    for fact in ("Write Code (code)", "succeeded", "8.0s", "attempt 2/3", "2 files touched"):
        assert fact in line
    assert "\n" not in line


def test_pretty_edge_and_errors() -> None:
    edge = format_pretty(
        _env(
            "edge.selected",
            {
                "from_node": "code",
                "to_node": "review",
                "label": "tests_pass",
                "condition": "outcome=succeeded",
                "reason": "condition",
            },
        )
    )
    assert edge.endswith("code -> review  [tests_pass]  (when outcome=succeeded)")
    failed = format_pretty(
        _env("run.failed", {"error": "Handler error:\n  boom", "duration_ms": 12000})
    )
    assert "12.0s" in failed and "error: Handler error: boom" in failed
    stage_failed = format_pretty(
        _env(
            "stage.failed",
            {"index": 1, "error": "lint", "failure_class": "deterministic", "will_retry": False},
            node_id="code",
        )
    )
    assert "error: lint" in stage_failed and "no retry" in stage_failed
    assert "deterministic" not in stage_failed


def test_pretty_falls_back_to_scalar_facts() -> None:
    line = format_pretty(_env("agent.turn.limit", {"max_turns": 25}, node_id="code"))
    assert line.endswith("code" + " " * 22 + "max_turns=25")
    odd = format_pretty({"event": "mystery"})
    assert "mystery" in odd


def run_sequence(renderer: ProgressRenderer) -> None:
    bus = EventBus("01JQXYZ", [renderer])
    bus.emit(RunStarted(name="demo", goal="Fix the bug"))
    bus.emit(
        StageStarted(index=1, handler_type="agent", attempt=1, max_attempts=2),
        node_id="code",
        node_label="Write Code",
    )
    bus.emit(
        AgentToolStarted(tool_name="read_file", tool_call_id="c1", arguments={"path": "a"}),
        node_id="code",
        session_id="ses_a",
    )
    bus.emit(
        StageFailed(index=1, error="tests failed", failure_class="deterministic", will_retry=True),
        node_id="code",
        node_label="Write Code",
    )
    bus.emit(
        StageRetrying(index=1, attempt=2, max_attempts=2, delay_ms=500),
        node_id="code",
        node_label="Write Code",
    )
    bus.emit(
        StageCompleted(
            index=1,
            duration_ms=8000,
            status="succeeded",
            suggested_next_ids=[],
            files_touched=[],
            attempt=2,
            max_attempts=2,
        ),
        node_id="code",
        node_label="Write Code",
    )
    bus.emit(
        EdgeSelected(
            from_node="code",
            to_node="review",
            label="ok",
            reason="condition",
            condition="outcome=succeeded",
            suggested_next_ids=[],
            stage_status="succeeded",
            is_jump=False,
        )
    )
    bus.emit(RunNotice(level="warn", code="missing_env_var", message="GITHUB_TOKEN not set"))
    bus.emit(
        StageStarted(index=2, handler_type="command", attempt=1, max_attempts=1), node_id="review"
    )
    bus.emit(
        StageCompleted(
            index=2,
            duration_ms=125_000,
            status="failed",
            error="exit 1",
            suggested_next_ids=[],
            files_touched=[],
            attempt=1,
            max_attempts=1,
        ),
        node_id="review",
    )
    bus.emit(
        ParallelBranchCompleted(index=0, duration_ms=5000, status="partially_succeeded"),
        node_id="branch_a",
    )
    bus.emit(RunCompleted(duration_ms=45_000, artifact_count=0, status="failed", total_cost=0.15))
    bus.close()


def test_progress_plain_lines() -> None:
    out = io.StringIO()
    renderer = ProgressRenderer(out)  # not a TTY: plain
    assert not renderer.live
    run_sequence(renderer)
    text = out.getvalue()
    assert "\x1b" not in text
    assert text.splitlines() == [
        "Running demo (run 01JQXYZ) - Fix the bug",
        "Write Code (code): started (agent, attempt 1/2)",
        "Write Code (code): attempt failed: tests failed",
        "Write Code (code): retrying (attempt 2/2) in 500ms",
        "Write Code (code): succeeded in 8.0s (attempt 2/2)",
        "  code -> review  [ok]  (when outcome=succeeded)",
        "warning: GITHUB_TOKEN not set [missing_env_var]",
        "review: started (command)",
        "review: failed in 2m05s: exit 1",
        "  branch branch_a: partially succeeded in 5.0s",
        "Run failed in 45.0s (2 stages, $0.1500)",
    ]


def test_progress_run_failed_and_streaming_noise() -> None:
    out = io.StringIO()
    renderer = ProgressRenderer(out, live=False)
    renderer.handle_dict(_env("agent.text.delta", {"delta": "hello"}, node_id="code"))
    renderer.handle_dict(_env("run.failed", {"error": "stage code failed", "duration_ms": 1200}))
    assert out.getvalue() == "Run failed after 1.2s: stage code failed\n"


def test_progress_defaults_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    renderer = ProgressRenderer()
    renderer.handle_dict(_env("run.notice", {"level": "error", "code": "x", "message": "bad"}))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: bad [x]\n"


def test_progress_live_display(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    renderer = ProgressRenderer(out, live=True)
    run_sequence(renderer)
    text = out.getvalue()
    assert "Write Code (code): succeeded in 8.0s" in text
    assert "code -> review  [ok]" in text
    assert "Run failed in 45.0s" in text
    assert "\x1b[32m" in text  # green tick for the succeeded stage


def test_progress_live_honours_no_color() -> None:
    out = io.StringIO()
    run_sequence(ProgressRenderer(out, live=True))  # the test env sets NO_COLOR=1
    text = out.getvalue()
    assert "Write Code (code): succeeded in 8.0s" in text
    assert "\x1b[32m" not in text and "\x1b[31m" not in text


def test_importing_events_does_not_import_rich() -> None:
    code = (
        "import io, sys\n"
        "import fabro_git.events, fabro_git.events.render as r\n"
        "p = r.ProgressRenderer(io.StringIO())\n"
        "p.handle_dict({'event': 'run.notice', 'properties': {'level': 'info', 'code': 'c', 'message': 'm'}})\n"
        "assert 'rich' not in sys.modules, 'rich imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def _command_stage(renderer: ProgressRenderer, status: str, out: str, err: str = "") -> None:
    bus = EventBus("01JQXYZ", [renderer])
    bus.emit(
        StageStarted(index=0, handler_type="start", attempt=1, max_attempts=1), node_id="start"
    )
    bus.emit(
        StageCompleted(
            index=0,
            duration_ms=0,
            status="succeeded",
            suggested_next_ids=[],
            files_touched=[],
            attempt=1,
            max_attempts=1,
        ),
        node_id="start",
    )
    bus.emit(StageStarted(index=1, handler_type="command", attempt=1, max_attempts=1), node_id="t")
    if status == "failed":
        bus.emit(
            StageFailed(
                index=1,
                error="command exited with status 1",
                failure_class="deterministic",
                will_retry=False,
            ),
            node_id="t",
        )
    bus.emit(
        StageCompleted(
            index=1,
            duration_ms=10,
            status=status,
            error="command exited with status 1" if status == "failed" else None,
            suggested_next_ids=[],
            files_touched=[],
            context_updates={"command.output": out, "command.stderr": err},
            attempt=1,
            max_attempts=1,
        ),
        node_id="t",
    )
    bus.emit(
        EdgeSelected(
            from_node="t",
            to_node="exit",
            reason="unconditional",
            suggested_next_ids=[],
            stage_status=status,
            is_jump=False,
        )
    )
    if status == "failed":
        from fabro_git.events.catalogue import RunFailed

        bus.emit(RunFailed(error="stage t failed: command exited with status 1", duration_ms=20))
    bus.close()


def test_progress_shows_a_short_output_tail_and_no_bookkeeping() -> None:
    out = io.StringIO()
    _command_stage(ProgressRenderer(out), "succeeded", "one\ntwo\n\nthree\nfour\n")
    assert out.getvalue().splitlines() == [
        "t: started (command)",
        "t: succeeded in 10ms",
        "    │ two",
        "    │ three",
        "    │ four",
    ]


def test_progress_failure_is_said_once_with_its_stderr() -> None:
    out = io.StringIO()
    err = "".join(f"e{i}\n" for i in range(20))
    _command_stage(ProgressRenderer(out), "failed", "ignored\n", err)
    lines = out.getvalue().splitlines()
    assert sum("exited with status 1" in line for line in lines) == 1
    assert lines[1] == "t: failed in 10ms: command exited with status 1"
    assert lines[2:14] == [f"    │ e{i}" for i in range(8, 20)]
    assert lines[-1] == "Run failed after 20ms: stage t failed"


def test_progress_quiet_and_verbose_output() -> None:
    quiet = io.StringIO()
    _command_stage(ProgressRenderer(quiet, output="none"), "succeeded", "a\nb\n")
    assert "│" not in quiet.getvalue()
    loud = io.StringIO()
    _command_stage(
        ProgressRenderer(loud, output="all"),
        "succeeded",
        "".join(f"{i}\n" for i in range(9)),
        "warn\n",
    )
    assert [ln for ln in loud.getvalue().splitlines() if "│" in ln] == [
        *(f"    │ {i}" for i in range(9)),
        "    │ warn",
    ]


def test_escape_sequences_never_reach_the_terminal() -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\x9b31m"
    out = io.StringIO()
    renderer = ProgressRenderer(out)
    renderer.handle_dict(_env("run.started", {"name": "demo", "goal": hostile}, node_id=None))
    renderer.handle_dict(
        _env(
            "stage.completed",
            {"status": "failed", "error": hostile, "context_updates": {"command.stderr": hostile}},
            node_id="x" + hostile,
        )
    )
    pretty = format_pretty(_env("run.notice", {"level": "warn", "code": "c", "message": hostile}))
    for text in (out.getvalue(), pretty):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m"
    assert escaped in pretty
    # Shown escaped, not dropped: the goal, the node id, the error and the stderr.
    assert out.getvalue().splitlines() == [
        f"Running demo (run 01JQXYZ) - {escaped}",
        f"x{escaped}: failed in ?: {escaped}",
        f"    │ {escaped}",
    ]
