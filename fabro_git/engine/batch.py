"""Batches: one workflow run over many inputs, one run a row (`git fabro batch`).

A batch is known by its record, a small commit under `refs/fabro/batch/<id>` (names in
`store.runs`) holding `batch.json`: the workflow, and for each row its goal, inputs and
the run id allocated for it before any run started. Everything else about a batch is
its runs' own refs, labelled `batch=<id>` and `row=<n>`, so any clone that has fetched
them reads the batch as it stands (`batch status`).

A row runs through one function, `run_row`: it starts (or resumes) the row's run as
`git fabro run --run-id ID` would in a shell, and returns a small `RowSummary`. The
local executor (`run_local`) calls it from a pool of threads, each waiting on its own
process; an executor on a cluster calls the same function in its tasks, with a
`RowJob` (plain data) as the task's argument.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import msgspec

from fabro_git.engine.outcome import FAILED, PARTIAL, SUCCEEDED
from fabro_git.errors import FabroError, RunNotFound, SourceError
from fabro_git.files import read_input_text
from fabro_git.store import runs as runrefs
from fabro_git.store.repo import GitRepo

# A run that ended one way or the other; the rest are what `--resume` takes up again.
FINISHED = (SUCCEEDED, PARTIAL, FAILED, "superseded")


class BatchRow(msgspec.Struct):
    row: int  # 1-based, in the order of the inputs file
    run_id: str
    goal: str | None
    inputs: dict[str, str]


class BatchRecord(msgspec.Struct):
    batch_id: str
    workflow: str  # as the driver was given it: a path from the repository root, or a name
    created_at: str
    labels: dict[str, str]
    remote: str | None
    rows: list[BatchRow]
    # The commit every run starts from and its branch, for runs on other machines; the
    # record's commit has it as its parent, so pushing the record carries its history.
    base: str | None = None
    branch: str | None = None


class RowSummary(msgspec.Struct):
    """What a row came to: what the end table and `--json` show of it."""

    row: int
    run_id: str
    status: str
    stages: int  # stages that finished
    cost: float | None
    failure: str  # the first line saying why it failed, or ""

    def to_json(self) -> dict[str, object]:
        return msgspec.to_builtins(self)


class RowJob(msgspec.Struct):
    """Everything a worker needs to run one row, as plain data (it crosses processes)."""

    repo_root: str
    workflow: str
    batch_id: str
    row: BatchRow
    labels: dict[str, str]
    remote: str | None
    resume: bool = False


# -- the inputs file -------------------------------------------------------------------


def read_inputs(path: Path) -> list[tuple[str | None, dict[str, str]]]:
    """Each row of a JSONL or CSV file as (goal, inputs): `goal` by key or column, every
    other key or column an input (`-V KEY=VALUE`). A row that cannot be one is a
    SourceError naming the file and line, before anything has started."""
    # A FIFO, a device or a file of gigabytes is refused, never read (`fabro_git.files`).
    text = read_input_text(path)
    rows = _csv_rows(path, text) if path.suffix.lower() == ".csv" else _jsonl_rows(path, text)
    if not rows:
        raise SourceError(
            "the inputs file has no rows", path=path, line=1, hint="one JSON object a line"
        )
    return rows


def _jsonl_rows(path: Path, text: str) -> list[tuple[str | None, dict[str, str]]]:
    rows = []
    # Lines end at "\n" alone: JSON may hold U+2028, U+0085 and the like raw in a
    # string, where `str.splitlines` would cut a row in two.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise _bad_row(path, number, f"not JSON: {err.msg}") from None
        if not isinstance(value, dict):
            raise _bad_row(path, number, 'a row is a JSON object ({"goal": ..., "KEY": ...})')
        rows.append(_row(path, number, value))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[str | None, dict[str, str]]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header or not any(name.strip() for name in header):
        raise _bad_row(path, 1, "the first line names the columns (goal and the inputs)")
    names = [name.strip() for name in header]
    rows = []
    for cells in reader:
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(names):
            raise _bad_row(
                path, reader.line_num, f"{len(cells)} cells, but the header names {len(names)}"
            )
        rows.append(_row(path, reader.line_num, dict(zip(names, cells, strict=True))))
    return rows


def _row(path: Path, line: int, value: dict[str, object]) -> tuple[str | None, dict[str, str]]:
    from fabro_git.workflow.templates import check_input_names

    goal = value.get("goal")
    if goal is not None and not isinstance(goal, str):
        raise _bad_row(path, line, "goal is to be a string")
    inputs: dict[str, str] = {}
    for key, item in value.items():
        if key == "goal":
            continue
        if not key or isinstance(item, dict | list) or item is None:
            raise _bad_row(path, line, f"input {key!r} is to be a name with a string or number")
        inputs[key] = item if isinstance(item, str) else json.dumps(item)
    try:
        check_input_names(inputs)
    except FabroError as err:
        raise _bad_row(path, line, err.message) from None
    return goal, inputs


def _bad_row(path: Path, line: int, detail: str) -> SourceError:
    return SourceError(
        f"row at line {line} of the inputs file: {detail}",
        path=path,
        line=line,
        hint="fix the row; no run of the batch has started",
    )


# -- the batch record -------------------------------------------------------------------


def write_record(repo: GitRepo, record: BatchRecord) -> str:
    """Store the record as the commit `refs/fabro/batch/<id>` points at; its sha."""
    from dulwich.objects import ObjectID, Tree

    blob = repo.store_blob(msgspec.json.encode(record) + b"\n")
    tree = Tree()
    tree.add(runrefs.BATCH_RECORD.encode(), 0o100644, ObjectID(blob.encode()))
    tree_sha = repo.store_object(tree)
    sha = repo.write_commit(
        tree=tree_sha,
        parents=[record.base] if record.base else [],
        message=f"batch {record.batch_id}: {len(record.rows)} runs of {record.workflow}",
    )
    repo.update_ref(
        runrefs.batch_ref(record.batch_id),
        sha,
        old=None,
        message=f"fabro: batch {record.batch_id}",
    )
    return sha


def fetch_runs(repo: GitRepo, remote: str, record: BatchRecord) -> None:
    """Bring the refs of the batch's runs that `remote` has, as far as they
    fast-forward: after a batch ran elsewhere, its table and `ps` read them here."""
    from fabro_git.store.remote import fetch, ls_remote

    patterns = []
    for row in record.rows:
        patterns += [
            runrefs.meta_ref(row.run_id),
            runrefs.run_branch_ref(row.run_id),
            f"{runrefs.PARALLEL_PREFIX}{row.run_id}/*",
        ]
    listed = ls_remote(repo, remote, patterns)
    fetch(repo, remote, [f"{name}:{name}" for name in sorted(listed)], group=runrefs.run_of_ref)


def read_record(repo: GitRepo, batch_id: str) -> BatchRecord:
    sha = repo.read_ref(runrefs.batch_ref(batch_id))
    if sha is None:
        known = sorted(
            name.removeprefix(runrefs.BATCH_PREFIX) for name in repo.list_refs(runrefs.BATCH_PREFIX)
        )
        raise RunNotFound(
            f"no batch {batch_id} here (no ref {runrefs.batch_ref(batch_id)})",
            hint="`git fabro fetch REMOTE` brings the batches of a remote; known here: "
            + (", ".join(known) or "none"),
        )
    data = repo.read_file(sha, runrefs.BATCH_RECORD)
    if data is None:
        raise RunNotFound(f"batch {batch_id}: its commit {sha[:12]} holds no batch.json")
    return msgspec.json.decode(data, type=BatchRecord)


# -- one row ----------------------------------------------------------------------------


def row_command(job: RowJob) -> list[str]:
    """The `git fabro` command line that runs (or resumes) the row's run."""
    base = [sys.executable, "-m", "fabro_git"]
    push = ["--push", job.remote] if job.remote else []
    if job.resume:
        return [*base, "resume", job.row.run_id, "--json", "-q", *push]
    argv = [*base, "run", job.workflow, "--run-id", job.row.run_id, "--json", "-q", *push]
    if job.row.goal is not None:
        argv += ["--goal", job.row.goal]
    for key, value in job.row.inputs.items():
        argv += ["-V", f"{key}={value}"]
    labels = {**job.labels, "batch": job.batch_id, "row": str(job.row.row)}
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    return argv


def run_row(
    job: RowJob,
    *,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    preexec: Callable[[], None] | None = None,
) -> RowSummary:
    """Run one row to its end in a process of its own and say what it came to. A run
    that fails is an ordinary result; `started` is handed the process (to interrupt it);
    `env` is added to the run's environment (the LLM slot limiter's socket). The run
    starts in `cwd` (the job's repository by default); `preexec` runs in the child before
    it starts (a cluster's task ties the run's life to its own)."""
    where = cwd or Path(job.repo_root)
    proc = subprocess.Popen(
        row_command(job),
        cwd=where,
        env={**os.environ, **env} if env else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the driver passes Ctrl-C on, once, to each run
        preexec_fn=preexec,
    )
    if started is not None:
        started(proc)
    while True:
        try:
            # In short waits: an interrupt raised in this thread from outside (a
            # cluster's cancel) is only seen between them, never inside a long poll.
            _, err = proc.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            continue
    said = _first_error(err.decode("utf-8", "replace"))
    return summarize(GitRepo.discover(where), job.row, said=said)


def _first_error(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("error:"):
            return line.removeprefix("error:").strip()
    return ""


def summarize(repo: GitRepo, row: BatchRow, *, said: str = "") -> RowSummary:
    """The row's run as this clone's refs hold it; `queued` when it has none yet."""
    from fabro_git.engine.reader import open_run

    if repo.read_ref(runrefs.meta_ref(row.run_id)) is None:
        status = "failed" if said else "queued"
        return RowSummary(row.row, row.run_id, status, 0, None, said)
    run = open_run(repo, row.run_id)
    stages = run.stages()
    done = sum(1 for stage in stages if stage.status in (SUCCEEDED, PARTIAL))
    failure = ""
    status = run.status
    if status not in (SUCCEEDED, PARTIAL, "running"):
        failure = _first_line(run.checkpoint.error) or said
        for stage in stages:
            if stage.status == FAILED and not failure:
                failure = _first_line(str(stage.record.get("failure_reason") or ""))
    return RowSummary(row.row, row.run_id, status, done, run.summary().cost, failure)


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def interrupt(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for one row's run: SIGINT to its process group, as a terminal sends it."""
    with contextlib.suppress(ProcessLookupError):  # it has ended
        os.killpg(proc.pid, signal.SIGINT)


# -- the local executor ------------------------------------------------------------------


def run_local(
    jobs: list[RowJob], max_parallel: int, progress: Callable[[str, RowSummary | None], None]
) -> tuple[list[RowSummary], bool]:
    """Run `jobs` here, up to `max_parallel` at once, each through `run_row` in a process
    of its own; (their summaries, whether Ctrl-C or SIGTERM cut it). An executor on a
    cluster is another function of this shape. After Ctrl-C no queued row starts, and
    every running one is interrupted at a checkpoint and waited for. The runs share
    `max_parallel` LLM slots, served from here (`fabro_git.llm.slots`)."""
    from fabro_git.llm.slots import LocalSlots, SlotServer

    stopping = threading.Event()
    running: dict[int, subprocess.Popen[bytes]] = {}
    lock = threading.Lock()
    # Progress is told from the row's own thread, a row's end before its thread takes
    # the next row, so the tally never shows more running than may run.
    telling = threading.Lock()

    def tell(what: str, summary: RowSummary | None) -> None:
        with telling:
            progress(what, summary)

    def one(job: RowJob) -> RowSummary | None:
        if stopping.is_set():
            return None

        def started(proc: subprocess.Popen[bytes]) -> None:
            with lock:
                running[job.row.row] = proc
                if stopping.is_set():
                    interrupt(proc)
            tell("started", None)

        try:
            summary = run_row(job, started=started, env=slots.env())
        finally:
            with lock:
                running.pop(job.row.row, None)
        tell("ended", summary)
        return summary

    def on_signal(signum: int, frame: object) -> None:
        # Here, not as a KeyboardInterrupt: wherever the driver is, the runs hear it.
        stopping.set()
        with lock:  # only the row threads take it, never this (the main) thread
            procs = list(running.values())
        for proc in procs:
            interrupt(proc)

    summaries: list[RowSummary] = []
    slots = SlotServer(LocalSlots(max_parallel)).start()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="batch-row")
    try:
        pending: set[Future[RowSummary | None]] = {pool.submit(one, job) for job in jobs}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                summary = future.result()
                if summary is not None:
                    summaries.append(summary)
    finally:
        pool.shutdown()
        slots.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    interrupted = stopping.is_set()
    return summaries, interrupted
