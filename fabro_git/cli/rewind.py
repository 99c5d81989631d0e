"""`git fabro rewind`: replace a run by a new one that starts from an earlier checkpoint.

It is `fork` plus one more snapshot on the source run, which records that the run is
superseded (`engine.runs.rewind_run`). The source keeps its outcome and its history;
`resume` refuses it and names the run that replaced it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fabro_git.cli._timeline import print_timeline, select, timeline


def run(run_arg: str, target: str | None, *, list_only: bool) -> int:
    from fabro_git.cli._runs import resolve_run
    from fabro_git.engine.runs import rewind_run
    from fabro_git.engine.stored_run import load_run
    from fabro_git.errors import FabroError
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    source_id = resolve_run(repo, run_arg)
    manifest, _cp, _meta, _source = load_run(repo, source_id)
    entries = timeline(repo, source_id, base_sha=manifest.base_sha)
    if list_only:
        print_timeline(repo, entries, source_id)
        return 0
    if target is None:
        raise FabroError(
            "rewind needs the checkpoint to go back to, as NODE, NODE@VISIT or @N",
            hint=f"list run {source_id}'s checkpoints with `git fabro rewind {source_id} --list`",
        )
    entry = select(entries, target, run_id=source_id, command="rewind")
    new_id = rewind_run(repo, source_id, entry)
    from fabro_git.terminal import printable

    print(
        f"rewound run {source_id} to {printable(entry.label, one_line=True)} as {new_id};"
        f" continue it with `git fabro resume {new_id}`",
        file=sys.stderr,
    )
    print(new_id)
    return 0
