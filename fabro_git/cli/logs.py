"""`git fabro logs`: a run's events, as the run reader gives them.

The reader (`fabro_git.engine.reader`) gives the meta ref's segments, then what the
live tail in the scratch dir holds beyond them, each event once; `-f` follows the
tail with the reader's one follow loop until the run ends. This module decides what is
printed and how: the JSON lines as recorded, or `--pretty`'s one line per event.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from fabro_git.engine.reader import RunEvent
from fabro_git.jsondata import JsonObject, section

# Events that record how the run was kept, not what it did: `--pretty` shows them only
# with -v. The JSON output always has every event.
BOOKKEEPING = ("metadata.snapshot.", "sandbox.", "git.commit", "git.reset")


class Filter:
    """Which events to print: `--pretty`'s noise rule, `--since` and `-n/--tail`."""

    def __init__(self, *, pretty: bool, verbose: bool, since_ts: str | None) -> None:
        from fabro_git.events.render import SessionDepth

        self.pretty = pretty
        self.verbose = verbose
        self.since_ts = since_ts
        # Learnt from every event read, shown or not, so a sub-agent's lines are indented
        # under its parent's even when the parent's start was filtered out.
        self.sessions = SessionDepth()
        self.fold = DeltaFold()

    def keep(self, event: JsonObject) -> bool:
        self.sessions.of(event)
        if self.pretty and not self.verbose and str(event.get("event", "")).startswith(BOOKKEEPING):
            return False
        return self.since_ts is None or str(event.get("ts", "")) >= self.since_ts


def _select(events: Iterable[RunEvent], keep: Filter) -> Iterator[tuple[str, JsonObject]]:
    """The events to print, each with its line as printed and its envelope, as they come."""
    return ((event.json_text, event.envelope) for event in events if keep.keep(event.envelope))


# Streamed fragments of one reply, one reasoning or one tool's output: `--pretty` folds
# each stretch of them into one line unless -v asks for every fragment.
DELTAS = ("agent.text.delta", "agent.reasoning.delta", "agent.tool.output.delta")


class DeltaFold:
    """Joins the consecutive deltas of one kind from one agent session into one event.

    A stretch ends when its session emits anything else (the message or the tool's
    completion that the deltas lead up to) or the log ends; deltas of parallel branches
    interleave freely, so each session keeps its own stretch."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, str], tuple[JsonObject, list[str]]] = {}

    def feed(self, event: JsonObject) -> list[JsonObject]:
        """The events to print now that `event` was read, folded ones first."""
        name = str(event.get("event", ""))
        session = str(event.get("session_id") or event.get("stage_id") or "")
        node = str(event.get("node_id") or "")
        if name in DELTAS:
            key = (name, session, node)
            props = section(event, "properties")
            if key not in self._open:
                out = self._close(lambda k: k[1] == session and k[2] == node)
                self._open[key] = (event, [])
            else:
                out = []
            self._open[key][1].append(str(props.get("delta", "")))
            return out
        return [*self._close(lambda k: k[1] == session and k[2] == node), event]

    def flush(self) -> list[JsonObject]:
        return self._close(lambda _key: True)

    def _close(self, which: Callable[[tuple[str, str, str]], bool]) -> list[JsonObject]:
        out = []
        for key in [k for k in self._open if which(k)]:
            first, parts = self._open.pop(key)
            props: JsonObject = {"delta": "".join(parts), "fragments": len(parts)}
            out.append({**first, "properties": props})
        return out


def _emit(selected: Iterable[tuple[str, JsonObject]], keep: Filter, *, final: bool = True) -> None:
    """Print `selected` as it comes: a run's backlog is never all in memory at once."""
    from fabro_git.cli import _colour as colour
    from fabro_git.events.render import format_pretty

    out = sys.stdout
    pretty = keep.pretty
    on = pretty and colour.wanted(out)
    if pretty and not keep.verbose:
        selected = _folded(selected, keep, final=final)
    for line, event in selected:
        if pretty:
            text = format_pretty(event, keep.sessions.of(event))
            props = section(event, "properties")
            style = colour.STATUS_STYLE.get(str(props.get("status", "")))
            if str(event.get("event", "")).endswith((".failed", ".timeout")):
                style = "red"
            out.write(colour.paint(text, style, on) + "\n")
        else:
            out.write(line + "\n")
    out.flush()


def _folded(
    selected: Iterable[tuple[str, JsonObject]], keep: Filter, *, final: bool
) -> Iterator[tuple[str, JsonObject]]:
    """`--pretty`'s events with each stretch of deltas folded into one (`DeltaFold`);
    with `final`, the stretches still open at the end too."""
    for _line, event in selected:
        yield from (("", folded) for folded in keep.fold.feed(event))
    if final:
        yield from (("", folded) for folded in keep.fold.flush())


def since_timestamp(value: str | None) -> str | None:
    """`--since 10m` as the RFC 3339 time it names, in the events' own format."""
    if value is None:
        return None
    import time

    from fabro_git.durations import option_seconds
    from fabro_git.events.envelope import format_ts

    return format_ts(int((time.time() - option_seconds(value, "--since")) * 1000))


def run(
    run_id: str,
    *,
    pretty: bool,
    follow: bool,
    verbose: bool = False,
    tail: int | None = None,
    since: str | None = None,
) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.reader import EventCursor
    from fabro_git.store.repo import GitRepo

    keep = Filter(pretty=pretty, verbose=verbose, since_ts=since_timestamp(since))
    if tail is not None and tail < 0:
        from fabro_git.errors import ConfigError

        raise ConfigError(f"-n/--tail expects a number of events, not {tail}")
    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    cursor = EventCursor(repo, full_id)
    selected = _select(cursor.backlog(), keep)
    if tail is not None:
        # Every event is still read and filtered (the filter learns the sessions), and
        # only the last `tail` are held.
        selected = iter(collections.deque(selected, maxlen=tail))
    _emit(selected, keep)
    if not follow:
        return 0
    for batch in cursor.follow():
        _emit(_select(batch, keep), keep, final=False)
    _emit([], keep)  # the folds still open
    return 0
