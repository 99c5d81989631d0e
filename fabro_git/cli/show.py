"""`git fabro show`: what a run's stages did, read back from git (so a clone sees it too).

Every stage leaves `nodes/<node>[-<visit>]/` on the metadata ref: its `status.json` and,
by kind, the prompt and response of an LLM stage or the script and output of a command.
A child workflow's stages sit under their parent's directory (`nodes/<parent>/nodes/…`).
`show RUN` lists the stages in the order they ran; `show RUN NODE[@VISIT]` prints one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from fabro_git.engine.reader import STAGE_FILES as SECTIONS
from fabro_git.engine.reader import RunReader, Stage, TranscriptEntry


def run(run_id: str, node: str | None, *, raw: bool = False) -> int:
    """Print the run's stages, or one stage. Everything read from the run passes the
    terminal sanitiser, unless `raw` asks for the run's bytes unchanged (for pipes)."""
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.engine.reader import open_run
    from fabro_git.store.repo import GitRepo
    from fabro_git.terminal import printable

    def line(value: object) -> str:
        return str(value) if raw else printable(str(value), one_line=True)

    def text(value: str) -> str:
        return value if raw else printable(value)

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    with objects_of(full_id):
        reader = open_run(repo, full_id)
        if node is None:
            _stage_list(reader, line, text)
        else:
            _one_stage(reader, reader.stage(node), line, text, raw=raw)
        return 0


def _stage_list(
    reader: RunReader, line: Callable[[object], str], text: Callable[[str], str]
) -> None:
    """The run's head and its stages in the order they ran, one line each."""
    from fabro_git.events.render import format_duration as format_ms

    manifest, checkpoint, full_id = reader.manifest, reader.checkpoint, reader.run_id
    found = reader.stages()
    out = sys.stdout
    out.write(f"run       {full_id}  {line(manifest.workflow_name)}  {line(checkpoint.status)}\n")
    if manifest.goal:
        out.write(f"goal      {text(manifest.goal)}\n")
    out.write("\n")
    labels = [line(s.label) for s in found]
    width = max((len(label) for label in labels), default=5)
    for label, stage in zip(labels, found, strict=True):
        files = stage.files_touched
        extra = f"  {len(files)} file{'s' if len(files) != 1 else ''}" if files else ""
        out.write(
            f"{label:<{width}}  {line(stage.record.get('status', '?')):<19}"
            f"  {format_ms(stage.duration_ms):>7}{extra}\n"
        )
    out.write(f"\none stage in full: git fabro show {full_id[:12]} NODE[@VISIT]\n")


def _one_stage(
    reader: RunReader,
    stage: Stage,
    line: Callable[[object], str],
    text: Callable[[str], str],
    *,
    raw: bool,
) -> None:
    """What one stage did: its record, artifacts, files and the agent's transcript."""
    from fabro_git.events.render import format_duration as format_ms
    from fabro_git.terminal import printable

    record = stage.record
    # Read first: a run whose events cannot be read is refused before anything is printed.
    transcript = _transcript(reader.transcript(stage), raw=raw)
    out = sys.stdout
    out.write(f"stage     {line(stage.label)}\n")
    out.write(f"status    {line(record.get('status', '?'))}")
    if record.get("error"):
        out.write(f": {text(str(record['error']))}")
    out.write(f"\nduration  {format_ms(stage.duration_ms)}\n")
    files = stage.files_touched
    out.write(f"files     {', '.join(line(f) for f in files) if files else '-'}\n")
    if record.get("notes"):
        out.write(f"notes     {text(str(record['notes']))}\n")
    _artifacts(reader, stage, line)
    for file_name, title in SECTIONS:
        if file_name == "response.md" and transcript:
            out.write(transcript)
            transcript = ""
        data = reader.stage_file(stage, file_name)
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


# How much of a tool's result the transcript shows unless --raw: its first lines, each
# cut, so one call that read a large file does not bury the rest.
RESULT_LINES = 8
LINE_WIDTH = 160


def _transcript(entries: list[TranscriptEntry], *, raw: bool) -> str:
    """What the stage's agent did: each reply, each tool call with its arguments and
    (the start of) its result; a sub-agent's lines are indented under its parent's.
    Empty for a stage with no agent."""
    from fabro_git.terminal import printable

    def one_line(value: str) -> str:
        if raw:
            return value
        text = printable(" ".join(value.split()), one_line=True)
        return text if len(text) <= LINE_WIDTH else text[: LINE_WIDTH - 1] + "…"

    out: list[str] = []
    calls = 0
    for entry in entries:
        indent = "    " * entry.depth
        if entry.kind == "said":
            out.append(f"{indent}said: {one_line(entry.text)}")
        elif entry.kind == "tool":
            calls += 1
            out.append(f"{indent}> {one_line(entry.tool_name)} {one_line(entry.arguments)}")
        elif entry.kind == "result":
            out += [f"{indent}{row}" for row in _result(entry, raw=raw, one_line=one_line)]
        elif entry.kind == "sub-agent":
            out.append(f"{indent}sub-agent: {one_line(entry.text)}")
        else:
            out.append(f"{indent}{entry.kind}: {one_line(entry.text)}")
    if not out:
        return ""
    title = (
        f"\n--- transcript ({calls} tool call{'s' if calls != 1 else ''}; from the run's events)\n"
    )
    return title + "".join(f"{row}\n" for row in out)


def _result(entry: TranscriptEntry, *, raw: bool, one_line: Callable[[str], str]) -> list[str]:
    """A tool's result under its call: whole with --raw, else its first lines, cut."""
    text = entry.text
    mark = "  error: " if entry.is_error else "  "
    if raw:
        return [f"{mark}{row}" for row in text.split("\n")]
    rows = text.rstrip("\n").split("\n")
    shown = [
        f"{mark if i == 0 else '  '}{one_line(row)}" for i, row in enumerate(rows[:RESULT_LINES])
    ]
    if len(rows) > RESULT_LINES:
        shown.append(f"  [... {len(rows) - RESULT_LINES} more lines; all of it: show --raw]")
    return shown


def _artifacts(reader: RunReader, stage: Stage, line: Callable[[object], str]) -> None:
    """The stage's offloaded values and captured assets, each with the command that
    copies it out of git; `line` shows a name read from the run."""
    from fabro_git.cli.artifact import human_size
    from fabro_git.engine.reader import stage_artifacts

    items = stage_artifacts(reader.artifacts(), stage)
    if not items:
        return
    run_id = reader.run_id
    out = sys.stdout
    out.write(f"\n--- offloaded values and assets ({len(items)})\n")
    for item in items:
        attempt = f", attempt {item.retry}" if item.retry is not None else ""
        out.write(f"{item.kind} {line(item.name)} ({human_size(item.size)}{attempt})\n")
        out.write(f"  git fabro artifact cp {run_id[:12]}:{line(item.tree_path)} .\n")
    out.write(
        f"all of them: git fabro artifact cp {run_id[:12]} DEST --node {line(stage.label)} --tree\n"
    )
