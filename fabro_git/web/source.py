"""The runs of the repository the server was started in, read through the run reader.

`RepositoryRuns` is the web view's one door to the repository: every run, stage, event
and artifact a page shows is read here, by the engine's run reader, and a URL only ever
names a run id, a stage or an artifact the reader lists, never a path. Every method
blocks on git, so the app calls them on worker threads; each call opens the repository
afresh, so threads share no git object.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fabro_git.engine import reader
from fabro_git.store.repo import GitRepo


class RepositoryRuns:
    def __init__(self, start: Path) -> None:
        self.start = start
        self.git_dir = Path(GitRepo.discover(start).git_dir)

    def repo(self) -> GitRepo:
        return GitRepo.discover(self.start)

    def rows(self) -> list[dict[str, object]]:
        """Every run, newest first, as `git fabro ps --json` shows it, with `live`."""
        return [_row(row) for row in reader.list_runs(self.repo(), labels=True)]

    def row(self, run_id: str) -> dict[str, object]:
        """One run's row of `rows` (the runs page updates a row when its run moves)."""
        repo = self.repo()
        summary = reader.run_summary(repo, run_id)
        summary.labels = reader.run_labels(repo, summary.meta_sha)
        return _row(summary)

    def exists(self, run_id: str) -> bool:
        """Whether `run_id` (a whole id, its shape already checked) is a run here."""
        from fabro_git.store import runs as layout

        return self.repo().read_ref(layout.meta_ref(run_id)) is not None

    def open(self, run_id: str) -> reader.RunReader:
        return reader.open_run(self.repo(), run_id)

    def summary(self, run: reader.RunReader) -> dict[str, object]:
        """The run's row, with its goal, branches, labels and error."""
        row = run.summary()
        return {
            **row.to_json(),
            "live": row.live,
            "labels": row.labels,
            "goal": run.manifest.goal,
            "base_branch": run.manifest.base_branch,
            "run_branch": run.manifest.run_branch,
            "error": run.checkpoint.error,
        }

    def iter_events(self, run_id: str, after: str | None = None) -> Iterator[reader.RunEvent]:
        """The run's events after `after` (all without), a segment in memory at a time,
        read on worker threads one at a time. A run whose events cannot be read is
        refused (a FabroError) before this returns."""
        return reader.iter_events(self.repo(), run_id, after=after)

    def cursor(self, run_id: str, after: str | None = None) -> reader.EventCursor:
        return reader.EventCursor(self.repo(), run_id, after=after)

    def new_runs(self) -> reader.NewRuns:
        return reader.NewRuns(self.repo())

    def from_now(self) -> tuple[dict[str, reader.EventCursor], reader.NewRuns]:
        """Where every run's events stand now: a cursor at the end of each run's events
        (later reads give what it emits from now on, a run resumed later too), and the
        runs that appear later (read from their start)."""
        from fabro_git.store import runs as layout

        repo = self.repo()
        run_ids = layout.list_run_ids(repo)
        cursors = {}
        for run_id in run_ids:
            cursor = reader.EventCursor(repo, run_id)
            cursor.skip_backlog()
            cursors[run_id] = cursor
        return cursors, reader.NewRuns(repo, known=run_ids)

    def live(self, run_id: str) -> bool:
        from fabro_git.engine.lock import is_live

        return is_live(self.git_dir, run_id)

    def scratch(self, run_id: str) -> Path:
        """The run's scratch dir, where its control socket lives."""
        from fabro_git.config.locations import run_scratch_dir

        return run_scratch_dir(self.git_dir, run_id)


def _row(summary: reader.RunSummary) -> dict[str, object]:
    return {**summary.to_json(), "labels": summary.labels, "live": summary.live}
