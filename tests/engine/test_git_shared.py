"""Runs beside the user's own git: gc and pack-refs loops, a branch in the way, a ref
that points at nothing, stages that commit, sparse checkouts."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from conftest import assert_fsck_clean, git, run_fabro, write_workflow

STAGES = 15


def _many_stages(gate: str | None = None) -> str:
    """A straight line of STAGES command stages, each writing a file of its own; with
    `gate`, the second stage waits until that file exists."""
    lines = ["digraph Many {", "  start [shape=Mdiamond]", "  exit [shape=Msquare]"]
    previous = "start"
    for i in range(STAGES):
        script = f"mkdir -p d{i % 3} && echo {i} > d{i % 3}/f{i}.txt"
        if gate is not None and i == 1:
            script += f' && while [ ! -f \\"{gate}\\" ]; do sleep 0.02; done'
        lines.append(f'  s{i} [shape=parallelogram, script="{script}"]')
        lines.append(f"  {previous} -> s{i}")
        previous = f"s{i}"
    lines += [f"  {previous} -> exit", "}"]
    return "\n".join(lines) + "\n"


def _ps(repo: Path) -> list[dict]:
    proc = run_fabro("ps", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


# -- git gc and pack-refs beside running runs ----------------------------------------------


def test_runs_survive_gc_and_pack_refs_loops_beside_them(repo: Path, hermetic_env: Path) -> None:
    gate = hermetic_env / "gc-has-run"
    write_workflow(repo, _many_stages(gate=str(gate)))
    stop = threading.Event()
    rounds = 0

    def collect_garbage() -> None:
        nonlocal rounds
        deadline = time.monotonic() + 120
        while not stop.is_set() and rounds < 400 and time.monotonic() < deadline:
            for args in (["gc", "--quiet"], ["pack-refs", "--all"]):
                subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False)
            rounds += 1
            if rounds == 2:
                gate.write_text("")  # the runs go on only once gc is surely looping

    collector = threading.Thread(target=collect_garbage)
    collector.start()
    try:
        procs = [
            subprocess.Popen(
                ["git", "fabro", "run", "wf.fabro", "--json"],
                cwd=repo,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        outputs = [p.communicate(timeout=180) for p in procs]
    finally:
        stop.set()
        collector.join()
    assert rounds >= 2
    results = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        results.append(json.loads(out.splitlines()[-1]))
    assert all(r["status"] == "succeeded" for r in results)
    assert_fsck_clean(repo)
    base = git(repo, "rev-parse", "main").strip()
    for result in results:
        run_id = result["run_id"]
        checkpoint = json.loads(git(repo, "show", f"refs/fabro/meta/{run_id}:checkpoint.json"))
        completed = checkpoint["completed_nodes"]
        assert completed == ["start", *(f"s{i}" for i in range(STAGES)), "exit"]
        subjects = git(
            repo, "log", "--format=%s", "--reverse", f"{base}..fabro/run/{run_id}"
        ).splitlines()
        assert subjects == [f"fabro({run_id}): {node} (succeeded)" for node in completed]
        files = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
        assert {f"d{i % 3}/f{i}.txt" for i in range(STAGES)} <= set(files)


# -- a branch in the way of the run branch ---------------------------------------------------


def test_a_branch_named_fabro_is_refused_before_anything_is_made(
    repo: Path, hermetic_env: Path
) -> None:
    write_workflow(repo, _many_stages())
    for held, pack in (("fabro", False), ("fabro", True), ("fabro/run", False)):
        git(repo, "branch", held)
        if pack:
            git(repo, "pack-refs", "--all")
        refs_before = git(repo, "for-each-ref")
        proc = run_fabro("run", "wf.fabro", cwd=repo)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr and "Errno" not in proc.stderr
        assert f"git branch -m {held} <new-name>" in proc.stderr
        assert git(repo, "for-each-ref") == refs_before
        assert _ps(repo) == []
        assert not (Path(os.environ["FABRO_HOME"]) / "runs").exists() or not any(
            (Path(os.environ["FABRO_HOME"]) / "runs").iterdir()
        )
        assert not list((repo / ".git").glob("fabro/locks/*.lock"))
        git(repo, "branch", "-D", held)
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
