"""`git fabro batch`: one workflow over the rows of an inputs file, a run each row.

The driver reads every row first (a bad one stops it before any run), allocates every
run id, stores the batch record (`engine.batch`), then hands the rows to an executor:
here the local one, up to N runs at once, each in its own `git fabro` process. Ctrl-C
interrupts every run at a checkpoint; `--resume` takes the unfinished ones up again.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fabro_git.engine import batch as batches
from fabro_git.engine.batch import BatchRecord, BatchRow, RowJob, RowSummary
from fabro_git.errors import ConfigError

if TYPE_CHECKING:
    from fabro_git.config.trust import RunConfigActions, TrustStore
    from fabro_git.store.repo import GitRepo


def run(
    workflow: str | None,
    *,
    inputs: Path | None,
    remote: str | None,
    max_parallel: int,
    labels: list[str],
    json_output: bool,
    resume: str | None,
    ray: str | None = None,
) -> int:
    from fabro_git.store.repo import GitRepo

    if max_parallel < 1:
        raise ConfigError(f"--max-parallel {max_parallel}: at least 1 run at a time")
    repo = GitRepo.discover(Path.cwd())
    finished: list[RowSummary] = []
    vouched = _vouch(repo)  # an untrusted project file stops the batch here, once
    if resume is not None:
        if workflow is not None or inputs is not None:
            raise ConfigError("--resume takes the batch's own workflow and rows; pass no others")
        record = batches.read_record(repo, resume)
        _check_trusted(repo, record)
        if ray is not None:
            _connect(record.remote, ray)
            assert record.remote is not None
            batches.fetch_runs(repo, record.remote, record)  # where the cluster left them
        jobs, finished = _resume_jobs(repo, record)
        if not jobs:
            print(f"batch {_shown(record.batch_id)}: every run has finished", file=sys.stderr)
    else:
        record, jobs = _new_batch(
            repo, workflow, inputs, labels, remote, ray, max_parallel, vouched
        )
    progress = _progress(record, finished)
    if ray is not None:
        summaries, interrupted = _run_on_ray(repo, record, jobs, max_parallel, progress, vouched)
    else:
        summaries, interrupted = batches.run_local(jobs, max_parallel, progress)
    by_row = {s.row: s for s in summaries}
    final = [by_row.get(row.row) or batches.summarize(repo, row) for row in record.rows]
    _show(record, final, json_output)
    if interrupted:
        print(
            f"interrupted: git fabro batch --resume {_shown(record.batch_id)} goes on",
            file=sys.stderr,
        )
        return 130
    return 0 if all(s.status in ("succeeded", "partially_succeeded") for s in final) else 1


def _new_batch(
    repo: GitRepo,
    workflow: str | None,
    inputs: Path | None,
    labels: list[str],
    remote: str | None,
    ray: str | None,
    max_parallel: int,
    vouched: str | None,
) -> tuple[BatchRecord, list[RowJob]]:
    """Read the rows, check the workflow once, store the record: the batch's jobs."""
    from fabro_git.cli.run import _pairs

    if workflow is None or inputs is None:
        raise ConfigError(
            "git fabro batch needs a WORKFLOW and --inputs FILE",
            hint="git fabro batch WORKFLOW --inputs rows.jsonl (or --resume BATCH)",
        )
    rows = batches.read_inputs(inputs)
    from fabro_git.cli.run import _validated, resolve_workflow

    given = _pairs(labels, "--label")
    if "batch" in given or "row" in given:
        raise ConfigError("--label batch= and row= are the batch's own labels; pick others")
    path = resolve_workflow(workflow)  # a missing workflow stops the batch here
    if path.suffix != ".toml":
        _validated(path)  # and so does one with errors, once, not once a run
    if Path(workflow).exists():  # a file: as the repository root names it, for every run
        workflow = os.path.relpath(path.resolve(), repo.root)
    if ray is not None:
        from fabro_git.config.run_config import PROJECT_CONFIG

        _check_committed(repo, path)
        if vouched is not None:
            _check_committed(repo, repo.root / PROJECT_CONFIG)
        _connect(remote, ray)
    record = _new_record(repo, workflow, rows, given, remote)
    from fabro_git.config.trust import TrustStore, batch_actions

    # Made here, on the user's own command line: its resumes ask nothing.
    TrustStore().trust_config(
        batch_actions(record.workflow, record.remote).digest,
        repository=repo.root,
        run_id=record.batch_id,
    )
    jobs = [_job(repo, record, row) for row in record.rows]
    where = "on the Ray cluster" if ray is not None else f"up to {max_parallel} at a time"
    print(
        f"batch {record.batch_id}: {len(record.rows)} runs of {workflow}, {where}",
        file=sys.stderr,
    )
    return record, jobs


def _check_trusted(repo: GitRepo, record: BatchRecord) -> None:
    """Refuse to resume a batch whose record, or a run it would resume, this user did
    not make or approve: a fetched record chooses the workflow its rows run and the
    remote they push to, and a run made elsewhere runs what it recorded."""
    from fabro_git.config.trust import TrustStore, ask_on_terminal

    store = TrustStore()
    untrusted = batch_trust(repo, record, store)
    if not untrusted:
        return
    summary = describe_batch(record, untrusted)
    ask = ask_on_terminal("Trust it and resume?")
    if ask is not None and ask(summary):
        for who, recorded in untrusted:
            store.trust_config(recorded.digest, repository=repo.root, run_id=who)
        return
    raise ConfigError(
        f"{summary}\nnothing was resumed",
        hint=f"read it with `git fabro batch status {record.batch_id}`, then run "
        f"`git fabro trust --run {record.batch_id}`",
    )


def batch_trust(
    repo: GitRepo, record: BatchRecord, store: TrustStore
) -> list[tuple[str, RunConfigActions]]:
    """What resuming `record` does on the say of whoever made it, where `store` does not
    trust it yet, each part with the id its trust is kept for: the record's own choices
    and, with them, the recorded configuration and workflow of each run it would resume
    (a row's run cut short). A record this user made or approved asks nothing: its runs
    are theirs, and each resume still checks its own."""
    from fabro_git.config.trust import batch_actions
    from fabro_git.engine.stored_run import load_run, run_trust
    from fabro_git.store import runs as runrefs

    choices = batch_actions(record.workflow, record.remote)
    if store.trusts_config(choices.digest):
        return []
    found = [(record.batch_id, choices)]
    for row in record.rows:
        if repo.read_ref(runrefs.meta_ref(row.run_id)) is None:
            continue  # never started: it runs the record's workflow
        if batches.summarize(repo, row).status not in batches.FINISHED:
            recorded = run_trust(repo, row.run_id, load_run(repo, row.run_id))
            if recorded.actions and not store.trusts_config(recorded.digest):
                found.append((row.run_id, recorded))
    return found


def describe_batch(record: BatchRecord, parts: list[tuple[str, RunConfigActions]]) -> str:
    """`parts` of `batch_trust` in words: the record's, then the runs', those that
    would do the same thing said together."""
    from fabro_git.config.trust import describe

    lines = [f"batch {_shown(record.batch_id)} was not made here; resuming it would:"]
    runs: dict[str, list[str]] = {}
    for who, recorded in parts:
        if who == record.batch_id:
            lines.append(describe(recorded.actions))
        else:
            runs.setdefault(describe(recorded.actions), []).append(who)
    for words, ids in runs.items():
        named = ", ".join(_shown(run_id) for run_id in ids[:5])
        more = f" and {len(ids) - 5} more" if len(ids) > 5 else ""
        lines.append(f"resume its run{'s' if len(ids) > 1 else ''} {named}{more}, which would:")
        lines.append(words)
    return "\n".join(lines)


def _vouch(repo: GitRepo) -> str | None:
    """The project file's digest when it has keys that act and the user trusts it (asked
    now on a terminal, as `run` asks): what the runs on a cluster's nodes are told to
    trust. An untrusted one is refused before any run, not once a row."""
    from fabro_git.config.trust import ask_on_terminal, read_project, trusted_project_layer

    project = read_project(repo.root)
    if not project.actions:
        return None
    trusted_project_layer(repo.root, ask=ask_on_terminal("Trust this file and run the batch?"))
    return project.digest


def _connect(remote: str | None, address: str) -> None:
    """Join the Ray cluster, once the batch can run there: its runs meet at a remote."""
    if remote is None:
        raise ConfigError(
            "--ray needs --remote: the nodes get the repository from it and push every "
            "run's checkpoints back to it",
            hint="git fabro batch WORKFLOW --inputs FILE --remote origin --ray auto",
        )
    from fabro_git.engine import batch_ray

    batch_ray.connect(address)


def _check_committed(repo: GitRepo, path: Path) -> None:
    """The nodes run the workflow as the base commit has it: it must be there, as is;
    or be one git fabro ships, which every node's install has too."""
    import fabro_git
    from fabro_git.store._gitcli import out, run_git

    if path.resolve().is_relative_to(Path(fabro_git.__file__).resolve().parent):
        return
    inside = path.resolve().is_relative_to(repo.root.resolve())
    changed = inside and out(
        run_git(["status", "--porcelain", "--", str(path.resolve())], cwd=repo.root)
    )
    if not inside or changed:
        raise ConfigError(
            f"{path}: the cluster's nodes run the workflow from the commit HEAD points at, "
            + (
                "and it is outside the repository"
                if not inside
                else "and it has changes not committed"
            ),
            hint="commit the workflow (and what it reads), then run the batch again",
        )


def _remote_url(repo: GitRepo, remote: str) -> str:
    """`remote` as a node reaches it: the URL of a remote of that name, else itself (a
    URL, or a path made absolute)."""
    from fabro_git.store._gitcli import out, run_git

    proc = run_git(["remote", "get-url", remote], cwd=repo.root, check=False)
    url = out(proc).strip() if proc.returncode == 0 else remote
    local = repo.root / url  # an absolute `url` stays itself
    if "://" not in url and ":" not in url.split("/", 1)[0] and local.exists():
        url = str(local.resolve())
    return url


def _run_on_ray(
    repo: GitRepo,
    record: BatchRecord,
    jobs: list[RowJob],
    max_parallel: int,
    progress: Callable[[str, RowSummary | None], None],
    vouched: str | None,
) -> tuple[list[RowSummary], bool]:
    from fabro_git.config.trust import TrustStore
    from fabro_git.engine import batch_ray

    assert record.remote is not None
    if record.base is None or record.branch is None:
        raise ConfigError(
            f"batch {record.batch_id} was stored without its base commit, so it cannot move "
            "to a cluster",
            hint=f"git fabro batch --resume {record.batch_id} (without --ray) goes on here",
        )
    url = _remote_url(repo, record.remote)
    store = TrustStore()
    rows = [
        batch_ray.RemoteRow(
            job, url, record.base, record.branch, vouched, _trusted_run(repo, job, store)
        )
        for job in jobs
    ]
    run_of = {job.row.row: job.row.run_id for job in jobs}

    def started(digests: dict[int, str]) -> None:
        """The runs began on the nodes at this user's command: theirs to resume anywhere."""
        for row, digest in digests.items():
            store.trust_config(digest, repository=repo.root, run_id=run_of.get(row, "?"))

    summaries, interrupted = batch_ray.run_on_ray(rows, max_parallel, progress, started)
    batches.fetch_runs(repo, record.remote, record)
    return summaries, interrupted


def _trusted_run(repo: GitRepo, job: RowJob, store: TrustStore) -> str | None:
    """For a resumed row, the digest of what its run recorded, as fetched here, if this
    user trusts it: the node that resumes it checks its own copy against it."""
    from fabro_git.engine.stored_run import load_run, run_trust

    if not job.resume:
        return None
    recorded = run_trust(repo, job.row.run_id, load_run(repo, job.row.run_id))
    return recorded.digest if store.trusts_config(recorded.digest) else None


def _new_record(
    repo: GitRepo,
    workflow: str,
    rows: list[tuple[str | None, dict[str, str]]],
    labels: dict[str, str],
    remote: str | None,
) -> BatchRecord:
    from fabro_git.engine.runner import now_iso
    from fabro_git.store import runs as runrefs

    head = repo.require_base()
    record = BatchRecord(
        base=head.sha,
        branch=head.branch,
        batch_id=runrefs.new_ulid(),
        workflow=workflow,
        created_at=now_iso(),
        labels=labels,
        remote=remote,
        rows=[
            BatchRow(number, runrefs.new_ulid(), goal, values)
            for number, (goal, values) in enumerate(rows, 1)
        ],
    )
    batches.write_record(repo, record)
    if remote is not None:
        _push_record(repo, record)
    return record


def _push_record(repo: GitRepo, record: BatchRecord) -> None:
    from fabro_git.errors import StoreError
    from fabro_git.store import runs as runrefs
    from fabro_git.store.remote import push

    assert record.remote is not None
    ref = runrefs.batch_ref(record.batch_id)
    report = push(repo, record.remote, [ref])
    for _, ok, message in report.refs:
        if not ok:
            raise StoreError(f"{record.remote} refused {ref}: {message}")


def _job(repo: GitRepo, record: BatchRecord, row: BatchRow, *, resume: bool = False) -> RowJob:
    return RowJob(
        repo_root=str(repo.root),
        workflow=record.workflow,
        batch_id=record.batch_id,
        row=row,
        labels=record.labels,
        remote=record.remote,
        resume=resume,
    )


def _resume_jobs(repo: GitRepo, record: BatchRecord) -> tuple[list[RowJob], list[RowSummary]]:
    """A job for each row not finished (a resume of a run cut short, a start of one
    that never began), and the summaries of the rows that finished."""
    jobs, finished = [], []
    for row in record.rows:
        now = batches.summarize(repo, row)
        if now.status == "queued":
            jobs.append(_job(repo, record, row))
        elif now.status not in batches.FINISHED:
            jobs.append(_job(repo, record, row, resume=True))
        else:
            finished.append(now)
    return jobs, finished


# -- what a person reads ------------------------------------------------------------------


def _progress(
    record: BatchRecord, finished: Iterable[RowSummary] = ()
) -> Callable[[str, RowSummary | None], None]:
    """A progress line per change: redrawn in place on a terminal, a line each otherwise.
    `finished` are the rows that ended before (a resumed batch): counted from the start,
    and left out of the time still to go."""
    from fabro_git.events.render import format_cost

    batch_id = _shown(record.batch_id)
    total = len(record.rows)
    counts = {"running": 0, "succeeded": 0, "failed": 0, "interrupted": 0}
    cost = [0.0]
    for summary in finished:
        counts[_tally(summary.status)] += 1
        cost[0] += summary.cost or 0.0
    before = counts["succeeded"] + counts["failed"] + counts["interrupted"]
    began = time.monotonic()
    # As the run's own progress display decides: a terminal that can redraw a line.
    live = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    lock = threading.Lock()

    def update(what: str, summary: RowSummary | None) -> None:
        with lock:
            if what == "started":
                counts["running"] += 1
            elif summary is not None:
                counts["running"] -= 1
                counts[_tally(summary.status)] += 1
                cost[0] += summary.cost or 0.0
            ended = counts["succeeded"] + counts["failed"] + counts["interrupted"]
            queued = total - ended - counts["running"]
            left = ""
            if ended > before:
                seconds = (time.monotonic() - began) / (ended - before) * (total - ended)
                left = f", about {seconds:.0f}s left"
            line = (
                f"batch {batch_id}: {queued} queued, {counts['running']} running, "
                f"{counts['succeeded']} succeeded, {counts['failed']} failed, "
                + (f"{counts['interrupted']} interrupted, " if counts["interrupted"] else "")
                + f"cost {format_cost(cost[0])}{left}"
            )
            if live:
                sys.stderr.write("\r\x1b[K" + line + ("\n" if ended == total else ""))
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return update


def _tally(status: str) -> str:
    """Which count of the progress line a run that ended counts in."""
    if status in ("succeeded", "partially_succeeded"):
        return "succeeded"
    return "interrupted" if status == "interrupted" else "failed"


def _show(record: BatchRecord, summaries: Iterable[RowSummary], json_output: bool) -> None:
    if json_output:
        for summary in summaries:
            sys.stdout.write(json.dumps({"batch_id": record.batch_id, **summary.to_json()}) + "\n")
        return
    from fabro_git.events.render import format_cost

    rows = [("ROW", "RUN", "STATUS", "STAGES", "COST", "FAILURE")]
    for s in summaries:
        # The run ids are the record's and the statuses the runs' refs': fetched, maybe.
        rows.append(
            (
                str(s.row),
                _shown(s.run_id),
                _shown(s.status),
                str(s.stages),
                format_cost(s.cost) if s.cost is not None else "-",
                _shown(s.failure)[:80],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def status(batch_id: str, *, json_output: bool) -> int:
    """The batch as this clone's refs hold it: its record and each row's run."""
    from fabro_git.store.repo import GitRepo

    repo = GitRepo.discover(Path.cwd())
    record = batches.read_record(repo, batch_id)
    summaries = [batches.summarize(repo, row) for row in record.rows]
    if not json_output:
        counts: dict[str, int] = {}
        for s in summaries:
            counts[s.status] = counts.get(s.status, 0) + 1
        said = ", ".join(f"{n} {_shown(what)}" for what, n in sorted(counts.items()))
        print(
            f"batch {_shown(record.batch_id)}: {len(summaries)} runs of "
            f"{_shown(record.workflow)}: {said}"
        )
    _show(record, summaries, json_output)
    return 0


def _shown(text: str) -> str:
    """A batch record's field, or a run's, as a terminal may be sent it: the record
    comes from `refs/fabro/batch/`, which `fetch` brings from any remote."""
    from fabro_git.terminal import printable

    return printable(text, one_line=True)
