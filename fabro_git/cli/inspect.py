"""`git fabro inspect`: a run's manifest, checkpoint and status, straight from its meta ref."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from fabro_git.engine.checkpoint import TokenTotals


def run(run_id: str, *, json_output: bool) -> int:
    from fabro_git.cli._runs import effective_status, format_ms, resolve_run
    from fabro_git.config.locations import run_scratch_dir
    from fabro_git.engine.lock import is_live
    from fabro_git.engine.session import load_run
    from fabro_git.store import runs as runrefs
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    full_id = resolve_run(repo, run_id)
    manifest, cp, meta, _source = load_run(repo, full_id)
    live = is_live(Path(repo.git_dir), full_id)
    status = effective_status(cp.status, live, superseded=bool(manifest.superseded_by))
    run_tip = repo.read_ref(runrefs.run_branch_ref(full_id))
    if run_tip is not None:
        from fabro_git.engine.session import missing_object_error
        from fabro_git.errors import MissingObject

        try:
            repo.commit_info(run_tip)
        except MissingObject as exc:
            problem = missing_object_error(full_id, runrefs.run_branch_ref(full_id), run_tip, exc)
            print(f"warning: {problem.message}\nhint: {problem.hint}", file=sys.stderr)
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
    from fabro_git.cli import _colour as colour

    on = colour.wanted(sys.stdout)
    lines = [
        f"run        {full_id}",
        f"workflow   {manifest.workflow_name} ({manifest.workflow_path or manifest.workflow_slug})",
        f"status     {colour.status(status, on)}" + (f": {cp.error}" if cp.error else ""),
        f"goal       {manifest.goal or '-'}",
        f"base       {manifest.base_branch or '-'} @ {manifest.base_sha[:12]}",
        f"branch     {manifest.run_branch or '(in place)'}"
        + (f" @ {run_tip[:12]}" if run_tip else ""),
        f"meta       {runrefs.meta_ref(full_id)} @ {meta[:12]}",
        f"started    {cp.started_at}",
        f"active     {format_ms(cp.active_ms)}",
        *([f"cost       ${cp.total_cost:.4f}"] if cp.total_cost else []),
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
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


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
