"""Batches on a Ray cluster (`git fabro batch --ray ADDRESS|local|auto`).

Each row is a Ray task, and any node may run it. The remote is the only shared store:
the driver has pushed the batch record, whose parent is the commit every run starts
from, so the push carries that commit's history. A task brings what its row needs from
the remote into a cache kept once per node (a bare repository, fetched, never a clone
per run), makes a small repository for the row that borrows the cache's objects (git's
alternates), starts or resumes the row's run there with every checkpoint pushed as it
is made (`--push`), and returns the row's summary.

A node that dies takes its tasks with it, and Ray runs them again elsewhere. The retry
finds the run on the remote and resumes it from its last pushed checkpoint, so no
finished stage runs again and at most the stage that was cut runs twice. The run's
process dies with the task's worker (the kernel's parent-death signal), so a task Ray
gave up on cannot go on pushing beside its retry.

One small actor on the driver's node, the coordinator, is what the tasks share: it is
told when a row starts and ends (the driver's progress), and it keeps the batch's LLM
slots. Ctrl-C on the driver cancels every task: a row not started does not start, and
a running one interrupts its run at a checkpoint and says so before the driver ends.

Ray is an optional extra (`git-fabro[ray]`); only this module imports it, and only
when a batch asks for a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from fabro_git.engine import batch as batches
from fabro_git.engine.batch import RowJob, RowSummary
from fabro_git.errors import ConfigError, FabroError, StoreError
from fabro_git.store import runs as runrefs
from fabro_git.store._gitcli import lines_of

RAY_HINT = "install the extra: pip install 'git-fabro[ray]'"
# Ray's module, its actor handles and object refs: untyped here, as Ray is an optional
# import (its stubs are not a dependency of the package).
RayObject = Any
# Ray runs a task again when its node or worker dies, this many times, then fails it.
MAX_RETRIES = 3
# How often the driver looks at the cluster for rows that ended and a Ctrl-C.
STOP_POLL_SECONDS = 0.5
# How often a task looks for its run's first commit, to vouch for what it recorded: soon
# after, since a resume elsewhere (its node lost a moment later) trusts only what was
# vouched for, and the run's first stage is well under way by the next look.
VOUCH_POLL_SECONDS = 0.02
# How long the driver waits, after Ctrl-C, for the running rows to stop at a checkpoint.
INTERRUPT_SECONDS = 120.0


class RemoteRow(msgspec.Struct):
    """What a task is given: the row's job and where the shared store is."""

    job: RowJob
    url: str  # the remote as the workers reach it
    base: str  # the commit every run of the batch starts from
    branch: str  # the base branch, as the driver has it checked out
    vouched: str | None = None  # the project file's digest, trusted by the driver's user
    # A resumed row: its run's recorded configuration and workflow, as the driver read
    # them from the remote, whose digest the driver's user trusts.
    trusted_run: str | None = None


# -- the driver's side -------------------------------------------------------------------


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The provider keys and base URLs set here, for the workers' environment: they
    travel in Ray's runtime environment, never through git."""
    from fabro_git.llm.catalogue import PROVIDERS

    names: set[str] = set()
    for info in PROVIDERS.values():
        names.update(info.key_env)
        names.add(info.base_url_env)
    return {name: environ[name] for name in sorted(names) if environ.get(name)}


def connect(address: str) -> None:
    """Join the cluster at `address`: `local` starts one on this machine, `auto` is
    the one `RAY_ADDRESS` names. A ConfigError says what is missing."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray, which is not installed", hint=RAY_HINT) from None
    options: dict[str, Any] = {
        "runtime_env": {"env_vars": worker_env(os.environ)},
        "logging_level": "WARNING",
        "log_to_driver": False,
        "include_dashboard": False,
    }
    if address == "auto":
        if not os.environ.get("RAY_ADDRESS"):
            raise ConfigError(
                "--ray auto joins the cluster RAY_ADDRESS names, and it is not set",
                hint="set RAY_ADDRESS, or give the address: --ray HOST:PORT (or --ray local)",
            )
        options["address"] = "auto"
    else:  # `local` starts a cluster of its own, whatever else runs on this machine
        options["address"] = address
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConfigError(
            f"--ray {address}: cannot join the cluster ({err})",
            hint="check the address (ray status on the head node prints it)",
        ) from None


def run_on_ray(
    rows: list[RemoteRow],
    max_parallel: int,
    progress: Callable[[str, RowSummary | None], None],
    started: Callable[[dict[int, str]], None] = lambda digests: None,
) -> tuple[list[RowSummary], bool]:
    """Run every row as a Ray task, in the shape of `batches.run_local`: (the rows'
    summaries, whether Ctrl-C or SIGTERM cut it). The driver must have joined the
    cluster (`connect`). `started` is told, at the end, the digest of what each run
    that began on a node recorded (row: digest): runs of the user's own batch, which a
    later resume on any node may trust."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    coordinator: RayObject = (
        ray.remote(Coordinator)
        .options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        )
        .remote(max_parallel)
    )
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(run_task)
    watch = _Watch(ray, coordinator, progress)
    watch.pending = {task.remote(msgspec.msgpack.encode(row), coordinator): row for row in rows}
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    # What Ray tells the driver (a node that died, say) it prints on sys.stdout, which
    # is the batch's table and `--json`: it goes to stderr, and ends with the batch.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            while watch.pending:
                if stopping.is_set():
                    watch.cancel()
                watch.collect()
            watch.wait_for_stopped()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            with contextlib.suppress(ray.exceptions.RayError):
                started(ray.get(coordinator.started_configs.remote(), timeout=30))
            ray.kill(coordinator)
            ray.shutdown()
    return sorted(watch.summaries.values(), key=lambda s: s.row), stopping.is_set()


class _Watch:
    """The driver's view of a batch's tasks on the cluster."""

    def __init__(
        self,
        ray: RayObject,
        coordinator: RayObject,
        progress: Callable[[str, RowSummary | None], None],
    ) -> None:
        self.ray = ray
        self.coordinator = coordinator
        self.progress = progress
        self.pending: dict[RayObject, RemoteRow] = {}  # a task's result: its row
        self.summaries: dict[int, RowSummary] = {}
        self.cancelled = False

    def collect(self) -> None:
        """Take the results of the tasks that ended, and pass the news on."""
        ray = self.ray
        done, _ = ray.wait(
            list(self.pending), num_returns=len(self.pending), timeout=STOP_POLL_SECONDS
        )
        for ref in done:
            summary, gave_up = _result(ray, ref, self.pending.pop(ref))
            if gave_up:  # Ray's retries are spent: no task will say this row ended
                encoded = msgspec.msgpack.encode(summary)
                ray.get(self.coordinator.note_ended.remote(summary.row, encoded))
            if summary.status != "queued":  # not one the stop cut off
                self.summaries[summary.row] = summary
        self.tell()

    def tell(self) -> None:
        for what, encoded in self.ray.get(self.coordinator.take_news.remote()):
            told = None if encoded is None else msgspec.msgpack.decode(encoded, type=RowSummary)
            if told is not None:
                self.summaries[told.row] = told
            self.progress(what, told)

    def cancel(self) -> None:
        """Ctrl-C: a queued row never starts; a running one hears KeyboardInterrupt."""
        if not self.cancelled:
            for ref in self.pending:
                self.ray.cancel(ref)
            self.cancelled = True

    def wait_for_stopped(self) -> None:
        """A cancelled task is done for Ray at once, but its run is still stopping at a
        checkpoint: wait until every row that started has said it ended."""
        deadline = time.monotonic() + INTERRUPT_SECONDS
        running = self.coordinator.running_count
        while self.ray.get(running.remote()) and time.monotonic() < deadline:
            time.sleep(STOP_POLL_SECONDS)
        self.tell()


def _result(ray: RayObject, ref: RayObject, row: RemoteRow) -> tuple[RowSummary, bool]:
    """The task's summary, and whether Ray gave up on it (its retries spent, or the task
    itself failed): then the row failed, and why is the first line of Ray's error."""
    try:
        return msgspec.msgpack.decode(ray.get(ref), type=RowSummary), False
    except ray.exceptions.TaskCancelledError:  # Ctrl-C: its run says how far it got
        return RowSummary(row.job.row.row, row.job.row.run_id, "queued", 0, None, ""), False
    except ray.exceptions.RayError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return RowSummary(row.job.row.row, row.job.row.run_id, "failed", 0, None, first), True


class Coordinator:
    """What the tasks of one batch share, kept by a Ray actor on the driver's node (an
    async actor: a wait for a slot is a coroutine, and everything else runs whole).

    Its news is the batch's progress in the order it happened: a row started, a row
    ended with its summary. A row Ray runs again after its node died is not a new
    start, so the running count stays true.

    It also keeps the batch's LLM slots (`--max-parallel`) and its shared pause after a
    429, for every node: each task serves them to its run on a local socket
    (`fabro_git.llm.slots`) through `RaySlots`. A slot is held in the name of the row's
    attempt, so the slots of an attempt whose node died are freed when Ray starts the
    row again, or gives it up."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.running: set[int] = set()
        self.news: list[tuple[str, bytes | None]] = []
        self.configs: dict[int, str] = {}  # row: its run's recorded configuration's digest
        self.held: Counter[str] = Counter()  # "<row>/<attempt>/<holder>": slots held
        self.paused_until = -math.inf
        self._changed: asyncio.Condition | None = None  # made in the actor's loop

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def note_started(self, row: int, attempt: str) -> None:
        if row not in self.running:
            self.running.add(row)
            self.news.append(("started", None))
        await self._forget(
            lambda key: key.startswith(f"{row}/") and not key.startswith(f"{row}/{attempt}/")
        )

    async def note_ended(self, row: int, summary: bytes) -> None:
        """A row ended (`summary`, a msgpack-encoded RowSummary)."""
        if row in self.running:
            self.running.discard(row)
            self.news.append(("ended", summary))
        await self._forget(lambda key: key.startswith(f"{row}/"))

    async def vouch_config(self, row: int, digest: str) -> None:
        """The recorded configuration the row's run started with, as its first start
        read it: a resume elsewhere trusts that one (`FABRO_TRUSTED_CONFIG`)."""
        self.configs.setdefault(row, digest)

    async def config_of(self, row: int) -> str | None:
        return self.configs.get(row)

    async def started_configs(self) -> dict[int, str]:
        return dict(self.configs)

    async def take_news(self) -> list[tuple[str, bytes | None]]:
        news, self.news = self.news, []
        return news

    async def running_count(self) -> int:
        return len(self.running)

    async def acquire(self, key: str) -> None:
        changed = self._condition()
        async with changed:
            await changed.wait_for(lambda: sum(self.held.values()) < self.slots)
            self.held[key] += 1

    async def try_acquire(self, key: str) -> bool:
        if sum(self.held.values()) >= self.slots:
            return False
        self.held[key] += 1
        return True

    async def release(self, key: str) -> None:
        await self._forget(lambda held: held == key, one=True)

    async def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, time.monotonic() + seconds)

    async def paused_for(self) -> float:
        return max(0.0, self.paused_until - time.monotonic())

    async def _forget(self, which: Callable[[str], bool], *, one: bool = False) -> None:
        for key in [key for key in self.held if which(key)]:
            self.held[key] = self.held[key] - 1 if one else 0
        self.held += Counter()  # drop the zeros
        changed = self._condition()
        async with changed:
            changed.notify_all()


class RaySlots:
    """A `SlotPolicy` (`fabro_git.llm.slots`) that forwards to the batch's coordinator,
    for the run of one attempt of one row. It waits on Ray's futures, never in
    `ray.get`: a task blocked there lends its CPU to another task."""

    def __init__(self, coordinator: RayObject, prefix: str) -> None:
        self.coordinator = coordinator
        self.prefix = prefix  # "<row>/<attempt>"

    def acquire(self, holder: str, blocking: bool = True) -> bool:
        key = f"{self.prefix}/{holder}"
        if blocking:
            self.coordinator.acquire.remote(key).future().result()
            return True
        return bool(self.coordinator.try_acquire.remote(key).future().result())

    def release(self, holder: str) -> None:
        self.coordinator.release.remote(f"{self.prefix}/{holder}").future().result()

    def pause(self, seconds: float) -> None:
        self.coordinator.pause.remote(seconds).future().result()

    def paused_for(self) -> float:
        return float(self.coordinator.paused_for.remote().future().result())


# -- a task, on any node -----------------------------------------------------------------


def run_task(encoded: bytes, coordinator: RayObject) -> bytes:
    """One row, on whichever node Ray chose: the row's summary, msgpack-encoded."""

    import uuid

    from fabro_git.config.trust import VOUCHED_CONFIG_VARIABLE, VOUCHED_VARIABLE
    from fabro_git.llm.slots import SlotServer

    item = msgspec.msgpack.decode(encoded, type=RemoteRow)
    row = item.job.row
    attempt = uuid.uuid4().hex[:12]
    # Waited for on its future, not in `ray.get`: a task blocked there lends its CPU to
    # another task, and a row's CPU is its own until it ends.
    coordinator.note_started.remote(row.row, attempt).future().result()
    cache = node_cache(item.url)
    with _locked(cache.with_suffix(".lock")):
        refresh_cache(cache, item)
    workdir = row_repository(cache, item)
    # Ray's cancel is a simulated SIGINT in this thread, heard only where SIGINT has
    # Python's handler; a worker started with SIGINT ignored (from a script run in the
    # background) would never hear it.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with SlotServer(RaySlots(coordinator, f"{row.row}/{attempt}")) as slots:
            env = slots.env()
            if item.vouched is not None:
                env[VOUCHED_VARIABLE] = item.vouched
            known = coordinator.config_of.remote(row.row).future().result()
            trusted = [digest for digest in (known, item.trusted_run) if digest is not None]
            if trusted:
                env[VOUCHED_CONFIG_VARIABLE] = ",".join(trusted)
            summary = run_in(workdir, item, env, coordinator)
    finally:
        signal.signal(signal.SIGINT, before)
        shutil.rmtree(workdir, ignore_errors=True)
    encoded = msgspec.msgpack.encode(summary)
    # Told, and waited for, before the task returns: before the next task on its CPU
    # can say it started.
    coordinator.note_ended.remote(row.row, encoded).future().result()
    return encoded


def node_cache(url: str) -> Path:
    """This node's cache of the remote at `url`: a bare repository, one per remote."""
    import hashlib

    from fabro_git.config.locations import fabro_home, make_private_dir

    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    return make_private_dir(fabro_home() / "batch-cache") / f"{key}.git"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The node's tasks take turns at its cache (a fetch at a time)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _git(args: list[str], cwd: Path) -> str:
    from fabro_git.store._gitcli import out, run_git

    return out(run_git(args, cwd=cwd))


def _run_refs(run_id: str) -> list[str]:
    """The refs of a run, as patterns `ls-remote` and `for-each-ref` both take."""
    return [
        runrefs.meta_ref(run_id),
        runrefs.run_branch_ref(run_id),
        f"{runrefs.PARALLEL_PREFIX}{run_id}/*",
    ]


def refresh_cache(cache: Path, item: RemoteRow) -> None:
    """Bring the batch record (and so the base commit) and the row's run refs, where
    the remote has them, into the node's cache, as the remote has them now."""
    if not (cache / "HEAD").exists():
        _git(["init", "-q", "--bare", str(cache)], cache.parent)
    record = runrefs.batch_ref(item.job.batch_id)
    patterns = [record, *_run_refs(item.job.row.run_id)]
    listed = _git(["ls-remote", "--refs", item.url, "--", *patterns], cache)
    names = [line.partition("\t")[2] for line in lines_of(listed) if "\t" in line]
    if record not in names:
        raise StoreError(f"{item.url} has no {record}: the batch record was not pushed there")
    # The run's refs as the remote has them, even behind what an earlier attempt on
    # this node made: a resume starts from the last checkpoint that was pushed.
    _git(["fetch", "-q", "--no-tags", item.url, *(f"+{n}:{n}" for n in names)], cache)


def row_repository(cache: Path, item: RemoteRow) -> Path:
    """A repository for the row's run beside the cache, borrowing its objects: the
    base branch at the batch's base commit, checked out, and the run's refs if it has
    begun; `origin` is the remote."""
    rows = cache.parent / "rows"
    rows.mkdir(mode=0o700, exist_ok=True)
    _sweep(rows)
    workdir = rows / f"{item.job.row.run_id}.{os.getpid()}"
    shutil.rmtree(workdir, ignore_errors=True)
    _git(["init", "-q", "-b", item.branch, str(workdir)], rows)
    alternates = workdir / ".git" / "objects" / "info" / "alternates"
    alternates.write_text(str(cache / "objects") + "\n")
    run_id = item.job.row.run_id
    patterns = [*_run_refs(run_id)[:2], f"{runrefs.PARALLEL_PREFIX}{run_id}/"]
    listed = _git(["for-each-ref", "--format=%(objectname) %(refname)", "--", *patterns], cache)
    lines = [f"update refs/heads/{item.branch} {item.base}\n"]
    for line in lines_of(listed):
        sha, _, name = line.partition(" ")
        lines.append(f"update {name} {sha}\n")
    from fabro_git.store._gitcli import run_git

    run_git(["update-ref", "--stdin"], cwd=workdir, input="".join(lines).encode())
    _git(["reset", "-q", "--hard"], workdir)
    _git(["remote", "add", "origin", item.url], workdir)
    return workdir


def _sweep(rows: Path) -> None:
    """Remove the row repositories of tasks whose worker died (their node's raylet was
    killed, say) before they could: each is named after its worker's pid."""
    for workdir in rows.iterdir():
        try:
            pid = int(workdir.suffix.lstrip("."))
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
        except (ValueError, PermissionError):
            continue  # not one of ours, or a live process of another user


def run_in(
    workdir: Path, item: RemoteRow, env: Mapping[str, str], coordinator: RayObject = None
) -> RowSummary:
    """Start the row's run in `workdir`, or resume it where the remote left it, and wait
    for its end. The driver's Ctrl-C reaches the task as KeyboardInterrupt (`ray.cancel`):
    the run is interrupted at a checkpoint, and waited for."""
    from fabro_git.engine.reader import open_run
    from fabro_git.store.repo import GitRepo

    row = item.job.row
    resume = False
    with GitRepo.discover(workdir) as repo:
        if repo.read_ref(runrefs.meta_ref(row.run_id)) is not None:
            if open_run(repo, row.run_id).status in batches.FINISHED:
                return batches.summarize(repo, row)  # it ended; its task died after
            resume = True
    job = msgspec.structs.replace(item.job, repo_root=str(workdir), remote="origin", resume=resume)
    procs: list[subprocess.Popen[bytes]] = []
    ended = threading.Event()

    def started(proc: subprocess.Popen[bytes]) -> None:
        procs.append(proc)
        if coordinator is not None and not resume:
            threading.Thread(
                target=_vouch_recorded_config,
                args=(workdir, row.row, row.run_id, coordinator, ended),
                daemon=True,
                name="batch-vouch",
            ).start()

    try:
        return batches.run_row(job, started=started, env=env, preexec=_as_from_a_shell)
    except KeyboardInterrupt:
        for proc in procs:
            batches.interrupt(proc)
            proc.wait()
        with GitRepo.discover(workdir) as repo:
            return batches.summarize(repo, row)
    finally:
        ended.set()


def _vouch_recorded_config(
    workdir: Path, row: int, run_id: str, coordinator: RayObject, ended: threading.Event
) -> None:
    """Once the row's run has recorded its configuration (its first commit), tell the
    coordinator its digest: the run started on the driver's command (with its trusted
    project file, if any), and a resume on another node may trust exactly what it
    recorded."""
    from fabro_git.engine.stored_run import load_run_at, run_trust
    from fabro_git.store.repo import GitRepo

    try:
        # Opened once (discovery is a git process): the ref is read from disk each look.
        with GitRepo.discover(workdir) as watched:
            while not ended.wait(VOUCH_POLL_SECONDS):
                sha = watched.read_ref(runrefs.meta_ref(run_id))
                if sha is None:
                    continue
                # Opened anew: the objects the run wrote since the first opening.
                with GitRepo.discover(workdir) as repo:
                    stored = load_run_at(repo, run_id, sha, what=sha)
                    digest = None if stored is None else run_trust(repo, run_id, stored).digest
                if digest is not None:
                    coordinator.vouch_config.remote(row, digest).future().result()
                    return
    except (FabroError, OSError):
        return  # the row's repository is gone: its run ended


def _as_from_a_shell() -> None:
    """In the run's process, before it starts. A Ray worker blocks SIGINT (and a node
    started in the background ignores it), and a child inherits both: the run would
    never hear its interrupt. So the run starts with every signal unblocked and SIGINT
    and SIGTERM as a shell leaves them. And the kernel kills it when the task's worker
    dies, so a run whose node Ray gave up on stops there."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    # Ray starts its workers at niceness 15, and the run would inherit it: on a node
    # shared with other work its stages would run last. Back to 0 where that is allowed
    # (root, as in most containers); elsewhere `RAY_worker_niceness=0` on the node.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
