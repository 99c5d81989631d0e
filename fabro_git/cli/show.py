"""`git fabro show`: what a run's stages did, read back from git (so a clone sees it too).

Every stage leaves `nodes/<node>[-<visit>]/` on the metadata ref: its `status.json` and,
by kind, the prompt and response of an LLM stage or the script and output of a command.
A child workflow's stages sit under their parent's directory (`nodes/<parent>/nodes/…`).
`show RUN` lists the stages in the order they ran; `show RUN NODE[@VISIT]` prints one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabro_git.errors import ConfigError

# What a stage's directory may hold, in the order a person reads it.
SECTIONS = (
    ("prompt.md", "prompt"),
    ("response.md", "response"),
    ("script.sh", "script"),
    ("script.py", "script"),
    ("stdout.log", "stdout"),
    ("stderr.log", "stderr"),
)


@dataclass(frozen=True)
class Stage:
    path: str  # its directory on the meta ref, e.g. nodes/fix-2
    name: str  # node id, with the parent's for a child stage: review/check
    visit: int
    record: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.visit}"


def stages(repo: Any, meta: str, directory: str = "nodes", prefix: str = "") -> list[Stage]:
    """Every stage recorded under `directory`, child workflows' stages included."""
    found: list[Stage] = []
    for entry in repo.list_dir(meta, directory) or []:
        path = f"{directory}/{entry}"
        data = repo.read_file(meta, f"{path}/status.json")
        if data is None:
            continue
        try:
            record = json.loads(data)
        except ValueError:
            continue
        node = str(record.get("node_id") or entry)
        name = prefix + node.rsplit("/", 1)[-1]
        found.append(Stage(path, name, int(record.get("visit") or 1), record))
        found += stages(repo, meta, f"{path}/nodes", prefix=f"{name}/")
    found.sort(key=lambda s: str(s.record.get("started_at") or ""))
    return found


def select(found: list[Stage], wanted: str) -> Stage:
    name, _, visit = wanted.partition("@")
    matching = [s for s in found if s.name == name]
    if visit:
        matching = [s for s in matching if str(s.visit) == visit]
    if not matching:
        known = ", ".join(dict.fromkeys(s.label for s in found)) or "none"
        raise ConfigError(f"no stage {wanted!r} in this run", hint=f"its stages: {known}")
    return matching[-1]


def run(run_id: str, node: str | None, *, raw: bool = False) -> int:
    """Print the run's stages, or one stage. Everything read from the run passes the
    terminal sanitiser, unless `raw` asks for the run's bytes unchanged (for pipes)."""
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.engine.session import load_run
    from fabro_git.events.render import format_duration as format_ms
    from fabro_git.store.repo import GitRepo
    from fabro_git.terminal import printable

    def line(value: Any) -> str:
        return str(value) if raw else printable(str(value), one_line=True)

    def text(value: str) -> str:
        return value if raw else printable(value)

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    with objects_of(full_id):
        manifest, cp, meta, _source = load_run(repo, full_id)
        found = stages(repo, meta)
        out = sys.stdout
        if node is None:
            out.write(f"run       {full_id}  {line(manifest.workflow_name)}  {line(cp.status)}\n")
            if manifest.goal:
                out.write(f"goal      {text(manifest.goal)}\n")
            out.write("\n")
            labels = [line(s.label) for s in found]
            width = max((len(label) for label in labels), default=5)
            for label, stage in zip(labels, found, strict=True):
                record = stage.record
                files = record.get("files_touched") or []
                extra = f"  {len(files)} file{'s' if len(files) != 1 else ''}" if files else ""
                out.write(
                    f"{label:<{width}}  {line(record.get('status', '?')):<19}"
                    f"  {format_ms(record.get('duration_ms')):>7}{extra}\n"
                )
            out.write(f"\none stage in full: git fabro show {full_id[:12]} NODE[@VISIT]\n")
            return 0
        stage = select(found, node)
        record = stage.record
        out.write(f"stage     {line(stage.label)}\n")
        out.write(f"status    {line(record.get('status', '?'))}")
        if record.get("error"):
            out.write(f": {text(str(record['error']))}")
        out.write(f"\nduration  {format_ms(record.get('duration_ms'))}\n")
        files = record.get("files_touched") or []
        out.write(f"files     {', '.join(line(f) for f in files) if files else '-'}\n")
        if record.get("notes"):
            out.write(f"notes     {text(str(record['notes']))}\n")
        _artifacts(repo, meta, full_id, stage, line)
        transcript = _transcript(repo, full_id, stage, raw=raw)
        for file_name, title in SECTIONS:
            if file_name == "response.md" and transcript:
                out.write(transcript)
                transcript = ""
            data = _shown(repo, meta, f"{stage.path}/{file_name}")
            if not data:
                continue
            out.write(f"\n--- {title} ({file_name})\n")
            if not data.endswith(b"\n"):
                data += b"\n"
            if raw:
                out.flush()
                out.buffer.write(data)
                out.buffer.flush()
            else:
                out.write(printable(data.decode("utf-8", "replace")))
        out.write(transcript)
        return 0


# How much of a tool's result the transcript shows unless --raw: its first lines, each
# cut, so one call that read a large file does not bury the rest.
RESULT_LINES = 8
LINE_WIDTH = 160


def _transcript(repo: Any, run_id: str, stage: Stage, *, raw: bool) -> str:
    """What the stage's agent did, from the run's events: each reply, each tool call with
    its arguments and (the start of) its result; a sub-agent's lines are indented under
    its parent's. Empty for a stage with no agent."""
    from fabro_git.cli.logs import recorded_events
    from fabro_git.events.render import SessionDepth
    from fabro_git.terminal import printable

    durable, extra, _ = recorded_events(repo, run_id)
    depth = SessionDepth()
    out: list[str] = []
    calls = 0

    def one_line(value: str) -> str:
        if raw:
            return value
        text = printable(" ".join(value.split()), one_line=True)
        return text if len(text) <= LINE_WIDTH else text[: LINE_WIDTH - 1] + "…"

    for data in (durable, extra):
        for raw_line in data.splitlines():
            try:
                event = json.loads(raw_line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            indent = "    " * depth.of(event)
            if event.get("stage_id") != stage.label:
                continue
            name = event.get("event")
            props = event.get("properties") or {}
            if name == "agent.message" and str(props.get("text") or "").strip():
                out.append(f"{indent}said: {one_line(str(props['text']))}")
            elif name == "agent.tool.started":
                calls += 1
                arguments = props.get("arguments")
                shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
                out.append(
                    f"{indent}> {one_line(str(props.get('tool_name', '?')))} {one_line(shown)}"
                )
            elif name == "agent.tool.completed":
                out += [f"{indent}{row}" for row in _result(props, raw=raw, one_line=one_line)]
            elif name == "agent.sub.spawned":
                out.append(f"{indent}sub-agent: {one_line(str(props.get('task') or ''))}")
            elif name in ("agent.error", "agent.warning"):
                detail = props.get("error") or props.get("message") or ""
                word = name.split(".")[1]
                shown = detail if isinstance(detail, str) else json.dumps(detail)
                out.append(f"{indent}{word}: {one_line(shown)}")
    if not out:
        return ""
    title = (
        f"\n--- transcript ({calls} tool call{'s' if calls != 1 else ''}; from the run's events)\n"
    )
    return title + "".join(f"{row}\n" for row in out)


def _result(props: dict[str, Any], *, raw: bool, one_line: Callable[[str], str]) -> list[str]:
    """A tool's result under its call: whole with --raw, else its first lines, cut."""
    output = props.get("output")
    text = output if isinstance(output, str) else json.dumps(output)
    mark = "  error: " if props.get("is_error") else "  "
    if raw:
        return [f"{mark}{row}" for row in text.split("\n")]
    rows = text.rstrip("\n").split("\n")
    shown = [
        f"{mark if i == 0 else '  '}{one_line(row)}" for i, row in enumerate(rows[:RESULT_LINES])
    ]
    if len(rows) > RESULT_LINES:
        shown.append(f"  [... {len(rows) - RESULT_LINES} more lines; all of it: show --raw]")
    return shown


def _artifacts(repo: Any, meta: str, run_id: str, stage: Stage, line: Callable[[Any], str]) -> None:
    """The stage's offloaded values and captured assets, each with the command that
    copies it out of git; `line` shows a name read from the run."""
    from fabro_git.cli.artifact import collect, human_size

    items = [i for i in collect(repo, meta) if i.stage == stage.label and i.node == stage.name]
    if not items:
        return
    out = sys.stdout
    out.write(f"\n--- offloaded values and assets ({len(items)})\n")
    for item in items:
        attempt = f", attempt {item.retry}" if item.retry is not None else ""
        out.write(f"{item.kind} {line(item.name)} ({human_size(item.size)}{attempt})\n")
        out.write(f"  git fabro artifact cp {run_id[:12]}:{line(item.tree_path)} .\n")
    out.write(
        f"all of them: git fabro artifact cp {run_id[:12]} DEST --node {line(stage.label)} --tree\n"
    )


# A file larger than this is shown as its head and tail: the meta ref keeps a command's
# whole output, which can be hundreds of megabytes.
SHOW_LIMIT = 1_000_000


def _shown(repo: Any, meta: str, path: str) -> bytes | None:
    size = repo.file_size(meta, path)
    if size is None or size <= SHOW_LIMIT:
        return repo.read_file(meta, path) if size else None
    ends = repo.read_file_ends(meta, path, SHOW_LIMIT // 2)
    if ends is None:
        return None
    head, tail = ends
    left = size - len(head) - len(tail)
    note = f"\n[... {left} bytes not shown; the whole file: git show {meta[:12]}:{path}]\n"
    return head + note.encode() + tail
