"""`git fabro batch --ray`: the rows run as tasks on a real Ray cluster of two nodes on
this machine (`ray.cluster_utils.Cluster`), meeting at a bare remote, and a fresh
clone's `batch status` agrees. Removing a node mid-batch still gives every run once:
Ray runs the lost tasks again and they resume from the remote's last checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from helpers import (
    bare_remote,
    events_named,
    git,
    read_checkpoint,
    run_events,
    run_fabro,
    trust_project,
    wait_until,
    write_workflow,
)
from llm_server import Held, LlmServer
from test_batch_llm_slots import FAN

ray = pytest.importorskip("ray", reason="the Ray extra: pip install '.[ray]'")

# Two stages: the second holds until $FABRO_INPUT_DIR/go exists, once it has said it
# started, so a test can cut the batch while every running row is inside it.
WORKFLOW = """\
digraph Rows {
    graph [goal="one row"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    first [shape=parallelogram, script="printf '%s\\\\n' \\"$FABRO_INPUT_N\\" > row.txt"]
    hold  [shape=parallelogram, script="touch \\"$FABRO_INPUT_DIR/started-$FABRO_INPUT_N\\"; while [ ! -f \\"$FABRO_INPUT_DIR/go\\" ]; do sleep 0.05; done"]
    start -> first -> hold -> exit
}
"""


# A node removed is seen gone after five missed health checks a second apart, not
# Ray's default of five three seconds apart (a live node that misses five on a loaded
# machine would be lost too); no idle worker is started ahead of a task (each is an
# interpreter importing Ray).
SYSTEM_CONFIG = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
}


class TwoNodes:
    """A Ray cluster of two nodes: a head that runs no task (the driver joins it, and
    the batch's coordinator lives there) and a worker of 4 CPUs. Each node's processes
    started in an environment of its own, as a real cluster's machines have theirs: its
    own home (git's identity, the user's trust store) and FABRO_HOME (its cache of the
    remote, its runs' scratch), and none of this machine's provider keys (a node's runs
    get the driver's from Ray)."""

    def __init__(self, root: Path) -> None:
        from ray.cluster_utils import Cluster

        self.environ = {
            name: self._node_environ(root / name) for name in ("head", "worker", "worker-2")
        }
        self.fabro_homes = [Path(env["FABRO_HOME"]) for env in self.environ.values()]
        with mock.patch.dict(os.environ, self.environ["head"], clear=True):
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 0,
                    "include_dashboard": False,
                    "_system_config": SYSTEM_CONFIG,
                },
            )
        self.add_worker("worker")
        self.address = self.cluster.address

    @staticmethod
    def _node_environ(home: Path) -> dict[str, str]:
        home.mkdir()
        (home / ".gitconfig").write_text(
            "[init]\n\tdefaultBranch = main\n[user]\n\tname = Node\n\temail = node@example.com\n"
        )
        environ = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("GIT_", "FABRO_", "RAY_"))
            and not name.endswith(("_API_KEY", "_BASE_URL"))
        }
        environ.update(
            HOME=str(home),
            FABRO_HOME=str(home / "fabro"),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_CACHE_HOME=str(home / ".cache"),
            XDG_DATA_HOME=str(home / ".local" / "share"),
            GIT_CONFIG_NOSYSTEM="1",
            PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        )
        return environ

    def add_worker(self, name: str) -> None:
        with mock.patch.dict(os.environ, self.environ[name], clear=True):
            self.worker = self.cluster.add_node(num_cpus=4)
            self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    # One worker runs this file (conftest's ONE_WORKER), so the suite starts one cluster,
    # not one a worker; a second start in the same session is that grouping broken.
    session = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        session = session.parent  # the workers' own directories are under the session's
    try:
        (session / "ray-cluster-started").touch(exist_ok=False)
    except FileExistsError:
        pytest.fail(
            "a second Ray cluster in one session: the tests of this file were spread over workers"
        )
    cluster = TwoNodes(tmp_path_factory.mktemp("ray-nodes"))
    try:
        yield cluster
    finally:
        cluster.shutdown()


def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _objects(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _repository(repo: Path, tmp_path: Path, *, hook: bool = False) -> Path:
    """The workflow committed in `repo`, whose `origin` is a bare remote holding it;
    with `hook`, also a project file with a hook (it acts: it needs trust)."""
    origin = bare_remote(tmp_path)
    if hook:
        (repo / ".fabro").mkdir()
        (repo / ".fabro" / "project.toml").write_text(
            '[[run.hooks]]\nevent = "run_complete"\ncommand = "true"\n'
        )
        git(repo, "add", ".fabro/project.toml")
    write_workflow(repo, WORKFLOW)  # and commits it
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    return origin


def test_a_batch_on_two_nodes_survives_losing_one_and_a_fresh_clone_agrees(
    repo: Path, tmp_path: Path, hermetic_env: Path, two_nodes: TwoNodes
) -> None:
    # A project file that acts: the resumes on the other node must trust what the
    # first starts recorded, though that node never saw those runs begin.
    origin = _repository(repo, tmp_path, hook=True)
    trust_project(repo)
    where = tmp_path / "signals"
    where.mkdir()
    rows = _rows(tmp_path / "rows.jsonl", [{"n": n, "dir": str(where)} for n in range(1, 7)])
    driver = subprocess.Popen(
        [sys.executable, "-m", "fabro_git", "batch", "wf.fabro", "--inputs", str(rows),
         "--remote", "origin", "--ray", two_nodes.address, "--label", "team=core", "--json"],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    held_by = two_nodes.worker
    try:
        record = wait_until(lambda: _record(origin), process=driver, what="the batch record")
        run_of = {row["row"]: row["run_id"] for row in record["rows"]}

        def four_held_after_first() -> bool:
            started = sorted(int(p.name.split("-")[1]) for p in where.glob("started-*"))
            if len(started) < 4:
                return False
            return all("first" in _pushed_nodes(origin, run_of[n]) for n in started)

        # Four rows run at once on the worker's four CPUs, each inside `hold`, with the
        # checkpoint after `first` on the remote.
        wait_until(four_held_after_first, process=driver, what="four rows held", limit=120)
        held = [run_of[int(p.name.split("-")[1])] for p in where.glob("started-*")]
        two_nodes.cluster.remove_node(held_by, allow_graceful=False)
        # The four runs die with their node, and a new node, which never saw them begin
        # (nor trusted their configuration), takes the batch over.
        wait_until(lambda: not _running(held), process=driver, what="the runs gone", limit=60)
        two_nodes.add_worker("worker-2")
        (where / "go").touch()
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
        if two_nodes.worker is held_by:  # cut short before the new node came
            two_nodes.add_worker("worker-2")
    assert driver.returncode == 0, err
    assert "Traceback" not in err, err
    ran = _objects(out)
    assert [o["row"] for o in ran] == [1, 2, 3, 4, 5, 6]
    assert [o["status"] for o in ran] == ["succeeded"] * 6, ran
    batch_id = ran[0]["batch_id"]
    # The runs were made on the nodes and reached the driver's clone through the remote.
    third = ran[2]["run_id"]
    assert git(repo, "show", f"fabro/run/{third}:row.txt") == "3\n"
    assert git(origin, "rev-parse", f"refs/fabro/meta/{third}") == git(
        repo, "rev-parse", f"refs/fabro/meta/{third}"
    )
    # The record's parent is what every run started from.
    head = git(repo, "rev-parse", "HEAD").strip()
    assert git(origin, "rev-parse", f"refs/fabro/batch/{batch_id}^").strip() == head
    # Nothing of a row is left on the new node but its cache of the remote (the old
    # one died with its rows' repositories: a task there after would sweep them).
    rows_dir = two_nodes.fabro_homes[2] / "batch-cache" / "rows"
    wait_until(lambda: not list(rows_dir.iterdir()), what="the rows' repositories removed")
    resumed = []
    for summary in ran:
        events = run_events(summary["run_id"], cwd=repo)
        completed = Counter(e["node_id"] for e in events_named(events, "stage.completed"))
        assert completed == {"start": 1, "first": 1, "hold": 1, "exit": 1}, (summary, completed)
        if any(
            e["properties"].get("code") == "resumed" for e in events_named(events, "run.notice")
        ):
            resumed.append(summary["row"])
    # The four rows the removed node was running were run again on the new one, from
    # the checkpoint after `first`; the two others simply started there.
    assert len(resumed) == 4, resumed

    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    env = {"FABRO_HOME": str(tmp_path / "machine-b")}
    assert run_fabro("fetch", "origin", cwd=clone, env=env).returncode == 0
    there = run_fabro("batch", "status", batch_id, "--json", cwd=clone, env=env)
    assert there.returncode == 0, there.stderr
    assert [(o["row"], o["run_id"], o["status"]) for o in _objects(there.stdout)] == [
        (o["row"], o["run_id"], o["status"]) for o in ran
    ]
    listed = run_fabro(
        "ps", "--filter", f"label=batch={batch_id}", "--filter", "label=team=core", "--json",
        cwd=clone, env=env,
    )  # fmt: skip
    assert sorted(o["run_id"] for o in _objects(listed.stdout)) == sorted(o["run_id"] for o in ran)


def _running(run_ids: list[str]) -> list[str]:
    """Those of `run_ids` whose `git fabro` process is alive on this machine."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().decode().split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if "fabro_git" in words and state != "Z":
            alive += [run_id for run_id in run_ids if run_id in words]
    return alive


def _record(origin: Path) -> dict[str, Any] | None:
    refs = git(origin, "for-each-ref", "--format=%(refname)", "refs/fabro/batch/").split()
    if not refs:
        return None
    return json.loads(git(origin, "show", f"{refs[0]}:batch.json"))


def _pushed_nodes(origin: Path, run_id: str) -> list[str]:
    """The nodes the remote's last checkpoint of the run has completed."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", f"refs/fabro/meta/{run_id}"],
        cwd=origin, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return []
    return list(read_checkpoint(origin, f"refs/fabro/meta/{run_id}").get("completed_nodes", []))


def test_ray_asks_for_a_remote_the_extra_and_a_committed_workflow(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, WORKFLOW)
    rows = _rows(tmp_path / "rows.jsonl", [{"n": 1, "dir": str(tmp_path)}])
    no_remote = run_fabro("batch", "wf.fabro", "--inputs", str(rows), "--ray", "local", cwd=repo)
    assert no_remote.returncode != 0
    assert "--ray needs --remote" in no_remote.stderr, no_remote.stderr
    bare_remote(tmp_path, origin_of=repo)
    with (repo / "wf.fabro").open("a") as changed:
        changed.write("// changed here, not in the commit the nodes would run\n")
    uncommitted = run_fabro(
        "batch", "wf.fabro", "--inputs", str(rows), "--remote", "origin", "--ray", "local",
        cwd=repo,
    )  # fmt: skip
    assert uncommitted.returncode != 0
    assert "has changes not committed" in uncommitted.stderr, uncommitted.stderr
    git(repo, "commit", "-q", "-a", "-m", "the change")
    no_address = run_fabro(
        "batch", "wf.fabro", "--inputs", str(rows), "--remote", "origin", "--ray", "auto",
        cwd=repo, env={"RAY_ADDRESS": ""},
    )  # fmt: skip
    assert no_address.returncode != 0
    assert "RAY_ADDRESS" in no_address.stderr and "not set" in no_address.stderr
    # Without the extra installed (Ray made unimportable), a clear error names it.
    without = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.modules['ray'] = None; sys.argv = ['git-fabro'] + sys.argv[1:]; "
         "from fabro_git.cli import entry; entry()",
         "batch", "wf.fabro", "--inputs", str(rows), "--remote", "origin", "--ray", "local"],
        cwd=repo, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert without.returncode != 0
    assert "pip install 'git-fabro[ray]'" in without.stderr, without.stderr
    assert "Traceback" not in without.stderr
    for proc in (no_remote, uncommitted, no_address):
        assert "Traceback" not in proc.stderr
    # None of the refused batches stored a record.
    assert git(repo, "for-each-ref", "refs/fabro/batch/") == ""


def test_the_nodes_get_the_keys_from_ray_and_share_the_llm_slots(
    repo: Path,
    tmp_path: Path,
    hermetic_env: Path,
    two_nodes: TwoNodes,
    llm_server: LlmServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "sk-ant-batch-secret-5d1e9b"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)  # the driver's; the nodes have none
    origin = bare_remote(tmp_path)
    write_workflow(repo, FAN)
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    gate = threading.Event()
    llm_server.script(*[Held(gate)] * 6)
    rows = _rows(tmp_path / "rows.jsonl", [{"n": 1}, {"n": 2}])
    driver = subprocess.Popen(
        [sys.executable, "-m", "fabro_git", "batch", "wf.fabro", "--inputs", str(rows),
         "--remote", "origin", "--ray", two_nodes.address, "--max-parallel", "2", "--json"],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def settled() -> str | None:
        if llm_server.in_flight > 2:
            return "more than two in flight"
        waiting = sum(_waiting(home) for home in two_nodes.fabro_homes)
        if llm_server.in_flight == 2 and waiting == 4:
            return "two in flight, four waiting"
        return None

    try:
        seen = wait_until(settled, process=driver, what="the six stages to settle", limit=120)
    finally:
        gate.set()
        out, err = driver.communicate(timeout=180)
    # Two rows on the cluster, six prompt stages, two LLM slots between them all.
    assert seen == "two in flight, four waiting", f"{llm_server.most_in_flight} at once"
    assert driver.returncode == 0, err
    assert [o["status"] for o in _objects(out)] == ["succeeded", "succeeded"]
    assert len(llm_server.requests) == 6 and llm_server.most_in_flight == 2
    # The key reached the runs on the nodes through Ray, and nothing in git holds it.
    sent = {r.headers.get("x-api-key") or r.headers["authorization"] for r in llm_server.requests}
    assert {key.removeprefix("Bearer ") for key in sent} == {secret}
    for where in (origin, repo):
        objects = subprocess.run(
            ["git", "cat-file", "--batch-all-objects", "--batch"],
            cwd=where, capture_output=True, check=True,
        ).stdout  # fmt: skip
        assert b"View A" in objects  # the search reads real content (the workflow's)
        assert secret.encode() not in objects


def _waiting(fabro_home: Path) -> int:
    """How many stages of the nodes' live runs have said they wait for an LLM slot."""
    count = 0
    for tail in (fabro_home / "runs").glob("*/events.jsonl"):
        for line in tail.read_bytes().split(b"\n")[:-1]:
            event = json.loads(line)
            if event["event"] == "run.notice" and event["properties"]["code"] == "llm_slot_wait":
                count += 1
    return count


# `hold` as above, then one more stage: an interrupt at `hold` leaves the run unfinished.
HOLD_THEN_MORE = WORKFLOW.replace(
    "start -> first -> hold -> exit",
    'after [shape=parallelogram, script="true"]\n    start -> first -> hold -> after -> exit',
)


def test_ctrl_c_on_the_driver_interrupts_the_runs_on_the_nodes_and_resume_finishes(
    repo: Path, tmp_path: Path, hermetic_env: Path, two_nodes: TwoNodes
) -> None:
    origin = bare_remote(tmp_path)
    write_workflow(repo, HOLD_THEN_MORE)
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    where = tmp_path / "signals"
    where.mkdir()
    rows = _rows(tmp_path / "rows.jsonl", [{"n": n, "dir": str(where)} for n in range(1, 7)])
    driver = subprocess.Popen(
        [sys.executable, "-m", "fabro_git", "batch", "wf.fabro", "--inputs", str(rows),
         "--remote", "origin", "--ray", two_nodes.address, "--json"],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: len(list(where.glob("started-*"))) == 4, process=driver, limit=120)
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, err
    cut = _objects(out)
    # The four that ran stopped at a checkpoint (their stage cut short); two never began.
    assert sorted(o["status"] for o in cut) == ["interrupted"] * 4 + ["queued"] * 2, cut
    batch_id = cut[0]["batch_id"]
    assert f"git fabro batch --resume {batch_id}" in err

    # The resumes land on a node that never saw these runs begin: each node forgets the
    # runs it trusted as they started, and only the driver's user vouches for them now.
    for environ in two_nodes.environ.values():
        shutil.rmtree(Path(environ["XDG_CONFIG_HOME"]) / "git-fabro" / "trusted-runs", True)
    (where / "go").touch()
    resumed = run_fabro(
        "batch", "--resume", batch_id, "--ray", two_nodes.address, "--json", cwd=repo, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    done = _objects(resumed.stdout)
    assert [(o["run_id"], o["status"]) for o in done] == [(o["run_id"], "succeeded") for o in cut]
    for summary in done:
        events = run_events(summary["run_id"], cwd=repo)
        completed = Counter(e["node_id"] for e in events_named(events, "stage.completed"))
        assert completed == {"start": 1, "first": 1, "hold": 1, "after": 1, "exit": 1}, completed


def test_a_project_file_the_driver_trusts_acts_on_the_nodes_and_an_untrusted_one_stops_it(
    repo: Path, tmp_path: Path, hermetic_env: Path, two_nodes: TwoNodes
) -> None:
    # A hook acts on the user's machine: it needs the user's trust, on every node too.
    _repository(repo, tmp_path, hook=True)
    where = tmp_path / "signals"
    where.mkdir()
    (where / "go").touch()
    rows = _rows(tmp_path / "rows.jsonl", [{"n": n, "dir": str(where)} for n in (1, 2)])
    batch = ("batch", "wf.fabro", "--inputs", str(rows), "--remote", "origin", "--json")
    for where_to in ([], ["--ray", two_nodes.address]):
        refused = run_fabro(*batch, *where_to, cwd=repo)
        assert refused.returncode != 0
        assert "project.toml is not trusted" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert git(repo, "for-each-ref", "refs/fabro/batch/") == ""  # nothing started

    trust_project(repo)  # here, on the driver's machine; the nodes have never seen it
    ran = run_fabro(*batch, "--ray", two_nodes.address, cwd=repo, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert [o["status"] for o in _objects(ran.stdout)] == ["succeeded", "succeeded"]


def test_a_shipped_workflow_runs_on_the_nodes_by_its_name(
    repo: Path, tmp_path: Path, hermetic_env: Path, two_nodes: TwoNodes
) -> None:
    bare_remote(tmp_path, origin_of=repo)
    rows = _rows(tmp_path / "rows.jsonl", [{"goal": "say hello"}])
    ran = run_fabro(
        "batch", "hello", "--inputs", str(rows), "--remote", "origin",
        "--ray", two_nodes.address, "--json", cwd=repo, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    [summary] = _objects(ran.stdout)
    assert summary["status"] == "succeeded"
    assert git(repo, "show", f"fabro/run/{summary['run_id']}:hello.txt").startswith("Hello")
