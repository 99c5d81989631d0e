"""`logs --pretty`: any event as one line with the facts a person scans for (status,
duration, the edge taken and why, errors); the JSON events stay the record."""

from __future__ import annotations

from collections.abc import Callable

from fabro_git.events.phrases import (
    attempt_text,
    cost_text,
    edge_text,
    error_text,
    format_duration,
    joined,
    node_name,
    plural,
    short_sha,
    shorten,
)
from fabro_git.jsondata import JsonObject
from fabro_git.terminal import printable


def _facts_run_created(p: JsonObject) -> str:
    return joined(str(p.get("workflow_slug") or ""), f"dir {p.get('run_dir', '?')}")


def _facts_run_started(p: JsonObject) -> str:
    base = f"on {p['base_branch']}@{short_sha(p.get('base_sha'))}" if p.get("base_branch") else ""
    goal = f"goal: {shorten(p['goal'])}" if p.get("goal") else ""
    return joined(str(p.get("name", "")), base, goal)


def _facts_run_completed(p: JsonObject) -> str:
    return joined(
        str(p.get("status", "?")),
        format_duration(p.get("duration_ms")),
        cost_text(p.get("total_cost")),
        f"head {short_sha(p['final_git_commit_sha'])}" if p.get("final_git_commit_sha") else "",
    )


def _facts_run_failed(p: JsonObject) -> str:
    return joined("failed", format_duration(p.get("duration_ms")), error_text(p))


def _facts_run_notice(p: JsonObject) -> str:
    return f"{p.get('level', '?')} {p.get('code', '')}: {shorten(p.get('message', ''), 160)}"


def _facts_stage_started(p: JsonObject) -> str:
    return joined(str(p.get("handler_type", "")), attempt_text(p))


def _facts_stage_completed(p: JsonObject) -> str:
    touched = p.get("files_touched")
    touched = touched if isinstance(touched, list) else []
    return joined(
        str(p.get("status", "?")),
        format_duration(p.get("duration_ms")),
        attempt_text(p),
        f"{plural(len(touched), 'file')} touched" if touched else "",
        error_text(p),
    )


def _facts_stage_failed(p: JsonObject) -> str:
    return joined(error_text(p), "will retry" if p.get("will_retry") else "no retry")


def _facts_stage_retrying(p: JsonObject) -> str:
    return joined(attempt_text(p), f"in {format_duration(p.get('delay_ms'))}")


def _facts_edge_selected(p: JsonObject) -> str:
    return edge_text(p)


def _facts_checkpoint_completed(p: JsonObject) -> str:
    return joined(str(p.get("status", "")), short_sha(p.get("git_commit_sha")))


def _facts_metadata_snapshot_started(p: JsonObject) -> str:
    return joined(str(p.get("phase", "")), str(p.get("branch", "")))


def _facts_metadata_snapshot_completed(p: JsonObject) -> str:
    return joined(
        str(p.get("phase", "")),
        format_duration(p.get("duration_ms")),
        f"{p.get('entry_count', '?')} entries",
        short_sha(p.get("commit_sha")),
    )


def _facts_metadata_snapshot_failed(p: JsonObject) -> str:
    return joined(str(p.get("phase", "")), str(p.get("failure_kind", "")), error_text(p))


def _facts_git_commit(p: JsonObject) -> str:
    return short_sha(p.get("sha"))


def _facts_git_push(p: JsonObject) -> str:
    return joined(str(p.get("branch", "")), "ok" if p.get("success") else "FAILED")


def _facts_parallel_started(p: JsonObject) -> str:
    return f"{p.get('branch_count', '?')} branches"


def _facts_parallel_branch_completed(p: JsonObject) -> str:
    return joined(str(p.get("status", "?")), format_duration(p.get("duration_ms")))


def _facts_parallel_completed(p: JsonObject) -> str:
    return joined(
        f"{p.get('success_count', 0)} succeeded, {p.get('failure_count', 0)} failed",
        format_duration(p.get("duration_ms")),
    )


def _facts_interview_started(p: JsonObject) -> str:
    return f"{shorten(p.get('question', ''))} ({p.get('question_type', '')})"


def _facts_interview_completed(p: JsonObject) -> str:
    return joined(f"answer: {shorten(p.get('answer', ''))}", format_duration(p.get("duration_ms")))


def _facts_interview_timeout(p: JsonObject) -> str:
    return f"timed out after {format_duration(p.get('duration_ms'))}"


def _facts_subgraph_completed(p: JsonObject) -> str:
    return joined(
        str(p.get("status", "?")),
        f"{p.get('steps_executed', '?')} steps",
        format_duration(p.get("duration_ms")),
    )


def _facts_setup_command_completed(p: JsonObject) -> str:
    return joined(
        f"#{p.get('index')} exit {p.get('exit_code')}",
        format_duration(p.get("duration_ms")),
        shorten(p.get("command", ""), 60),
    )


def _facts_setup_failed(p: JsonObject) -> str:
    return joined(
        f"#{p.get('index')} exit {p.get('exit_code')}",
        shorten(p.get("command", ""), 60),
        shorten(p.get("stderr", ""), 100),
    )


def _facts_agent_text_delta(p: JsonObject) -> str:
    count = p.get("fragments")
    text = shorten(p.get("delta", ""), 160)
    return f"{plural(int(count), 'fragment')}: {text}" if isinstance(count, int) and count else text


def _facts_watchdog_timeout(p: JsonObject) -> str:
    idle = p.get("idle_seconds")
    return f"idle {format_duration(idle * 1000 if isinstance(idle, int | float) else None)}"


# What `logs --pretty` says of each event after its name; others get `_generic`.
_FACTS: dict[str, Callable[[JsonObject], str]] = {
    "run.created": _facts_run_created,
    "run.started": _facts_run_started,
    "run.completed": _facts_run_completed,
    "run.failed": _facts_run_failed,
    "run.notice": _facts_run_notice,
    "stage.started": _facts_stage_started,
    "stage.completed": _facts_stage_completed,
    "stage.failed": _facts_stage_failed,
    "stage.retrying": _facts_stage_retrying,
    "edge.selected": _facts_edge_selected,
    "loop.restart": _facts_edge_selected,
    "checkpoint.completed": _facts_checkpoint_completed,
    "metadata.snapshot.started": _facts_metadata_snapshot_started,
    "metadata.snapshot.completed": _facts_metadata_snapshot_completed,
    "metadata.snapshot.failed": _facts_metadata_snapshot_failed,
    "git.commit": _facts_git_commit,
    "git.reset": _facts_git_commit,
    "git.push": _facts_git_push,
    "git.fetch": _facts_git_push,
    "parallel.started": _facts_parallel_started,
    "parallel.branch.completed": _facts_parallel_branch_completed,
    "parallel.completed": _facts_parallel_completed,
    "interview.started": _facts_interview_started,
    "interview.completed": _facts_interview_completed,
    "interview.timeout": _facts_interview_timeout,
    "subgraph.completed": _facts_subgraph_completed,
    "setup.command.completed": _facts_setup_command_completed,
    "setup.failed": _facts_setup_failed,
    "agent.text.delta": _facts_agent_text_delta,
    "agent.reasoning.delta": _facts_agent_text_delta,
    "agent.tool.output.delta": _facts_agent_text_delta,
    "watchdog.timeout": _facts_watchdog_timeout,
}


def _pretty_facts(name: str, p: JsonObject) -> str:
    facts = _FACTS.get(name)
    return facts(p) if facts is not None else _generic(p)


def _generic(p: JsonObject) -> str:
    parts = []
    for key, value in p.items():
        if key == "error" and isinstance(value, str):
            parts.append(error_text(p))
        elif key.endswith("duration_ms"):
            parts.append(f"{key.removesuffix('_ms')}={format_duration(value)}")
        elif isinstance(value, str | int | float | bool):
            parts.append(f"{key}={shorten(value, 60)}")
    return " ".join(parts)


class SessionDepth:
    """How deep in a stage's sub-agent tree each event's agent session is, learnt from
    the events read so far: a session whose event names a parent is one below it."""

    def __init__(self) -> None:
        self._depth: dict[str, int] = {}

    def of(self, env: JsonObject) -> int:
        session, parent = env.get("session_id"), env.get("parent_session_id")
        if not isinstance(session, str):
            return 0
        if session not in self._depth:
            above = self._depth.get(parent, 0) if isinstance(parent, str) else -1
            self._depth[session] = above + 1
        return self._depth[session]


def format_pretty(env: JsonObject, depth: int = 0) -> str:
    """One line for a person: `HH:MM:SS.mmm  event  node  facts` (time is UTC). A
    sub-agent's event (`depth` below the stage's own agent) is indented under it."""
    ts = str(env.get("ts", ""))
    clock = ts[11:23] if len(ts) >= 23 else ts
    event = str(env.get("event", "?"))
    name = "  " * max(0, depth) + printable(event, one_line=True)
    props = env.get("properties")
    facts = _pretty_facts(event, props if isinstance(props, dict) else {})
    node = printable(node_name(env), one_line=True)
    # Fixed columns, so a screenful reads down: the node column is as wide as most
    # `Label (id)` names; a longer one pushes only its own line's facts along.
    return printable(
        f"{printable(clock, one_line=True)}  {name:<26}  {node:<24}  {facts}".rstrip(),
        one_line=True,
    )
