"""`git fabro batch --ray` against plain `git fabro run`: what a run costs on Ray, and
what 40 runs on two local nodes give against one process running them in turn.

Builds a scratch repository whose project workflow `hello` is the shipped example (two
shell stages, no model), committed and pushed to a local bare remote `origin`, and a
Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`), started once
and kept up. Each node gets the environment a real worker would have: a home with
git's identity, a FABRO_HOME of its own (so each keeps its own cache of the remote),
and the venv's bin on PATH. Every run replicates live to the remote: `batch --ray`
always pushes, so the plain runs are `git fabro run hello --push origin`.

Part 1, the overhead of a run on Ray. Interleaved, `--reps` rounds of:

  plain        K x `git fabro run hello --push origin`, one after another
  no push      K x `git fabro run hello` (for reference: what the replication costs)
  batch        `git fabro batch hello --inputs K rows --remote origin --ray ADDRESS`,
               the whole command; its stderr lines, timed as they arrive, split it into
               the start (process start, joining the cluster, storing and pushing the
               batch record), the rows, and the end (leaving the cluster, fetching the
               runs, the table)
  task         K rows run as Ray tasks one at a time from this process (joined to the
               cluster once), each through `batch_ray.run_task` itself, with its pieces
               timed in the worker: the node's cache fetch, the row repository, the
               `git fabro` process, the summary, and the rest (the coordinator's round
               trips, the cache lock, the slot server, the clean-up). The round trip as
               this driver sees it, against a plain run: the overhead a run pays. The
               first task of a round is shown apart, with how many times its worker
               process was one no task of this job had had before (the batches
               in between take the nodes' CPUs, and Ray stops idle workers above a
               node's CPU count).
  batch of 1   the whole command for one row: what a batch costs once
  new job      a process that joins the cluster as the batch's driver does and asks
               at once for the coordinator actor and a first task on a fresh worker
               (Ray's workers belong to one job, so every batch starts its own)

Part 2, throughput: `--runs` (40) runs of hello, interleaved over `--reps` rounds:

  sequential   N x `git fabro run hello --push origin`, one process after another
  ray          `git fabro batch hello ... --ray ADDRESS`, the whole command
  local -pN    `git fabro batch hello ... --remote origin --max-parallel N` (no Ray),
               for N = 2 and 4

reported as runs per minute and as ratios to sequential.

`--cpus-per-node` (default 1) is the num_cpus each node tells Ray, so the cluster
runs that many rows per node at once: 1 a node is 2 runs at once, one per core of a
2-core machine. Ray starts its workers at niceness 15 (`RAY_worker_niceness`), and
the `git fabro` process of a row inherits it, so on a machine busy with other work the
rows get a smaller share of the CPUs than the plain runs at 0; `--worker-niceness 0`
starts the nodes with 0, to see Ray's own overhead apart from that.

    python benchmarks/batch.py [--rows 8] [--runs 40] [--reps 2] [--cpus-per-node 1]
                               [--worker-niceness N] [--quick]

Run it with the venv's python (`.venv/bin/python benchmarks/batch.py`): the nodes'
workers are that python, and they import fabro_git.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec

# -- the scratch world -------------------------------------------------------------------


class World:
    """The repository, its bare remote, the homes, and the environments of the commands
    and of the two nodes."""

    def __init__(self, base: Path, niceness: int | None) -> None:
        from fabro_git.workflow.paths import examples_dir

        self.base = base
        self.niceness = niceness
        home = base / "home"
        home.mkdir()
        (home / ".gitconfig").write_text(
            "[init]\n\tdefaultBranch = main\n[user]\n\tname = Bench\n\temail = bench@example.com\n"
        )
        bin_dir = str(Path(sys.executable).parent)
        # What the commands and the nodes inherit: this machine's environment without
        # git's, fabro's and Ray's own variables, with a home of the benchmark's.
        clean = {
            k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "FABRO_", "RAY_"))
        }
        clean.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user runs it: compiled bytecode
        clean.update(
            HOME=str(home),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_CACHE_HOME=str(home / ".cache"),
            GIT_CONFIG_NOSYSTEM="1",
            PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
        )
        self.clean = clean
        self.env = {**clean, "FABRO_HOME": str(base / "driver")}
        self.repo = base / "repo"
        self.origin = base / "origin.git"
        self.repo.mkdir()
        self.git(self.repo, "init", "-q", "-b", "main")
        for i in range(20):
            (self.repo / f"file{i}.txt").write_text(f"{i}\n")
        # The shipped example as the project's `hello`: the nodes run the workflow as the
        # base commit has it, so it must be committed (a shipped example by name is
        # outside the repository, and `batch --ray` refuses it).
        project = self.repo / ".fabro" / "workflows" / "hello"
        project.mkdir(parents=True)
        shutil.copy(examples_dir() / "hello.fabro", project / "workflow.fabro")
        self.git(self.repo, "add", "-A")
        self.git(self.repo, "commit", "-q", "-m", "init")
        self.git(base, "init", "-q", "--bare", str(self.origin))
        self.git(self.repo, "remote", "add", "origin", str(self.origin))
        self.git(self.repo, "push", "-q", "origin", "main")

    def git(self, cwd: Path, *args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=self.clean, check=True, capture_output=True, text=True
        ).stdout

    def node_env(self, name: str) -> dict[str, str]:
        env = {**self.clean, "FABRO_HOME": str(self.base / "nodes" / name)}
        if self.niceness is not None:  # read by each node's raylet as it starts
            env["RAY_worker_niceness"] = str(self.niceness)
        return env

    def rows(self, count: int) -> Path:
        path = self.base / f"rows-{count}.jsonl"
        path.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(1, count + 1)))
        return path

    def fabro(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["git", "fabro", *args], cwd=self.repo, env=self.env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"git fabro {' '.join(args)} failed:\n{proc.stderr}")
        return proc


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """os.environ as `env` while a node starts: its processes inherit it."""
    with mock.patch.dict(os.environ, env, clear=True):
        yield


class TwoNodes:
    """A head and one worker node on this machine, each with its own FABRO_HOME."""

    def __init__(self, world: World, cpus: int) -> None:
        from ray.cluster_utils import Cluster

        with environ(world.node_env("head")):
            self.cluster = Cluster(
                initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False}
            )
        with environ(world.node_env("worker")):
            self.cluster.add_node(num_cpus=cpus)
        self.cluster.wait_for_nodes()
        self.address: str = self.cluster.address

    def shutdown(self) -> None:
        self.cluster.shutdown()


def descendants_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's descendants alive now:
    the cluster's processes (GCS, raylets, their agents and workers)."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime, stime
    total, todo = 0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def idle_cost(seconds: float = 10.0) -> float:
    """The share of a core the cluster takes while it runs nothing."""
    before = descendants_cpu()
    time.sleep(seconds)
    return (descendants_cpu() - before) / seconds


# -- what is timed -----------------------------------------------------------------------


def plain_runs(world: World, count: int, push: bool) -> list[float]:
    """`count` plain runs of hello, one after another: each one's wall time."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        world.fabro("run", "hello", *(["--push", "origin"] if push else []), "-q")
        times.append(time.perf_counter() - start)
    return times


class BatchTiming(msgspec.Struct):
    wall: float
    announced: float  # the "batch <id>: N runs" line: joined, record stored and pushed
    first_news: float  # the first progress line (a row started)
    last_news: float  # the last progress line (every row ended)


def batch(world: World, count: int, *where: str) -> BatchTiming:
    """One `git fabro batch hello` of `count` rows, its stderr lines timed as they come."""
    argv = ["git", "fabro", "batch", "hello", "--inputs", str(world.rows(count))]
    argv += ["--remote", "origin", "--json", *where]
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=world.repo, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lines: list[tuple[float, str]] = []
    out: list[bytes] = []
    assert proc.stdout is not None and proc.stderr is not None
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    for raw in proc.stderr:
        lines.append((time.perf_counter() - start, raw.decode("utf-8", "replace")))
    proc.wait()
    wall = time.perf_counter() - start
    reader.join()
    ran = [json.loads(line) for line in b"".join(out).decode().splitlines() if line.strip()]
    if proc.returncode != 0 or [r["status"] for r in ran] != ["succeeded"] * count:
        said = "".join(text for _, text in lines)
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{said}\n{ran}")
    announced = next(t for t, text in lines if " runs of hello" in text)
    news = [t for t, text in lines if " queued, " in text]
    return BatchTiming(wall, announced, news[0], news[-1])


# A new job on the cluster, as `git fabro batch --ray` makes one: the times (from the
# start of this process) at which Ray was imported, the driver had joined, and the
# coordinator actor and a first task on a fresh worker (importing what run_task
# imports) had each answered; both are asked for at once, as the batch asks for them.
COLD_JOB = """
import json, sys, time
began = time.perf_counter()
import ray
imported = time.perf_counter() - began
from fabro_git.engine import batch_ray
ray.init(address=sys.argv[1], logging_level="WARNING", log_to_driver=False,
         runtime_env={"env_vars": {}})
joined = time.perf_counter() - began

def first(_: int) -> float:
    from fabro_git.engine import batch_ray  # noqa: F401
    from fabro_git.engine.reader import open_run  # noqa: F401
    from fabro_git.llm.slots import SlotServer  # noqa: F401
    return 0.0

coordinator = ray.remote(batch_ray.Coordinator).options(num_cpus=0).remote(1)
task = ray.remote(num_cpus=1)(first).remote(0)
ray.get(coordinator.running_count.remote())
actor = time.perf_counter() - began
ray.get(task)
worker = time.perf_counter() - began
ray.shutdown()
print(json.dumps({"import ray": imported, "joined": joined, "actor": actor, "task": worker}))
"""


def cold_job(world: World, address: str) -> dict[str, float]:
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", COLD_JOB, address],
        env=world.env,
        capture_output=True,
        text=True,
        check=True,
    )
    return {**json.loads(proc.stdout.splitlines()[-1]), "exit": time.perf_counter() - began}


PIECES = (
    "coordinator",
    "refresh_cache",
    "row_repository",
    "slot_server",
    "process",
    "summarize",
    "clean_up",
    "other",
)


def timed_task(encoded: bytes, coordinator: Any) -> tuple[bytes, dict[str, float]]:
    """On a node: `batch_ray.run_task` for one row, its pieces timed by wrapping the
    functions it calls (looked up in their modules at each call)."""
    from fabro_git.engine import batch as batches
    from fabro_git.engine import batch_ray
    from fabro_git.llm import slots

    spent: dict[str, float] = {}
    saved: list[tuple[Any, str, Any]] = []

    def wrap(module: Any, name: str, piece: str) -> None:
        original = getattr(module, name)
        saved.append((module, name, original))

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[piece] = spent.get(piece, 0.0) + time.perf_counter() - began

        setattr(module, name, timed)

    wrap(batch_ray, "refresh_cache", "refresh_cache")
    wrap(batch_ray, "row_repository", "row_repository")
    wrap(batches, "run_row", "process")  # the `git fabro` process, and its summary
    wrap(batches, "summarize", "summarize")
    wrap(slots.SlotServer, "start", "slot_server")
    wrap(slots.SlotServer, "close", "slot_server")
    wrap(shutil, "rmtree", "clean_up")  # the row's repository, after the run

    class Call:
        """A coordinator method whose calls, each waited for on its future as
        `run_task` waits, are timed from the call to the answer."""

        def __init__(self, method: Any) -> None:
            self.method = method

        def remote(self, *args: Any) -> Any:
            called, future = time.perf_counter(), self.method.remote(*args).future()

            class Answer:
                def future(self) -> Any:
                    return self

                def result(self) -> Any:
                    try:
                        return future.result()
                    finally:
                        took = time.perf_counter() - called
                        spent["coordinator"] = spent.get("coordinator", 0.0) + took

            return Answer()

    class Timed:
        def __getattr__(self, name: str) -> Call:
            return Call(getattr(coordinator, name))

    began = time.perf_counter()
    try:
        result = batch_ray.run_task(encoded, Timed())
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    spent["task"] = time.perf_counter() - began
    spent["pid"] = os.getpid()
    spent["nice"] = os.getpriority(os.PRIO_PROCESS, 0)  # the run's process inherits it
    spent["process"] -= spent.get("summarize", 0.0)
    spent["other"] = spent["task"] - sum(spent.get(p, 0.0) for p in PIECES[:-1])
    return result, spent


class InProcess:
    """This process joined to the cluster, running rows as tasks one at a time."""

    def __init__(self, world: World, address: str) -> None:
        import ray

        from fabro_git.engine import batch_ray

        self.world = world
        self.ray = ray
        began = time.perf_counter()
        ray.init(
            address=address,
            logging_level="WARNING",
            log_to_driver=False,
            runtime_env={"env_vars": batch_ray.worker_env(os.environ)},
        )
        self.joined = time.perf_counter() - began  # ray.init, as `batch_ray.connect` calls it
        self.coordinator = ray.remote(batch_ray.Coordinator).options(num_cpus=0).remote(1)
        self.task = ray.remote(num_cpus=1, max_retries=0)(timed_task)

    def rows(self, count: int) -> list[Any]:
        """A batch record of `count` rows, stored and pushed as `batch` stores it."""
        from fabro_git.cli import batch as cli_batch
        from fabro_git.engine import batch_ray
        from fabro_git.store.repo import GitRepo

        with environ(self.world.env), GitRepo.discover(self.world.repo) as repo:
            rows: list[tuple[str | None, dict[str, str]]] = [
                (None, {"n": str(n)}) for n in range(1, count + 1)
            ]
            record = cli_batch._new_record(repo, "hello", rows, {}, "origin")
            url = cli_batch._remote_url(repo, "origin")
            assert record.base is not None and record.branch is not None
            return [
                batch_ray.RemoteRow(
                    cli_batch._job(repo, record, row), url, record.base, record.branch
                )
                for row in record.rows
            ]

    def run(self, count: int) -> list[dict[str, float]]:
        """`count` rows, one task at a time: each one's pieces, and its round trip."""
        from fabro_git.engine.batch import RowSummary

        found = []
        for row in self.rows(count):
            began = time.perf_counter()
            encoded, spent = self.ray.get(
                self.task.remote(msgspec.msgpack.encode(row), self.coordinator)
            )
            spent["round_trip"] = time.perf_counter() - began
            summary = msgspec.msgpack.decode(encoded, type=RowSummary)
            if summary.status != "succeeded":
                raise SystemExit(f"row {summary.row} of the timed tasks: {summary}")
            found.append(spent)
        return found

    def close(self) -> None:
        self.ray.kill(self.coordinator)
        self.ray.shutdown()


# -- the report --------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def med(values: list[float]) -> float:
    return statistics.median(values)


def overhead(world: World, nodes: TwoNodes, rows: int, reps: int) -> None:
    print(f"\n== Part 1: a run's overhead on Ray ({rows} rows a round, {reps} rounds, interleaved)")
    driver = InProcess(world, nodes.address)
    plain: list[list[float]] = []
    no_push: list[list[float]] = []
    batches: list[BatchTiming] = []
    singles: list[BatchTiming] = []
    tasks: list[list[dict[str, float]]] = []
    colds: list[dict[str, float]] = []
    try:
        # Warm-up: page cache, bytecode, each node's cache of the remote, Ray's workers.
        plain_runs(world, 1, push=True)
        batch(world, 2, "--ray", nodes.address)
        driver.run(2)
        for _ in range(reps):
            plain.append(plain_runs(world, rows, push=True))
            batches.append(batch(world, rows, "--ray", nodes.address))
            no_push.append(plain_runs(world, rows, push=False))
            tasks.append(driver.run(rows))
            singles.append(batch(world, 1, "--ray", nodes.address))
            colds.append(cold_job(world, nodes.address))
    finally:
        driver.close()
    every = [t for round_tasks in tasks for t in round_tasks]
    warm = [t for round_tasks in tasks for t in round_tasks[1:]]
    p = med([x for xs in plain for x in xs])
    n = med([x for xs in no_push for x in xs])
    print(f"plain run, --push origin        {p:6.3f} s a run (median of {rows * reps})")
    nice = sorted({int(t["nice"]) for t in every})
    print(f"  (niceness of the Ray workers and so of their runs: {nice}; of the plain runs: 0)")
    print(f"plain run, no push              {n:6.3f} s a run (replication: {p - n:+.3f} s)")

    def rounds(figure: Callable[[int], float]) -> str:
        return ", ".join(f"{figure(r):.2f}x" for r in range(reps))

    trip = med([t["round_trip"] for t in warm])
    print(
        f"a row as a Ray task, alone      {trip:6.3f} s round trip: {trip - p:+.3f} s a run,"
        f" {trip / p:.2f}x plain (median of {len(warm)}; rounds"
        f" {rounds(lambda r: med([t['round_trip'] for t in tasks[r][1:]]) / med(plain[r]))})"
    )
    first = med([round_tasks[0]["round_trip"] for round_tasks in tasks])
    pids = [t["pid"] for t in every]
    new_worker = sum(1 for r in range(1, reps) if pids[r * rows] not in pids[: r * rows])
    print(
        f"  the first of a round          {first:6.3f} s (in a worker process new to this job"
        f" in {new_worker} of {reps - 1} rounds after the first;"
        f" this process's ray.init took {driver.joined:.3f} s)"
    )
    in_task = med([t["task"] for t in warm])
    print(
        f"  scheduling and return         {trip - in_task:6.3f} s (round trip - time in the task)"
    )
    for piece in PIECES:
        print(f"  {piece:<29} {med([t.get(piece, 0.0) for t in warm]):6.3f} s")
    print(
        f"  (the `git fabro` process on the node: {med([t['process'] for t in every]):.3f} s,"
        f" the plain run here {p:.3f} s)"
    )
    wall = med([b.wall for b in batches])
    print(
        f"batch of {rows} on Ray, whole cmd   {wall:6.3f} s = {wall / rows:6.3f} s a run:"
        f" {wall / rows - p:+.3f} s, {wall / rows / p:.2f}x plain (2 rows at a time; rounds"
        f" {rounds(lambda r: batches[r].wall / rows / med(plain[r]))})"
    )
    print(
        f"  start (join, record, push)    {med([b.announced for b in batches]):6.3f} s;"
        f" the first row started at {med([b.first_news for b in batches]):.3f} s;"
        f" rows {med([b.last_news - b.announced for b in batches]):.3f} s;"
        f" end (leave, fetch, table) {med([b.wall - b.last_news for b in batches]):.3f} s"
    )
    one = med([b.wall for b in singles])
    print(
        f"batch of 1 on Ray, whole cmd    {one:6.3f} s: {one - p:+.3f} s over a plain run"
        f" (what a batch costs once: joining, a worker's start, leaving)"
    )
    print(
        "  a new job alone, from the start of its process: "
        + ", ".join(f"{k} {med([c[k] for c in colds]):.3f} s" for k in colds[0])
    )


def throughput(world: World, nodes: TwoNodes, runs: int, reps: int, cpus: int) -> None:
    print(
        f"\n== Part 2: {runs} runs of hello, {reps} rounds, interleaved"
        f" (Ray: 2 nodes x {cpus} CPU = {2 * cpus} rows at once)"
    )
    walls: dict[str, list[float]] = {}
    plans: list[tuple[str, Callable[[], float]]] = [
        ("sequential, one process", lambda: timed(lambda: plain_runs(world, runs, push=True))),
        ("batch --ray, 2 nodes", lambda: batch(world, runs, "--ray", nodes.address).wall),
        ("batch --max-parallel 2 (no Ray)", lambda: batch(world, runs, "--max-parallel", "2").wall),
        ("batch --max-parallel 4 (no Ray)", lambda: batch(world, runs, "--max-parallel", "4").wall),
    ]
    for rep in range(reps):
        # Each round in another order, so a change in the machine's load falls on each.
        for name, plan in plans[rep % len(plans) :] + plans[: rep % len(plans)]:
            walls.setdefault(name, []).append(plan())
    sequential = walls[plans[0][0]]
    print(f"{'':<32} {'wall':>7}  {'runs/min':>8}  {'ratio':>6}   each round: runs/min (ratio)")
    for name, _ in plans:
        rates = [60 * runs / w for w in walls[name]]
        # Ratios round by round (the same load), then their median.
        ratios = [s / w for s, w in zip(sequential, walls[name], strict=True)]
        shown = ", ".join(f"{r:.1f} ({q:.2f}x)" for r, q in zip(rates, ratios, strict=True))
        print(
            f"{name:<32} {med(walls[name]):6.1f}s  {60 * runs / med(walls[name]):8.1f}"
            f"  {med(ratios):5.2f}x   {shown}"
        )


def remove(base: Path) -> None:
    """Delete the scratch directory once no `git gc --auto` that git left running in the
    background (hundreds of runs fill a repository with loose objects) writes there."""
    deadline = time.monotonic() + 120
    while any(base.glob("**/gc.pid")) and time.monotonic() < deadline:
        time.sleep(0.5)
    for _ in range(3):
        shutil.rmtree(base, ignore_errors=True)
        if not base.exists():
            return
        time.sleep(1)
    print(f"could not remove all of {base}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=8, help="rows a round in part 1")
    parser.add_argument("--runs", type=int, default=40, help="runs in part 2")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument(
        "--worker-niceness",
        type=int,
        help="RAY_worker_niceness for the nodes (Ray's default is 15, inherited by the runs)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rows, 4 runs, 1 round")
    parser.add_argument("--part", choices=("1", "2", "both"), default="both")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.runs, args.reps = 2, 4, 1
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit("needs the Ray extra: pip install -e '.[ray]'") from None
    if shutil.which("git-fabro", path=str(Path(sys.executable).parent)) is None:
        raise SystemExit(f"no git-fabro beside {sys.executable}: run it with the venv's python")
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    base = Path(tempfile.mkdtemp(prefix="fabro-bench-batch-"))
    nodes = None
    try:
        world = World(base, args.worker_niceness)
        started = time.perf_counter()
        nodes = TwoNodes(world, args.cpus_per_node)
        print(f"two nodes up in {time.perf_counter() - started:.1f} s", flush=True)
        print(f"the idle cluster uses {idle_cost():.0%} of a core", flush=True)
        if args.part in ("1", "both"):
            overhead(world, nodes, args.rows, args.reps)
        if args.part in ("2", "both"):
            throughput(world, nodes, args.runs, args.reps, args.cpus_per_node)
    finally:
        if nodes is not None:
            nodes.shutdown()
        remove(base)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
