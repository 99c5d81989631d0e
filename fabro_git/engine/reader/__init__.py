"""The run reader: everything that reads a run back from git, in one place.

`ps`, `show`, `logs`, `events`, `inspect`, `artifact`, `dump`, `diff` and the web view
read runs only through this package, and `store.runs` names every ref and path it
reads, so the readers and the writers cannot drift apart. It works on any clone that
has fetched a run's refs: git is the truth, and the local live tail only adds what a run
running here did since its last snapshot.

    list_runs(repo)                  the runs, newest first (RunSummary: what `ps` shows)
    resolve_run(repo, "01J…")        a full run id from a prefix or a workflow's name
    run = open_run(repo, run_id)     one run at one snapshot (RunReader)
    run.manifest, run.checkpoint, run.status, run.stages(), run.stage("plan@2"),
    run.stage_file(stage, "prompt.md"), run.transcript(stage), run.stage_diff(stage),
    run.artifacts(), run.timeline(), run.events(after=ID), run.iter_events(after=ID)
    iter_events(repo, run_id)        a run's events, a segment in memory at a time
    EventCursor(repo, run_id, after=ID).follow()   (or .follow_async() from trio)
    follow_all([...]) / follow_all_async([...])    several runs at once
    follow_all([], new_runs=NewRuns(repo))         every run, new ones too

All of it blocks on git or the disk except `follow_async`/`follow_all_async`, which
do their reading on worker threads: a trio task calls the rest with
`trio.to_thread.run_sync`.
"""

from fabro_git.engine.reader.events import (
    EventCursor,
    NewRuns,
    RunEvent,
    decode_lines,
    events_after,
    follow_all,
    follow_all_async,
    iter_events,
    read_events,
    recorded_stream,
    tail_path,
)
from fabro_git.engine.reader.run import RunReader, open_run
from fabro_git.engine.reader.runs import (
    RUN_STATUSES,
    RunSummary,
    effective_status,
    is_live,
    list_runs,
    missing_in_run,
    objects_of,
    resolve_run,
    run_labels,
    run_summary,
)
from fabro_git.engine.reader.stages import (
    STAGE_FILES,
    Artifact,
    Stage,
    TranscriptEntry,
    list_artifacts,
    list_stages,
    read_stage_file,
    select_stage,
    stage_artifacts,
    transcript,
)
from fabro_git.engine.reader.timeline import (
    CheckpointEntry,
    run_commits_by_checkpoint,
    select_checkpoint,
    stage_range,
    timeline,
)

__all__ = [
    "RUN_STATUSES",
    "STAGE_FILES",
    "Artifact",
    "CheckpointEntry",
    "EventCursor",
    "NewRuns",
    "RunEvent",
    "RunReader",
    "RunSummary",
    "Stage",
    "TranscriptEntry",
    "decode_lines",
    "effective_status",
    "events_after",
    "follow_all",
    "follow_all_async",
    "is_live",
    "iter_events",
    "list_artifacts",
    "list_runs",
    "list_stages",
    "missing_in_run",
    "objects_of",
    "open_run",
    "read_events",
    "read_stage_file",
    "recorded_stream",
    "resolve_run",
    "run_commits_by_checkpoint",
    "run_labels",
    "run_summary",
    "select_checkpoint",
    "select_stage",
    "stage_artifacts",
    "stage_range",
    "tail_path",
    "timeline",
    "transcript",
]
