"""Several live runs in one repository, and one live process per run."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from helpers import assert_fsck_clean, git, run_fabro, start_fabro, wait_until

# Every run writes the same shared files (the same blobs and trees at about the same
# moment) and one file of its own.
WORKFLOW = """\
digraph Parallel {
    graph [goal="run beside other runs"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    a [shape=parallelogram, script="mkdir -p shared && printf 'same for all\\\\n' > shared/a.txt && while [ ! -f \\"$HOME/all-started\\" ]; do sleep 0.02; done"]
    b [shape=parallelogram, script="printf '%s\\\\n' \\"$FABRO_RUN_ID\\" > who.txt && sleep 0.1"]
    c [shape=parallelogram, script="printf 'also shared\\\\n' > shared/c.txt && rm -f shared/a.txt"]
    start -> a -> b -> c -> exit
}
"""

GATED = """\
digraph Gated {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    wait_for_marker [shape=parallelogram, script="while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done; echo went > went.txt"]
    start -> wait_for_marker -> exit
}
"""


def _ps(repo: Path) -> dict[str, dict]:
    proc = run_fabro("ps", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return {row["run_id"]: row for row in map(json.loads, proc.stdout.splitlines())}


def test_four_runs_started_at_once_in_one_repository(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    workflow = tmp_path / "parallel.fabro"
    workflow.write_text(WORKFLOW)
    procs = [
        subprocess.Popen(
            ["git", "fabro", "run", str(workflow), "--json"],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    # Stage `a` holds every run until all four are inside it, so they surely overlap.
    tails = Path(os.environ["FABRO_HOME"]) / "runs"

    def all_in_a() -> bool:
        assert all(p.poll() is None for p in procs), [
            p.communicate() for p in procs if p.poll() is not None
        ]
        return sum(b'"node_id":"a"' in t.read_bytes() for t in tails.glob("*/events.jsonl")) == 4

    wait_until(all_in_a, what="the four runs all in stage a")
    (hermetic_env / "all-started").write_text("")
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        results.append(json.loads(out.splitlines()[-1]))

    ids = [r["run_id"] for r in results]
    assert len(set(ids)) == 4
    assert all(r["status"] == "succeeded" for r in results)
    metas = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    branches = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/fabro/run").split()
    assert sorted(metas) == sorted(f"refs/fabro/meta/{i}" for i in ids)
    assert sorted(branches) == sorted(f"refs/heads/fabro/run/{i}" for i in ids)

    tips = set()
    for result in results:
        run_id = result["run_id"]
        branch = f"refs/heads/fabro/run/{run_id}"
        tip = git(repo, "rev-parse", branch).strip()
        assert tip == result["final_git_commit_sha"]
        tips.add(tip)
        # Each run's own commits only: one per stage, all naming this run.
        subjects = git(repo, "log", "--reverse", "--format=%s", f"main..{branch}").splitlines()
        assert subjects == [
            f"fabro({run_id}): {n} (succeeded)" for n in ("start", "a", "b", "c", "exit")
        ]
        runs_named = set(
            git(
                repo, "log", "--format=%(trailers:key=Fabro-Run,valueonly)", f"main..{branch}"
            ).split()
        )
        assert runs_named == {run_id}
        assert git(repo, "show", f"{branch}:who.txt") == run_id + "\n"
        assert git(repo, "show", f"{branch}:shared/c.txt") == "also shared\n"
        assert "shared/a.txt" not in git(repo, "ls-tree", "-r", "--name-only", branch)
        # The meta history is this run's alone, from init to finalize.
        meta_subjects = git(repo, "log", "--format=%s", f"refs/fabro/meta/{run_id}").splitlines()
        assert meta_subjects[0] == "finalize succeeded" and meta_subjects[-1] == "init"
        assert set(
            git(
                repo,
                "log",
                "--format=%(trailers:key=Fabro-Run,valueonly)",
                f"refs/fabro/meta/{run_id}",
            ).split()
        ) == {run_id}
    assert len(tips) == 4, "two runs share a commit"

    # They really ran at the same time: every run started before any of them ended.
    starts, ends = [], []
    for run_id in ids:
        events = [
            json.loads(line) for line in run_fabro("logs", run_id, cwd=repo).stdout.splitlines()
        ]
        starts.append(next(e["ts"] for e in events if e["event"] == "run.started"))
        ends.append(next(e["ts"] for e in events if e["event"] == "run.completed"))
        assert {e["run_id"] for e in events} == {run_id}
    assert max(starts) < min(ends), (starts, ends)

    assert_fsck_clean(repo)
    rows = _ps(repo)
    assert set(rows) == set(ids)
    assert {r["status"] for r in rows.values()} == {"succeeded"}
    assert git(repo, "status", "--porcelain") == ""
    assert (
        len(
            [
                ln
                for ln in git(repo, "worktree", "list", "--porcelain").splitlines()
                if ln.startswith("worktree ")
            ]
        )
        == 1
    )
    assert list((repo / ".git" / "refs").rglob("*.lock")) == []


def _wait_for_event(
    repo: Path, run_id: str, event: str, node_id: str, proc: subprocess.Popen, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        logs = run_fabro("logs", run_id, cwd=repo)
        if any(
            e["event"] == event and e.get("node_id") == node_id
            for e in map(json.loads, logs.stdout.splitlines())
        ):
            return
        assert proc.poll() is None, (
            f"the run ended early:\n{proc.stderr.read() if proc.stderr else ''}"
        )
        assert time.monotonic() < deadline, f"no {event} for {node_id} within {timeout}s"
        time.sleep(0.1)


def _start_gated(repo: Path, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    workflow = tmp_path / "gated.fabro"
    workflow.write_text(GATED)
    proc = start_fabro(
        ["run", str(workflow)],
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metas = wait_until(
        lambda: git(
            repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/fabro/meta"
        ).split(),
        process=proc,
        limit=30,
        what="the run's meta ref",
    )
    (run_id,) = metas
    _wait_for_event(repo, run_id, "stage.started", "wait_for_marker", proc)
    return proc, run_id


def test_resume_of_a_live_run_is_refused(repo: Path, tmp_path: Path, hermetic_env: Path) -> None:
    proc, run_id = _start_gated(repo, tmp_path)
    try:
        for prefix in (run_id, run_id[:12]):
            second = run_fabro("resume", prefix, cwd=repo, timeout=30)
            assert second.returncode == 1, second.stderr
            assert "Traceback" not in second.stderr
            assert f"run {run_id} is being executed by pid {proc.pid}" in second.stderr
            assert f"git fabro logs -f {run_id}" in second.stderr
        row = _ps(repo)[run_id]
        assert row["status"] == "running"
        assert row["current_node"] == "wait_for_marker"
        inspected = json.loads(run_fabro("inspect", run_id, "--json", cwd=repo).stdout)
        assert inspected["live"] is True and inspected["status"] == "running"
    finally:
        (hermetic_env / "go").write_text("")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # The refused attempts left no trace: one run.started, one run.completed.
    events = [json.loads(line) for line in run_fabro("logs", run_id, cwd=repo).stdout.splitlines()]
    names = [e["event"] for e in events]
    assert names.count("run.started") == 1 and names.count("run.completed") == 1
    assert git(repo, "show", f"fabro/run/{run_id}:went.txt") == "went\n"
    assert _ps(repo)[run_id]["status"] == "succeeded"
    done = run_fabro("resume", run_id, cwd=repo)
    assert done.returncode == 0
    assert "already finished" in done.stderr
    assert_fsck_clean(repo)


def test_two_resumes_of_one_interrupted_run_race_and_one_wins(
    repo: Path, tmp_path: Path, hermetic_env: Path
) -> None:
    """Both start at the same moment; the flock lets exactly one execute the run."""
    proc, run_id = _start_gated(repo, tmp_path)
    proc.kill()
    proc.communicate()
    assert _ps(repo)[run_id]["status"] == "interrupted"
    resumers = [
        start_fabro(
            ["resume", run_id],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    # Hold the stage until the loser has met the lock and given up.
    wait_until(lambda: any(r.poll() is not None for r in resumers), limit=60, what="a resume's end")
    (hermetic_env / "go").write_text("")
    outcomes = []
    for r in resumers:
        _, err = r.communicate(timeout=60)
        outcomes.append((r.returncode, err))
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 1], outcomes
    loser = next(err for code, err in outcomes if code == 1)
    assert "is being executed by pid" in loser and "Traceback" not in loser
    events = [json.loads(line) for line in run_fabro("logs", run_id, cwd=repo).stdout.splitlines()]
    names = [e["event"] for e in events]
    assert names.count("run.completed") == 1
    assert len({e["id"] for e in events}) == len(events)
    assert _ps(repo)[run_id]["status"] == "succeeded"
    assert_fsck_clean(repo)
