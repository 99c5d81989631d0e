"""Events for people: one-line summaries for `logs --pretty`, and live run progress.

The JSON events are the record; this module only reads them. `format_pretty`
(`fabro_git.events.pretty`) turns any event into one line. `ProgressRenderer` is a sink that shows a run as it happens: on a
terminal, a spinner per running stage with finished stages printed above it; anywhere
else (CI logs, pipes, `NO_COLOR`), plain lines with no escape codes. It writes to stderr
unless told otherwise, because stdout belongs to `--json` results.

rich is imported only when a live display is actually wanted, so importing the events
package stays cheap.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import IO

import msgspec

from fabro_git.events.envelope import Envelope
from fabro_git.events.phrases import (
    attempt_text,
    cost_text,
    edge_text,
    error_said,
    format_cost,
    format_duration,
    node_name,
    plural,
    shorten,
    status_word,
)
from fabro_git.events.pretty import SessionDepth, format_pretty
from fabro_git.jsondata import JsonObject
from fabro_git.terminal import printable

# Re-exported: the commands read these here.
__all__ = [
    "ProgressRenderer",
    "SessionDepth",
    "format_cost",
    "format_duration",
    "format_pretty",
]


# ---------------------------------------------------------------------------- progress

# The most of one output line a stage's end shows without -v.
TAIL_LINE_LIMIT = 300

# Streaming chatter a progress display should not print line by line.
_QUIET_PREFIXES = ("agent.text.", "agent.reasoning.", "agent.output.", "agent.tool.output.")

_MARK = {
    "succeeded": ("✓", "green"),
    "failed": ("✗", "red"),
    "partially_succeeded": ("◐", "yellow"),
    "skipped": ("○", "dim"),
}


class _Line(msgspec.Struct):
    text: str
    style: str = ""
    mark: str = ""
    # A line of a command's output, cut to the terminal's width on a live display.
    # Every other line is shown whole, wrapped by the terminal: a run id or a command
    # to copy (`git fabro resume ID`) must never lose its end.
    output: bool = False


class ProgressRenderer:
    """A sink that shows a run's progress: stages, status, durations, edges, outcome.

    `live=None` picks the live display when `stream` is a terminal and `TERM` is not
    `dumb`; plain mode writes one line per fact with no escape codes. `NO_COLOR` turns
    colour off in live mode too.
    """

    def __init__(
        self, stream: IO[str] | None = None, *, live: bool | None = None, output: str = "tail"
    ) -> None:
        self.stream: IO[str] = stream if stream is not None else sys.stderr
        # What of a command's output to show after its stage: "tail" (a few lines, and
        # more when it failed), "none" (--quiet) or "all" (--verbose).
        self.output = output
        self._errors_shown: set[str] = set()
        self._bookends: set[str] = set()  # start and exit stages, shown only if they fail
        self._asking = False
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
        self.live = live
        self._running: dict[str, tuple[str, float, str]] = {}  # key -> (name, start, doing)
        # Stages ended: those this renderer saw, after `stages_before` ended in earlier
        # processes (set by resume), so the end line counts the whole run as its time and
        # cost do; a resumed run's end line says so.
        self.stages_before = 0
        self._stages_done = 0
        self._resumed = False
        self._display: _LiveDisplay | None = None
        # Stages whose output was shown line by line as it came (`command_line`).
        self._streamed: set[str] = set()

    # Sink protocol ---------------------------------------------------------------
    def handle(self, env: Envelope, line: bytes) -> None:
        if env.event.startswith(_QUIET_PREFIXES):
            return
        self.handle_dict(msgspec.to_builtins(env))

    def command_line(self, node_id: str, line: str) -> None:
        """One line a command stage printed, shown as it comes (`run -v`); the stage's
        end then does not show its output again. With stages running side by side, each
        line says whose it is. Without -v, on a terminal, the latest line shows beside the
        stage's spinner instead, so a long command is seen to be doing something."""
        if self.output != "all":
            if self.live and self.output == "tail" and line.strip():
                self._set_doing(node_id, line.strip())
                if self._display is not None:
                    self._display.refresh()
            return
        self._streamed.add(node_id)
        who = f"{node_id} " if len(self._running) > 1 else ""
        self._print(_Line(f"    {who}│ {line.rstrip()}", "dim", output=True))
        if self._display is not None:
            self._display.refresh()

    def close(self) -> None:
        if self._display is not None:
            self._display.stop()
            self._display = None

    # -----------------------------------------------------------------------------
    def handle_dict(self, event: JsonObject) -> None:
        """Render one decoded event (what `logs -f` reads back from the tail)."""
        name = str(event.get("event", ""))
        props = event.get("properties")
        props = props if isinstance(props, dict) else {}
        if name == "interview.started":
            # A person is about to be asked at this terminal: the spinner must not draw
            # over the question or the answer being typed.
            self._asking = True
            self.close()
        elif name in ("interview.completed", "interview.timeout"):
            self._asking = False
        # Visits of one node are sequential and parallel branches are distinct nodes, so
        # the node id identifies a stage in flight.
        key = str(event.get("node_id") or "")
        for out in self._describe(name, event, props, key):
            self._print(out)
        if self._display is not None:
            self._display.refresh()
        if name in ("run.completed", "run.failed"):
            self.close()

    def _describe(self, name: str, event: JsonObject, p: JsonObject, key: str) -> list[_Line]:
        describe = _DESCRIBE.get(name)
        return describe(self, name, event, p, key, node_name(event)) if describe else []

    def _on_run_started(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        goal = f" - {shorten(p['goal'], 100)}" if p.get("goal") else ""
        return [
            _Line(
                f"Running {p.get('name', 'workflow')} (run {event.get('run_id')}){goal}",
                "bold",
            )
        ]

    def _on_stage_started(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        if p.get("handler_type") in ("start", "exit"):
            self._bookends.add(key)
            return []  # every run has them; they do nothing worth a line
        self._running[key] = (node, time.monotonic(), "")
        if self.live:
            self._ensure_display()
            return []
        extra = ", ".join(x for x in (str(p.get("handler_type", "")), attempt_text(p)) if x)
        return [_Line(f"{node}: started ({extra})" if extra else f"{node}: started", "dim")]

    def _on_stage_completed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        self._running.pop(key, None)
        self._stages_done += 1
        if key in self._bookends and p.get("status") == "succeeded":
            return []
        status = str(p.get("status", "?"))
        mark, style = _MARK.get(status, ("•", ""))
        text = f"{node}: {status_word(status)} in {format_duration(p.get('duration_ms'))}"
        if p.get("attempt", 1) != 1:
            text += f" ({attempt_text(p)})"
        if p.get("error"):
            text += f": {shorten(p['error'], 200)}"
            if len(str(p["error"])) <= 200:  # else the run's failure says it whole
                self._errors_shown.add(str(p["error"]))
        if self.output == "all" and key in self._streamed:
            self._streamed.discard(key)
            return [_Line(text, style, mark)]  # its output is on screen already
        return [_Line(text, style, mark), *self._output_tail(p, failed=status == "failed")]

    def _on_stage_failed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        if not p.get("will_retry"):
            return []  # its stage.completed line says it, once
        err = shorten(p.get("error", ""), 160)
        return [_Line(f"{node}: attempt failed: {err}", "yellow", "✗")]

    def _on_stage_retrying(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"{node}: retrying ({attempt_text(p)}) in {format_duration(p.get('delay_ms'))}",
                "yellow",
                "↻",
            )
        ]

    def _on_edge_selected(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        if not p.get("label") and p.get("reason") == "unconditional":
            return []  # the only way on: the next stage's line says where it went
        return [_Line(f"  {edge_text(p)}", "cyan", "")]

    def _on_loop_restart(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"  loop: restarting at {p.get('to_node')} (from {p.get('from_node')})",
                "yellow",
            )
        ]

    def _on_run_notice(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        self._resumed = self._resumed or p.get("code") == "resumed"
        level = str(p.get("level", "info"))
        word = {"warn": "warning", "error": "error"}.get(level, "note")
        style = {"warn": "yellow", "error": "red"}.get(level, "dim")
        if level == "error":  # said whole: the run's failure need not say it again
            self._errors_shown.add(str(p.get("message", "")))
        return [_Line(f"{word}: {p.get('message', '')} [{p.get('code', '')}]", style)]

    def _on_run_completed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        status = str(p.get("status", "?"))
        mark, style = _MARK.get(status, ("•", ""))
        extras = [plural(self.stages_before + self._stages_done, "stage")]
        if p.get("total_cost") is not None:
            extras.append(cost_text(p["total_cost"]))
        scope = "whole run: " if self._resumed or self.stages_before else ""
        text = (
            f"Run {status_word(status)} in {format_duration(p.get('duration_ms'))}"
            f" ({scope}{', '.join(extras)})"
        )
        return [_Line(text, f"bold {style}".strip(), mark)]

    def _on_run_failed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        text = f"Run failed after {format_duration(p.get('duration_ms'))}"
        error = str(p.get("error") or "")
        for shown in self._errors_shown:  # said whole already, on a line of its own
            error = error.replace(shown, "").strip().rstrip(":").strip()
            error = error.replace(" ()", "")  # where it was quoted in brackets
        if error:
            text += f": {error}"  # whole: it may end with the command that goes on
        return [_Line(text, "bold red", "✗")]

    def _on_run_interrupt(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [_Line("interrupt requested; stopping after a checkpoint", "yellow")]

    def _on_checkpoint_failed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"error: checkpoint of {node or 'run'} failed: {shorten(p.get('error', ''), 200)}",
                "red",
            )
        ]

    def _on_metadata_snapshot_failed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"warning: metadata snapshot ({p.get('phase')}) failed: {shorten(p.get('error', ''), 200)}",
                "yellow",
            )
        ]

    def _on_parallel_started(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"{node or 'parallel'}: {p.get('branch_count', '?')} branches started",
                "dim",
            )
        ]

    def _on_parallel_branch_started(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        self._running[key] = (node, time.monotonic(), "branch")
        if self.live:
            self._ensure_display()
        return []

    def _on_parallel_branch_completed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        self._running.pop(key, None)
        status = str(p.get("status", "?"))
        mark, style = _MARK.get(status, ("•", ""))
        return [
            _Line(
                f"  branch {node}: {status_word(status)} in {format_duration(p.get('duration_ms'))}",
                style,
                mark,
            )
        ]

    def _on_parallel_completed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"parallel: {p.get('success_count', 0)} succeeded, {p.get('failure_count', 0)} failed in {format_duration(p.get('duration_ms'))}"
            )
        ]

    def _on_interview_started(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        question = str(p.get("question", ""))
        if question == event.get("node_label"):
            return []  # the stage's own line already reads as the question
        return [_Line(f"{node}: {shorten(question, 200)}", "bold")]

    def _on_interview_completed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        answer = shorten(p.get("answer", ""), 100)
        return [_Line(f"{node}: answered '{answer}'", "dim")]

    def _on_interview_timeout(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"{node}: question timed out after {format_duration(p.get('duration_ms'))}",
                "yellow",
            )
        ]

    def _on_subgraph_completed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        steps = p.get("steps_executed")
        steps = int(steps) if isinstance(steps, int | float) else 0
        return [
            _Line(
                f"{node}: subgraph {status_word(p.get('status'))} after {plural(steps, 'step')} in {format_duration(p.get('duration_ms'))}",
                "dim",
            )
        ]

    def _on_setup_failed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"setup command failed (exit {p.get('exit_code')}): {shorten(p.get('command', ''), 100)}: {shorten(p.get('stderr', ''), 200)}",
                "red",
            )
        ]

    def _on_sandbox_failed(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [_Line(f"warning: {name}: {shorten(p.get('error', ''), 200)}", "yellow")]

    def _on_watchdog_timeout(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        idle = p.get("idle_seconds")
        idle = idle if isinstance(idle, int | float) else 0
        return [
            _Line(
                f"warning: {node or 'run'} idle for {format_duration(idle * 1000)}",
                "yellow",
            )
        ]

    def _on_agent_tool_started(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        self._set_doing(key, f"{p.get('tool_name', 'tool')} {shorten(p.get('arguments', ''), 40)}")
        return []

    def _on_agent_failover(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        return [
            _Line(
                f"{node}: failing over {p.get('from_model')} -> {p.get('to_model')}: {shorten(p.get('error', ''), 120)}",
                "yellow",
            )
        ]

    def _on_agent_error(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        who = "sub-agent" if event.get("parent_session_id") else "agent"
        said = error_said(p.get("error", ""))
        return [_Line(f"{node}: {who} error: {shorten(said, 200)}", "red")]

    def _on_agent_warning(
        self, name: str, event: JsonObject, p: JsonObject, key: str, node: str
    ) -> list[_Line]:
        who = "sub-agent" if event.get("parent_session_id") else "agent"
        return [_Line(f"{node}: {who} warning: {shorten(p.get('message', ''), 200)}", "yellow")]

    def _output_tail(self, p: JsonObject, *, failed: bool) -> list[_Line]:
        """The end of a command stage's output, dimmed under its line."""
        if self.output == "none":
            return []
        from fabro_git.outputs.artifacts import resolved

        updates = p.get("context_updates")
        updates = updates if isinstance(updates, dict) else {}
        # An offloaded output is read back from its file: its pointer is no output.
        out = str(resolved(updates.get("command.output")) or "")
        err = str(resolved(updates.get("command.stderr")) or "")
        if self.output == "all":
            whole = out + ("\n" if out and not out.endswith("\n") else "") + err
            lines = whole.removesuffix("\n").split("\n") if whole else []
        else:
            keep = 12 if failed else 3
            source = err if failed and err.strip() else out
            # Split at newlines only: a CR or form feed inside a line is shown, not obeyed.
            # A line is cut: one line of 150 kB is no "last lines" (the live display cuts
            # each to the terminal's width).
            lines = [line for line in source.split("\n") if line.strip()][-keep:]
            lines = [line[:TAIL_LINE_LIMIT] for line in lines]
        return [_Line(f"    │ {line.rstrip()}", "dim", output=True) for line in lines]

    def _set_doing(self, key: str, doing: str) -> None:
        if key in self._running:
            name, start, _ = self._running[key]
            self._running[key] = (name, start, doing)

    def running(self) -> list[tuple[str, float, str]]:
        """(name, seconds running, current activity) for each stage in flight."""
        now = time.monotonic()
        return [
            (printable(name, one_line=True), now - start, printable(doing, one_line=True))
            for name, start, doing in list(self._running.values())
        ]

    def _print(self, line: _Line) -> None:
        line = _Line(printable(line.text), line.style, line.mark, line.output)
        if self._display is not None:
            self._display.print(line)
            return
        if self.live and not self._asking:
            self._ensure_display()
            assert self._display is not None
            self._display.print(line)
            return
        self.stream.write(line.text + "\n")
        self.stream.flush()

    def _ensure_display(self) -> None:
        if self._display is None and not self._asking:
            self._display = _LiveDisplay(self.stream, self.running)


# The lines the progress display shows for each event; others show nothing.
_DESCRIBE: dict[str, Callable[..., list[_Line]]] = {
    "run.started": ProgressRenderer._on_run_started,
    "stage.started": ProgressRenderer._on_stage_started,
    "stage.completed": ProgressRenderer._on_stage_completed,
    "stage.failed": ProgressRenderer._on_stage_failed,
    "stage.retrying": ProgressRenderer._on_stage_retrying,
    "edge.selected": ProgressRenderer._on_edge_selected,
    "loop.restart": ProgressRenderer._on_loop_restart,
    "run.notice": ProgressRenderer._on_run_notice,
    "run.completed": ProgressRenderer._on_run_completed,
    "run.failed": ProgressRenderer._on_run_failed,
    "run.interrupt": ProgressRenderer._on_run_interrupt,
    "checkpoint.failed": ProgressRenderer._on_checkpoint_failed,
    "metadata.snapshot.failed": ProgressRenderer._on_metadata_snapshot_failed,
    "parallel.started": ProgressRenderer._on_parallel_started,
    "parallel.branch.started": ProgressRenderer._on_parallel_branch_started,
    "parallel.branch.completed": ProgressRenderer._on_parallel_branch_completed,
    "parallel.completed": ProgressRenderer._on_parallel_completed,
    "interview.started": ProgressRenderer._on_interview_started,
    "interview.completed": ProgressRenderer._on_interview_completed,
    "interview.timeout": ProgressRenderer._on_interview_timeout,
    "subgraph.completed": ProgressRenderer._on_subgraph_completed,
    "setup.failed": ProgressRenderer._on_setup_failed,
    "sandbox.failed": ProgressRenderer._on_sandbox_failed,
    "sandbox.cleanup.failed": ProgressRenderer._on_sandbox_failed,
    "agent.mcp.failed": ProgressRenderer._on_sandbox_failed,
    "watchdog.timeout": ProgressRenderer._on_watchdog_timeout,
    "agent.tool.started": ProgressRenderer._on_agent_tool_started,
    "agent.failover": ProgressRenderer._on_agent_failover,
    "agent.error": ProgressRenderer._on_agent_error,
    "agent.warning": ProgressRenderer._on_agent_warning,
}


class _LiveDisplay:
    """The rich side of `ProgressRenderer`; constructed only on a terminal."""

    def __init__(
        self, stream: IO[str], running: Callable[[], list[tuple[str, float, str]]]
    ) -> None:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.spinner import Spinner
        from rich.text import Text

        self._Text = Text
        self._spinners: dict[str, Spinner] = {}
        self.console = Console(
            file=stream,
            force_terminal=True,
            no_color=bool(os.environ.get("NO_COLOR")),
            highlight=False,
            soft_wrap=False,
        )
        display = self

        class _Running:
            def __rich__(self) -> Group:
                rows = []
                for name, secs, doing in running():
                    label = Text.assemble(
                        (name, "bold"),
                        f"  {format_duration(secs * 1000)}",
                        (f"  {doing}" if doing else "", "dim"),
                    )
                    label.truncate(max(10, display.console.width - 2), overflow="ellipsis")
                    spinner = display._spinners.setdefault(name, Spinner("dots", style="cyan"))
                    spinner.update(text=label)
                    rows.append(spinner)
                return Group(*rows)

        self._live = Live(
            _Running(),
            console=self.console,
            refresh_per_second=8,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def print(self, line: _Line) -> None:
        text = self._Text()
        if line.mark:
            text.append(line.mark + " ", style=line.style)
        text.append(line.text, style=line.style if line.mark == "" else "")
        if line.output:
            # A command's output, one screen line a line: a long line wrapped over
            # many would push the run's history off the screen.
            text.truncate(self.console.width, overflow="ellipsis")
            self.console.print(text, no_wrap=True, overflow="ellipsis")
            return
        # Whole, with no newline of ours in it: the terminal wraps it, and a command in
        # it copies as one line. (Only the spinner rows below are cut to the width: a
        # wrapped one would leave stale copies.)
        self.console.print(text, soft_wrap=True)

    def refresh(self) -> None:
        self._live.refresh()

    def stop(self) -> None:
        self._live.stop()
