"""Events for people: one-line summaries for `logs --pretty`, and live run progress.

The JSON events are the record; this module only reads them. `format_pretty` turns any
event into one line with the facts a person scans for (status, duration, the edge taken
and why, errors). `ProgressRenderer` is a sink that shows a run as it happens: on a
terminal, a spinner per running stage with finished stages printed above it; anywhere
else (CI logs, pipes, `NO_COLOR`), plain lines with no escape codes. It writes to stderr
unless told otherwise, because stdout belongs to `--json` results.

rich is imported only when a live display is actually wanted, so importing the events
package stays cheap.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import msgspec

from fabro_git.events.envelope import Envelope
from fabro_git.terminal import printable

# ---------------------------------------------------------------------------- helpers


def format_duration(ms: float | int | None) -> str:
    """`340ms`, `8.0s`, `2m05s`, `1h02m`."""
    if ms is None:
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


def _status(value: Any) -> str:
    return str(value or "?").replace("_", " ")


_SPACES = re.compile(r"[ \t\n]+")


def _short(value: Any, limit: int = 80) -> str:
    """`value` on one line of at most `limit` characters: runs of spaces and newlines
    become one space, and every other control character is shown as its escape."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = printable(_SPACES.sub(" ", text).strip(), one_line=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sha(value: Any) -> str:
    return str(value)[:10] if value else "?"


def _cost(value: Any) -> str:
    return f"${value:.2f}" if isinstance(value, int | float) else ""


def _node_name(event: dict[str, Any]) -> str:
    node_id = event.get("node_id")
    label = event.get("node_label")
    if not node_id:
        return str(label or "")
    if label and label != node_id:
        return f"{label} ({node_id})"
    return str(node_id)


def _join(*parts: str) -> str:
    return "  ".join(p for p in parts if p)


_EDGE_WHY = {
    "preferred_label": "chosen label",
    "suggested_next": "suggested next",
    "retry_target": "retry target",
    "fallback_retry_target": "fallback retry target",
    "goal_gate": "goal gate",
    "jump": "jump",
}


def _edge(p: dict[str, Any]) -> str:
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


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _attempt(p: dict[str, Any]) -> str:
    attempt, most = p.get("attempt"), p.get("max_attempts")
    if attempt is None or (attempt == 1 and most in (None, 1)):
        return ""
    return f"attempt {attempt}/{most}" if most else f"attempt {attempt}"


def _error(p: dict[str, Any]) -> str:
    err = p.get("error")
    if not err:
        return ""
    return f"error: {_short(err, 160)}"


# ---------------------------------------------------------------------------- pretty


def _pretty_facts(name: str, p: dict[str, Any]) -> str:
    match name:
        case "run.created":
            return _join(str(p.get("workflow_slug") or ""), f"dir {p.get('run_dir', '?')}")
        case "run.started":
            base = (
                f"on {p['base_branch']}@{_sha(p.get('base_sha'))}" if p.get("base_branch") else ""
            )
            goal = f"goal: {_short(p['goal'])}" if p.get("goal") else ""
            return _join(str(p.get("name", "")), base, goal)
        case "run.completed":
            return _join(
                str(p.get("status", "?")),
                format_duration(p.get("duration_ms")),
                _cost(p.get("total_cost")),
                f"head {_sha(p['final_git_commit_sha'])}" if p.get("final_git_commit_sha") else "",
            )
        case "run.failed":
            return _join("failed", format_duration(p.get("duration_ms")), _error(p))
        case "run.notice":
            return f"{p.get('level', '?')} {p.get('code', '')}: {_short(p.get('message', ''), 160)}"
        case "stage.started":
            return _join(str(p.get("handler_type", "")), _attempt(p))
        case "stage.completed":
            touched = p.get("files_touched") or []
            return _join(
                str(p.get("status", "?")),
                format_duration(p.get("duration_ms")),
                _attempt(p),
                f"{_plural(len(touched), 'file')} touched" if touched else "",
                _error(p),
            )
        case "stage.failed":
            return _join(_error(p), "will retry" if p.get("will_retry") else "no retry")
        case "stage.retrying":
            return _join(_attempt(p), f"in {format_duration(p.get('delay_ms'))}")
        case "edge.selected" | "loop.restart":
            return _edge(p)
        case "checkpoint.completed":
            return _join(str(p.get("status", "")), _sha(p.get("git_commit_sha")))
        case "metadata.snapshot.started":
            return _join(str(p.get("phase", "")), str(p.get("branch", "")))
        case "metadata.snapshot.completed":
            return _join(
                str(p.get("phase", "")),
                format_duration(p.get("duration_ms")),
                f"{p.get('entry_count', '?')} entries",
                _sha(p.get("commit_sha")),
            )
        case "metadata.snapshot.failed":
            return _join(str(p.get("phase", "")), str(p.get("failure_kind", "")), _error(p))
        case "git.commit" | "git.reset":
            return _sha(p.get("sha"))
        case "git.push" | "git.fetch":
            return _join(str(p.get("branch", "")), "ok" if p.get("success") else "FAILED")
        case "parallel.started":
            return f"{p.get('branch_count', '?')} branches"
        case "parallel.branch.completed":
            return _join(str(p.get("status", "?")), format_duration(p.get("duration_ms")))
        case "parallel.completed":
            return _join(
                f"{p.get('success_count', 0)} succeeded, {p.get('failure_count', 0)} failed",
                format_duration(p.get("duration_ms")),
            )
        case "interview.started":
            return f"{_short(p.get('question', ''))} ({p.get('question_type', '')})"
        case "interview.completed":
            return _join(
                f"answer: {_short(p.get('answer', ''))}", format_duration(p.get("duration_ms"))
            )
        case "interview.timeout":
            return f"timed out after {format_duration(p.get('duration_ms'))}"
        case "subgraph.completed":
            return _join(
                str(p.get("status", "?")),
                f"{p.get('steps_executed', '?')} steps",
                format_duration(p.get("duration_ms")),
            )
        case "setup.command.completed":
            return _join(
                f"#{p.get('index')} exit {p.get('exit_code')}",
                format_duration(p.get("duration_ms")),
                _short(p.get("command", ""), 60),
            )
        case "setup.failed":
            return _join(
                f"#{p.get('index')} exit {p.get('exit_code')}",
                _short(p.get("command", ""), 60),
                _short(p.get("stderr", ""), 100),
            )
        case "agent.text.delta" | "agent.reasoning.delta" | "agent.tool.output.delta":
            # `logs --pretty` folds a stretch of fragments into one (cli/logs.py).
            count = p.get("fragments")
            text = _short(p.get("delta", ""), 160)
            return f"{_plural(int(count), 'fragment')}: {text}" if count else text
        case "watchdog.timeout":
            idle = p.get("idle_seconds")
            return f"idle {format_duration(idle * 1000 if isinstance(idle, int | float) else None)}"
    return _generic(p)


def _generic(p: dict[str, Any]) -> str:
    parts = []
    for key, value in p.items():
        if key == "error" and isinstance(value, str):
            parts.append(_error(p))
        elif key.endswith("duration_ms"):
            parts.append(f"{key.removesuffix('_ms')}={format_duration(value)}")
        elif isinstance(value, str | int | float | bool):
            parts.append(f"{key}={_short(value, 60)}")
    return " ".join(parts)


class SessionDepth:
    """How deep in a stage's sub-agent tree each event's agent session is, learnt from
    the events read so far: a session whose event names a parent is one below it."""

    def __init__(self) -> None:
        self._depth: dict[str, int] = {}

    def of(self, env: dict[str, Any]) -> int:
        session, parent = env.get("session_id"), env.get("parent_session_id")
        if not isinstance(session, str):
            return 0
        if session not in self._depth:
            above = self._depth.get(parent, 0) if isinstance(parent, str) else -1
            self._depth[session] = above + 1
        return self._depth[session]


def format_pretty(env: dict[str, Any], depth: int = 0) -> str:
    """One line for a person: `HH:MM:SS.mmm  event  node  facts` (time is UTC). A
    sub-agent's event (`depth` below the stage's own agent) is indented under it."""
    ts = str(env.get("ts", ""))
    clock = ts[11:23] if len(ts) >= 23 else ts
    event = str(env.get("event", "?"))
    name = "  " * max(0, depth) + printable(event, one_line=True)
    props = env.get("properties")
    facts = _pretty_facts(event, props if isinstance(props, dict) else {})
    node = printable(_node_name(env), one_line=True)
    # Fixed columns, so a screenful reads down: the node column is as wide as most
    # `Label (id)` names; a longer one pushes only its own line's facts along.
    return printable(
        f"{printable(clock, one_line=True)}  {name:<26}  {node:<24}  {facts}".rstrip(),
        one_line=True,
    )


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
        self._stages_done = 0
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
        self._print(_Line(f"    {who}│ {line.rstrip()}", "dim"))
        if self._display is not None:
            self._display.refresh()

    def close(self) -> None:
        if self._display is not None:
            self._display.stop()
            self._display = None

    # -----------------------------------------------------------------------------
    def handle_dict(self, event: dict[str, Any]) -> None:
        """Render one decoded event (what `logs -f` reads back from the tail)."""
        name = str(event.get("event", ""))
        props = event.get("properties") or {}
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

    def _describe(
        self, name: str, event: dict[str, Any], p: dict[str, Any], key: str
    ) -> list[_Line]:
        node = _node_name(event)
        match name:
            case "run.started":
                goal = f" - {_short(p['goal'], 100)}" if p.get("goal") else ""
                return [
                    _Line(
                        f"Running {p.get('name', 'workflow')} (run {event.get('run_id')}){goal}",
                        "bold",
                    )
                ]
            case "stage.started":
                if p.get("handler_type") in ("start", "exit"):
                    self._bookends.add(key)
                    return []  # every run has them; they do nothing worth a line
                self._running[key] = (node, time.monotonic(), "")
                if self.live:
                    self._ensure_display()
                    return []
                extra = ", ".join(x for x in (str(p.get("handler_type", "")), _attempt(p)) if x)
                return [_Line(f"{node}: started ({extra})" if extra else f"{node}: started", "dim")]
            case "stage.completed":
                self._running.pop(key, None)
                self._stages_done += 1
                if key in self._bookends and p.get("status") == "succeeded":
                    return []
                status = str(p.get("status", "?"))
                mark, style = _MARK.get(status, ("•", ""))
                text = f"{node}: {_status(status)} in {format_duration(p.get('duration_ms'))}"
                if p.get("attempt", 1) != 1:
                    text += f" ({_attempt(p)})"
                if p.get("error"):
                    text += f": {_short(p['error'], 200)}"
                    self._errors_shown.add(str(p["error"]))
                if self.output == "all" and key in self._streamed:
                    self._streamed.discard(key)
                    return [_Line(text, style, mark)]  # its output is on screen already
                return [_Line(text, style, mark), *self._output_tail(p, failed=status == "failed")]
            case "stage.failed":
                if not p.get("will_retry"):
                    return []  # its stage.completed line says it, once
                err = _short(p.get("error", ""), 160)
                return [_Line(f"{node}: attempt failed: {err}", "yellow", "✗")]
            case "stage.retrying":
                return [
                    _Line(
                        f"{node}: retrying ({_attempt(p)}) in {format_duration(p.get('delay_ms'))}",
                        "yellow",
                        "↻",
                    )
                ]
            case "edge.selected":
                if not p.get("label") and p.get("reason") == "unconditional":
                    return []  # the only way on: the next stage's line says where it went
                return [_Line(f"  {_edge(p)}", "cyan", "")]
            case "loop.restart":
                return [
                    _Line(
                        f"  loop: restarting at {p.get('to_node')} (from {p.get('from_node')})",
                        "yellow",
                    )
                ]
            case "run.notice":
                level = str(p.get("level", "info"))
                word = {"warn": "warning", "error": "error"}.get(level, "note")
                style = {"warn": "yellow", "error": "red"}.get(level, "dim")
                return [_Line(f"{word}: {p.get('message', '')} [{p.get('code', '')}]", style)]
            case "run.completed":
                status = str(p.get("status", "?"))
                mark, style = _MARK.get(status, ("•", ""))
                extras = [_plural(self._stages_done, "stage")]
                if p.get("total_cost") is not None:
                    extras.append(_cost(p["total_cost"]))
                text = (
                    f"Run {_status(status)} in {format_duration(p.get('duration_ms'))}"
                    f" ({', '.join(extras)})"
                )
                return [_Line(text, f"bold {style}".strip(), mark)]
            case "run.failed":
                text = f"Run failed after {format_duration(p.get('duration_ms'))}"
                error = str(p.get("error") or "")
                for shown in self._errors_shown:  # said on the stage's own line already
                    error = error.replace(shown, "").strip().rstrip(":").strip()
                if error:
                    text += f": {_short(error, 200)}"
                return [_Line(text, "bold red", "✗")]
            case "run.interrupt":
                return [_Line("interrupt requested; stopping after a checkpoint", "yellow")]
            case "checkpoint.failed":
                return [
                    _Line(
                        f"error: checkpoint of {node or 'run'} failed: {_short(p.get('error', ''), 200)}",
                        "red",
                    )
                ]
            case "metadata.snapshot.failed":
                return [
                    _Line(
                        f"warning: metadata snapshot ({p.get('phase')}) failed: {_short(p.get('error', ''), 200)}",
                        "yellow",
                    )
                ]
            case "parallel.started":
                return [
                    _Line(
                        f"{node or 'parallel'}: {p.get('branch_count', '?')} branches started",
                        "dim",
                    )
                ]
            case "parallel.branch.started":
                self._running[key] = (node, time.monotonic(), "branch")
                if self.live:
                    self._ensure_display()
                return []
            case "parallel.branch.completed":
                self._running.pop(key, None)
                status = str(p.get("status", "?"))
                mark, style = _MARK.get(status, ("•", ""))
                return [
                    _Line(
                        f"  branch {node}: {_status(status)} in {format_duration(p.get('duration_ms'))}",
                        style,
                        mark,
                    )
                ]
            case "parallel.completed":
                return [
                    _Line(
                        f"parallel: {p.get('success_count', 0)} succeeded, {p.get('failure_count', 0)} failed in {format_duration(p.get('duration_ms'))}"
                    )
                ]
            case "interview.started":
                question = str(p.get("question", ""))
                if question == event.get("node_label"):
                    return []  # the stage's own line already reads as the question
                return [_Line(f"{node}: {_short(question, 200)}", "bold")]
            case "interview.completed":
                answer = _short(p.get("answer", ""), 100)
                return [_Line(f"{node}: answered '{answer}'", "dim")]
            case "interview.timeout":
                return [
                    _Line(
                        f"{node}: question timed out after {format_duration(p.get('duration_ms'))}",
                        "yellow",
                    )
                ]
            case "subgraph.completed":
                return [
                    _Line(
                        f"{node}: subgraph {_status(p.get('status'))} after {_plural(int(p.get('steps_executed') or 0), 'step')} in {format_duration(p.get('duration_ms'))}",
                        "dim",
                    )
                ]
            case "setup.failed":
                return [
                    _Line(
                        f"setup command failed (exit {p.get('exit_code')}): {_short(p.get('command', ''), 100)}: {_short(p.get('stderr', ''), 200)}",
                        "red",
                    )
                ]
            case "sandbox.failed" | "sandbox.cleanup.failed" | "agent.mcp.failed":
                return [_Line(f"warning: {name}: {_short(p.get('error', ''), 200)}", "yellow")]
            case "watchdog.timeout":
                return [
                    _Line(
                        f"warning: {node or 'run'} idle for {format_duration((p.get('idle_seconds') or 0) * 1000)}",
                        "yellow",
                    )
                ]
            case "agent.tool.started":
                self._set_doing(
                    key, f"{p.get('tool_name', 'tool')} {_short(p.get('arguments', ''), 40)}"
                )
                return []
            case "agent.failover":
                return [
                    _Line(
                        f"{node}: failing over {p.get('from_model')} -> {p.get('to_model')}: {_short(p.get('error', ''), 120)}",
                        "yellow",
                    )
                ]
            case "agent.error":
                who = "sub-agent" if event.get("parent_session_id") else "agent"
                return [_Line(f"{node}: {who} error: {_short(p.get('error', ''), 200)}", "red")]
            case "agent.warning":
                who = "sub-agent" if event.get("parent_session_id") else "agent"
                return [
                    _Line(f"{node}: {who} warning: {_short(p.get('message', ''), 200)}", "yellow")
                ]
        return []

    def _output_tail(self, p: dict[str, Any], *, failed: bool) -> list[_Line]:
        """The end of a command stage's output, dimmed under its line."""
        if self.output == "none":
            return []
        from fabro_git.outputs.artifacts import resolved

        updates = p.get("context_updates") or {}
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
        return [_Line(f"    │ {line.rstrip()}", "dim") for line in lines]

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
        line = _Line(printable(line.text), line.style, line.mark)
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
        # One screen line each: a long line wrapped over many would push the run's
        # history off the screen (and a wrapped spinner row leaves stale copies).
        text.truncate(self.console.width, overflow="ellipsis")
        self.console.print(text, no_wrap=True, overflow="ellipsis")

    def refresh(self) -> None:
        self._live.refresh()

    def stop(self) -> None:
        self._live.stop()
