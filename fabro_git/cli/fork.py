"""`git fabro fork`: a new run that starts from a checkpoint of another one.

The command chooses the checkpoint (from the source's meta history, never from its
tip) and says what it made; `engine.runs.fork_run` makes the run, which shares the
source's history up to there. `git fabro resume <new id>` carries on from the next
stage. The source run's refs are only read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fabro_git.cli._timeline import print_timeline, select, timeline


def run(run_arg: str, target: str | None, *, list_only: bool) -> int:
    from fabro_git.cli._runs import objects_of, resolve_run
    from fabro_git.engine.runs import fork_run
    from fabro_git.engine.stored_run import load_run
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    source_id = resolve_run(repo, run_arg)
    with objects_of(source_id):
        manifest, _cp, _meta, _source = load_run(repo, source_id)
        entries = timeline(repo, source_id, base_sha=manifest.base_sha)
        if list_only:
            print_timeline(repo, entries, source_id)
            return 0
        entry = select(entries, target, run_id=source_id, command="fork")
        new_id = fork_run(repo, source_id, entry)
    from fabro_git.terminal import printable

    print(
        f"forked run {source_id} at {printable(entry.label, one_line=True)} as {new_id};"
        f" continue it with `git fabro resume {new_id}`",
        file=sys.stderr,
    )
    print(new_id)
    return 0
