"""Does a stage cost the same at stage 1,000 as at stage 10?

A snapshot must cost O(what changed), not O(history): the event log is sharded
(`events/<NNN>/<NNNNNN>.jsonl`), unchanged `nodes/` subtrees keep their ids, and the
worktree scan follows the change. This runs whole `git fabro run`s of a linear
pipeline of N stages (default 1,000) and reads each stage's cost off the run's own
event log: the time from one `stage.started` to the next, which covers the stage, its
checkpoint (tree, meta snapshot, run-branch commit) and the walk to the next stage.
Near the end of the long run a short one starts beside it in the same repository, so
the two windows compared (stages near 10 of the short run, and the long run's stages
in the same seconds) see the same load; it prints their medians and their ratio
(target: at most 1.2x). Two workloads:

  add      each stage writes a new file (`echo i > f_i.txt`): the worktree grows with
           the run too, so the run-branch tree and the index grow, as they would for
           git doing the same commits
  rewrite  each stage rewrites one file (`echo i > out.txt`): only the run's own
           history grows (events, `nodes/`, the checkpoint)

    python benchmarks/long_run.py [--stages 1000] [--window 20] [--workload add|rewrite|both]

With `--direct`, the checkpoint cycle alone is timed instead, driving the Recorder as
the engine does (stage tree, plan, meta snapshot, run-branch commit, with a checkpoint
that grows as the engine's does) for two runs in one repository: one advanced to near
the last stage, one fresh, their stages alternating, so each pair sees the same load.
This isolates the store's share of a stage from the engine's and the stage's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from installed import fabro_exe

SCRIPTS = {"add": "echo {i} > f_{i}.txt", "rewrite": "echo {i} > out.txt"}


def workflow(stages: int, script: str = SCRIPTS["add"]) -> str:
    lines = ["digraph Long {", "  start [shape=Mdiamond]", "  exit [shape=Msquare]"]
    prev = "start"
    for i in range(stages):
        lines.append(f'  s{i} [shape=parallelogram, script="{script.format(i=i)}"]')
        lines.append(f"  {prev} -> s{i}")
        prev = f"s{i}"
    lines += [f"  {prev} -> exit", "}"]
    return "\n".join(lines) + "\n"


def _ms(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stages", type=int, default=1000)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--workload", choices=["add", "rewrite", "both"], default="both")
    parser.add_argument("--direct", action="store_true", help="time the checkpoint cycle alone")
    args = parser.parse_args()
    if args.direct:
        for workload in ("add", "rewrite") if args.workload == "both" else (args.workload,):
            measure_direct(args.stages, args.window, workload)
        return
    for workload in ("add", "rewrite") if args.workload == "both" else (args.workload,):
        measure(args.stages, args.window, workload)


def _started(exe: str, repo: Path, env: dict[str, str], run_id: str) -> dict[int, float]:
    """When each stage `s<i>` of the run started (ms), from its event log."""
    logs = subprocess.run(
        [exe, "logs", run_id], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout
    started = {}
    for line in logs.splitlines():
        event = json.loads(line)
        node = event.get("node_id") or ""
        if event["event"] == "stage.started" and node[:1] == "s" and node[1:].isdigit():
            started[int(node[1:])] = _ms(event["ts"])
    return started


def _git(repo: Path, env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def measure(stages: int, w: int, workload: str) -> None:
    """Run the long pipeline; when it nears its end, start a short one beside it in the
    same repository, so the early stages of the one and the late stages of the other
    run at the same time, under the same load (a shared machine drifts over a minute)."""
    exe = fabro_exe()
    base = Path(tempfile.mkdtemp(prefix="fabro-long-"))
    env = dict(
        os.environ,
        FABRO_HOME=str(base / "home"),
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@b",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@b",
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user runs it: with compiled bytecode
    short = w + 20
    try:
        repo = base / "repo"
        repo.mkdir()
        _git(repo, env, "init", "-q", "-b", "main")
        (repo / "README").write_text("long run\n")
        _git(repo, env, "add", "-A")
        _git(repo, env, "commit", "-q", "-m", "init")
        (base / "long.fabro").write_text(workflow(stages, SCRIPTS[workload]))
        (base / "short.fabro").write_text(workflow(short, SCRIPTS[workload]))
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        long_run = subprocess.Popen(
            [exe, "run", str(base / "long.fabro")], cwd=repo, env=env, **quiet
        )
        long_id = None
        while long_run.poll() is None:
            refs = _git(repo, env, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
            if refs:
                long_id = refs[0].rsplit("/", 1)[1]
                subject = _git(repo, env, "log", "-1", "--format=%s", refs[0]).strip()
                done = subject.removeprefix("checkpoint s").split("@")[0]
                if done.isdigit() and int(done) >= stages - short:
                    break
            time.sleep(0.1)
        subprocess.run(
            [exe, "run", str(base / "short.fabro")], cwd=repo, env=env, check=True, **quiet
        )
        if long_run.wait() != 0:
            raise SystemExit("the long run failed")
        ids = _git(
            repo, env, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta"
        ).split()
        short_id = next(i for i in ids if i != long_id)
        assert long_id is not None
        late_started = _started(exe, repo, env, long_id)
        early_started = _started(exe, repo, env, short_id)
        first = max(0, 10 - w // 2)
        begin, end = early_started[first], early_started[first + w]
        # A window's cost is its span over its stage count: the event log's timestamps
        # are whole milliseconds, so a median of single stages (7 to 9 ms each) moves in
        # steps of 12%, while a 20-stage span is read to within 0.1 ms a stage.
        e = (end - begin) / w
        inside = [i for i in range(stages) if begin <= late_started[i] <= end]
        if len(inside) < 5:  # the runs hardly overlapped: take the long run's last stages
            inside = list(range(stages - 1 - w, stages))
        lo, hi = inside[0], inside[-1]
        l_ = (late_started[hi] - late_started[lo]) / (hi - lo)
        print(f"{stages}-stage pipeline, workload {workload!r} (whole `git fabro run`)")
        print(f"  per-stage cost near stage 10:    {e:6.2f} ms (stages {first} to {first + w})")
        print(f"  per-stage cost near stage {stages}: {l_:6.2f} ms (stages {lo} to {hi},")
        print("                                    run at the same time as the ones above)")
        print(f"  ratio {l_ / e:5.2f}x (target: at most 1.2x)")
        if workload == "add":
            g10, g_end = _git_growth(base, env, stages, w)
            print(
                f"  git alone, the same files added and committed one a commit: {g10:5.2f} ms"
                f" a commit near commit 10, {g_end:5.2f} ms near commit {stages}:"
                f" {g_end / g10:5.2f}x"
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _git_growth(base: Path, env: dict[str, str], stages: int, w: int) -> tuple[float, float]:
    """git's own cost a commit near commit 10 and near commit `stages` when each commit
    adds one more file (`echo i > f_i.txt`, `git add -A`, `git commit`): what the `add`
    workload costs git as its tree and index grow. The two windows alternate, in two
    repositories (one small, one already `stages` files big), so they share the load."""
    small, big = base / "git-small", base / "git-big"
    for repo, files in ((small, 10 - w // 2), (big, stages - w)):
        repo.mkdir()
        _git(repo, env, "init", "-q", "-b", "main")
        for i in range(max(files, 0)):
            (repo / f"f_{i}.txt").write_text(f"{i}\n")
        _git(repo, env, "add", "-A")
        _git(repo, env, "commit", "-q", "--allow-empty", "-m", "init")
    times: dict[Path, float] = {small: 0.0, big: 0.0}
    next_file = {small: max(10 - w // 2, 0), big: stages - w}
    for _ in range(w):
        for repo in (small, big):
            i = next_file[repo]
            next_file[repo] += 1
            start = time.perf_counter()
            subprocess.run(["bash", "-c", f"echo {i} > f_{i}.txt"], cwd=repo, env=env, check=True)
            _git(repo, env, "add", "-A")
            _git(repo, env, "commit", "-q", "-m", "x")
            times[repo] += time.perf_counter() - start
    return times[small] / w * 1000, times[big] / w * 1000


class _DirectRun:
    """One run's checkpoint cycle, driven as the engine drives it."""

    def __init__(self, repo_path: Path, name: str, workload: str) -> None:
        from fabro_git.engine.checkpoint import Checkpoint
        from fabro_git.engine.recorder import Recorder
        from fabro_git.store import runs
        from fabro_git.store import worktree as wt
        from fabro_git.store.repo import GitRepo

        self.repo = GitRepo.discover(repo_path)
        self.workload = workload
        run_id = runs.new_ulid()
        base = self.repo.require_base().sha
        assert base is not None
        self.worktree = repo_path.parent / name
        wt.add_worktree(self.repo, self.worktree, branch=None, commit=base)
        self.repo.update_ref(runs.run_branch_ref(run_id), base, old=None, message="bench")
        wt.attach_head(self.worktree, runs.run_branch_ref(run_id))
        self.cp = Checkpoint(status="running", started_at="2026-01-01T00:00:00.000Z")
        self.events = 0
        # Events and records carry the run's id, as a real run's do: the two runs timed
        # side by side must not share their objects, or the second one writes fewer.
        self.run_id = run_id.encode()
        self.recorder = Recorder(
            self.repo,
            run_id,
            workflow_slug="long",
            emit=lambda *a, **k: None,
            take_segment=self._segment,
            worktree=self.worktree,
            exclude_globs=[],
            meta_tip=None,
            run_tip=base,
        )
        self.recorder.snapshot("init", "init", self.cp, {runs.MANIFEST: b"{}"})
        self.stage = 0

    def _segment(self) -> bytes:
        lines = []
        for _ in range(8):  # about what a command stage emits
            self.events += 1
            lines.append(
                b'{"id": "%08d", "run_id": "%s", "event": "stage.completed", "properties": {}}'
                % (self.events, self.run_id)
            )
        return b"\n".join(lines) + b"\n"

    def step(self) -> None:
        from fabro_git.store import runs

        i, self.stage = self.stage, self.stage + 1
        name = f"f_{i}.txt" if self.workload == "add" else "out.txt"
        (self.worktree / name).write_text(f"{i}\n")
        node = f"s{i}"
        cp = self.cp
        cp.current_node = node
        cp.completed_nodes.append(node)
        cp.node_visits[node] = 1
        cp.node_outcomes[node] = {"status": "succeeded", "notes": "script exited 0"}
        tree = self.recorder.stage_tree(node)
        self.recorder.plan_commit(cp, node, "succeeded", tree)
        files = {
            f"{runs.node_dir(node)}/{runs.NODE_STATUS}": b'{"status": "succeeded", "n": %d, "run": "%s"}'
            % (i, self.run_id),
            f"{runs.node_dir(node)}/script.sh": f"echo {i} > {name}\n".encode(),
        }
        self.recorder.snapshot("checkpoint", runs.snapshot_subject_checkpoint(node, 1), cp, files)
        self.recorder.commit_pending(cp)


def measure_direct(stages: int, w: int, workload: str) -> None:
    import time as clock

    base = Path(tempfile.mkdtemp(prefix="fabro-long-direct-"))
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b")
    env.update(GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")
    os.environ.update(env)
    try:
        repo = base / "repo"
        repo.mkdir()
        _git(repo, env, "init", "-q", "-b", "main")
        (repo / "README").write_text("long run\n")
        _git(repo, env, "add", "-A")
        _git(repo, env, "commit", "-q", "-m", "init")
        late_run = _DirectRun(repo, "late", workload)
        for _ in range(stages - w):
            late_run.step()
        early_run = _DirectRun(repo, "early", workload)
        for _ in range(max(0, 10 - w // 2)):
            early_run.step()
        early, late = [], []
        for _ in range(w):
            for run, samples in ((early_run, early), (late_run, late)):
                started = clock.perf_counter()
                run.step()
                samples.append((clock.perf_counter() - started) * 1000)
        e, l_ = statistics.median(early), statistics.median(late)
        print(f"checkpoint cycle alone, workload {workload!r} (Recorder driven directly)")
        print(f"  per-stage cost near stage 10:    {e:6.2f} ms (median of {w})")
        print(f"  per-stage cost near stage {stages}: {l_:6.2f} ms (median of {w}, alternating)")
        print(f"  ratio {l_ / e:5.2f}x (target: at most 1.2x)")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
