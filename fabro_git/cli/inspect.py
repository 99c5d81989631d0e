"""`git fabro inspect`: a run's manifest, checkpoint and status, straight from its meta ref."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from fabro_git.jsondata import JsonObject, JsonValue, section, texts

if TYPE_CHECKING:
    from fabro_git.engine.checkpoint import TokenTotals
    from fabro_git.engine.reader import RunReader
    from fabro_git.store.repo import GitRepo


def run(run_id: str, *, json_output: bool) -> int:
    from fabro_git.cli._runs import effective_status, resolve_run
    from fabro_git.config.locations import run_scratch_dir
    from fabro_git.engine.reader import open_run
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    reader = open_run(repo, full_id)
    manifest, cp, meta = reader.manifest, reader.checkpoint, reader.meta_sha
    live = reader.live
    status = effective_status(cp.status, live, superseded=bool(manifest.superseded_by))
    run_tip = reader.run_tip
    if run_tip is not None:
        _warn_if_missing(repo, full_id, run_tip)
    scratch = run_scratch_dir(Path(repo.git_dir), full_id)
    doc = {
        "run_id": full_id,
        "status": status,
        "live": live,
        "meta_ref": runrefs.meta_ref(full_id),
        "meta_sha": meta,
        "run_branch": manifest.run_branch,
        "run_branch_sha": run_tip,
        "scratch_dir": str(scratch) if scratch.exists() else None,
        "manifest": msgspec.to_builtins(manifest),
        "usage": {
            "input_tokens": cp.tokens.input_tokens,
            "output_tokens": cp.tokens.output_tokens,
            "total_tokens": cp.tokens.total_tokens,
            "reasoning_tokens": cp.tokens.reasoning_tokens,
            "cache_read_tokens": cp.tokens.cache_read_tokens,
            "cache_write_tokens": cp.tokens.cache_write_tokens,
        },
        "total_cost": round(cp.total_cost, 6) if cp.total_cost else None,
        "checkpoint": msgspec.to_builtins(cp),
    }
    if json_output:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    sys.stdout.write(_described(reader, status, run_tip) + "\n")
    return 0


def _warn_if_missing(repo: GitRepo, run_id: str, run_tip: str) -> None:
    """Warns when the run branch's tip commit is missing from this repository."""
    from fabro_git.engine.session import missing_object_error
    from fabro_git.errors import MissingObject
    from fabro_git.store import runs as runrefs

    try:
        repo.commit_info(run_tip)
    except MissingObject as exc:
        problem = missing_object_error(run_id, runrefs.run_branch_ref(run_id), run_tip, exc)
        print(f"warning: {problem.message}\nhint: {problem.hint}", file=sys.stderr)


def _described(reader: RunReader, status: str, run_tip: str | None) -> str:
    """The run for people, a line a field."""
    from fabro_git.cli import _colour as colour
    from fabro_git.cli._runs import format_ms
    from fabro_git.events.render import format_cost
    from fabro_git.store import runs as runrefs
    from fabro_git.terminal import printable

    full_id, manifest, cp, meta = reader.run_id, reader.manifest, reader.checkpoint, reader.meta_sha

    on = colour.wanted(sys.stdout)
    # Each line is run data (a fetched manifest's fields, a stage's error): each is shown
    # on its own line through the one sanitiser, before the status is coloured.
    lines = [
        f"run        {full_id}",
        f"workflow   {manifest.workflow_name} ({manifest.workflow_path or manifest.workflow_slug})",
        f"goal       {manifest.goal or '-'}",
        f"base       {manifest.base_branch or '-'} @ {manifest.base_sha[:12]}",
        f"branch     {manifest.run_branch or '(in place)'}"
        + (f" @ {run_tip[:12]}" if run_tip else ""),
        f"meta       {runrefs.meta_ref(full_id)} @ {meta[:12]}",
        f"started    {cp.started_at}",
        f"active     {format_ms(cp.active_ms)}",
        *([f"cost       {format_cost(cp.total_cost)}"] if cp.total_cost else []),
        *([_tokens_line(cp.tokens)] if cp.tokens.total_tokens else []),
        f"last node  {cp.current_node or '-'}",
        f"next node  {cp.next_node_id or '-'}",
        f"completed  {len(cp.completed_nodes)} stage{'' if len(cp.completed_nodes) == 1 else 's'}: {' -> '.join(cp.completed_nodes) or '-'}",
    ]
    if manifest.forked_from:
        origin = manifest.forked_from
        where = f"{origin.get('node')}@{origin.get('visit')}"
        lines.append(f"forked     from {origin.get('run_id')} at {where}")
    if manifest.superseded_by:
        lines.append(f"superseded by {manifest.superseded_by} (git fabro rewind)")
    if cp.node_visits:
        lines.append("visits     " + ", ".join(f"{k}={v}" for k, v in cp.node_visits.items()))
    if manifest.labels:
        lines.append("labels     " + ", ".join(f"{k}={v}" for k, v in manifest.labels.items()))
    lines = [printable(line, one_line=True) for line in lines]
    error = f": {printable(cp.error, one_line=True)}" if cp.error else ""
    lines.insert(2, f"status     {colour.status(printable(status, one_line=True), on)}{error}")
    return "\n".join(lines)


def _tokens_line(tokens: TokenTotals) -> str:
    line = (
        f"tokens     {tokens.input_tokens:,} in / {tokens.output_tokens:,} out "
        f"({tokens.total_tokens:,} total)"
    )
    extra = [
        f"{count:,} {name}"
        for count, name in (
            (tokens.reasoning_tokens, "reasoning"),
            (tokens.cache_read_tokens, "cache read"),
            (tokens.cache_write_tokens, "cache write"),
        )
        if count
    ]
    return line + (f"; {', '.join(extra)}" if extra else "")


def show_retro(run_id: str, *, json_output: bool) -> int:
    """`inspect --retro`: the retro the run's end wrote to its meta ref."""
    from fabro_git.cli._runs import effective_status, resolve_run
    from fabro_git.engine.reader import open_run
    from fabro_git.errors import FabroError
    from fabro_git.outputs import retro
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    reader = open_run(repo, full_id)
    manifest, cp, meta = reader.manifest, reader.checkpoint, reader.meta_sha
    data = reader.read_file(runrefs.RETRO)
    if data is None:
        status = effective_status(cp.status, reader.live)
        if not manifest.options.retro:
            why = "it ran with --no-retro"
        elif status == "running":
            why = "it is still running; its retro is written when it ends"
        else:
            why = "it was recorded without one"
        raise FabroError(
            f"run {full_id} has no retro: {why}",
            hint=f"see its stages with `git fabro show {full_id[:12]}`",
        )
    try:
        document = retro.decode(data)
    except (msgspec.DecodeError, ValueError) as exc:
        raise FabroError(
            f"run {full_id}: its retro.json cannot be read ({exc})",
            hint=f"look at it with `{shlex.join(['git', 'show', f'{meta}:{runrefs.RETRO}'])}`",
        ) from exc
    if json_output:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return 0
    sys.stdout.write(_render_retro(document))
    return 0


def _render_retro(doc: JsonObject) -> str:
    from fabro_git.cli import _colour as colour
    from fabro_git.cli._runs import format_ms
    from fabro_git.events.render import format_cost
    from fabro_git.terminal import printable

    on = colour.wanted(sys.stdout)
    agg = section(doc, "aggregate")
    stages = _objects(doc.get("stages"))
    status = str(doc.get("status") or "-")
    counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in section(agg, "by_status").items())
    cost = agg.get("total_cost")
    files = texts(agg.get("files_touched")) or []
    lines = [
        f"retro      {doc.get('run_id')} ({doc.get('workflow')})",
        f"goal       {doc.get('goal') or '-'}",
        f"duration   {format_ms(_whole(doc.get('duration_ms')))}",
        f"stages     {agg.get('stages', 0)}" + (f" ({counts})" if counts else ""),
        f"retries    {agg.get('total_retries', 0)}",
        f"cost       {format_cost(cost) if isinstance(cost, int | float) else '-'}"
        + (
            f" ({agg.get('input_tokens', 0)} tokens in, {agg.get('output_tokens', 0)} out)"
            if agg.get("input_tokens") or agg.get("output_tokens")
            else ""
        ),
        f"files      {len(files)} touched" + (": " + ", ".join(files[:20]) if files else ""),
    ]
    if len(files) > 20:
        lines[-1] += f", and {len(files) - 20} more"
    if stages:
        rows: list[tuple[str, ...]] = [("STAGE", "STATUS", "DURATION", "RETRIES", "COST", "FILES")]
        for stage in stages:
            stage_cost = stage.get("cost")
            rows.append(
                (
                    str(stage.get("stage_id")),
                    str(stage.get("status")),
                    format_ms(_whole(stage.get("duration_ms"))),
                    str(stage.get("retries", 0)),
                    format_cost(stage_cost) if isinstance(stage_cost, int | float) else "-",
                    str(len(texts(stage.get("files_touched")) or [])),
                )
            )
        rows = [tuple(printable(cell, one_line=True) for cell in row) for row in rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.append("")
        for row in rows:
            lines.append(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
    problems = []
    for stage in stages:
        for failure in _objects(stage.get("attempt_failures")):
            problems.append(
                f"  {stage.get('stage_id')} attempt {failure.get('attempt')}: {failure.get('error')}"
            )
        if stage.get("status") == "failed":
            problems.append(f"  {stage.get('stage_id')} failed: {stage.get('failure_reason')}")
    if problems:
        lines += ["", "failed attempts", *problems]
    lines += _narrative_lines(doc.get("narrative"))
    # Each line may quote the run (goal, errors, the model's narrative): each is shown on
    # its own line through the one sanitiser, before the status is coloured.
    lines = [printable(line, one_line=True) for line in lines]
    error = f": {printable(str(doc['error']), one_line=True)}" if doc.get("error") else ""
    lines.insert(1, f"status     {colour.status(printable(status, one_line=True), on)}{error}")
    return "\n".join(lines) + "\n"


def _narrative_lines(narrative: JsonValue) -> list[str]:
    """The model's narrative of the run (`run --retro-narrative`), when there is one."""
    if not isinstance(narrative, dict):
        return []
    lines = ["", f"smoothness {narrative.get('smoothness') or '-'} (by {narrative.get('model')})"]
    for key in ("intent", "outcome"):
        if narrative.get(key):
            lines.append(f"{key:<10} {narrative[key]}")
    for title, key, kind, text in (
        ("learnings", "learnings", "category", "text"),
        ("friction", "friction_points", "kind", "description"),
        ("open items", "open_items", "kind", "description"),
    ):
        items = _objects(narrative.get(key))
        if items:
            lines.append(title)
            for item in items:
                where = f" ({item['stage_id']})" if item.get("stage_id") else ""
                lines.append(f"  [{item.get(kind) or '-'}] {item.get(text)}{where}")
    return lines


def _objects(value: JsonValue) -> list[JsonObject]:
    """The objects of a JSON list (a retro's stages, a stage's failed attempts), [] when
    `value` is not a list."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _whole(value: JsonValue) -> int | None:
    """`value` when it is a whole number (a duration in ms), else None."""
    return value if isinstance(value, int) else None
