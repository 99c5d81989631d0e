"""Runs beside the user's own git: gc and pack-refs loops, a branch in the way, a ref
that points at nothing, stages that commit, sparse checkouts."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from helpers import assert_fsck_clean, drop_object, git, read_checkpoint, run_fabro, write_workflow

from fabro_git.config.locations import run_scratch_dir

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


# -- stages that commit ------------------------------------------------------------------------

COMMITS = """\
digraph Commits {
  start [shape=Mdiamond]
  exit [shape=Msquare]
  s1 [shape=parallelogram, script="echo a > a.txt && git add a.txt && git commit -q -m \\"stage's own\\" && echo more > m.txt"]
  s2 [shape=parallelogram, script="echo b > b.txt"]
  start -> s1 -> s2 -> exit
}
"""

REWINDS = """\
digraph Rewinds {
  start [shape=Mdiamond]
  exit [shape=Msquare]
  s1 [shape=parallelogram, script="echo a > a.txt"]
  s2 [shape=parallelogram, script="git reset -q --hard HEAD~1"]
  start -> s1 -> s2 -> exit
}
"""


def _run_id(proc: subprocess.CompletedProcess[str]) -> str:
    return json.loads(proc.stdout.splitlines()[-1])["run_id"]


def _checkpoint(repo: Path, run_id: str) -> dict:
    return read_checkpoint(repo, f"refs/fabro/meta/{run_id}")


def _subjects(repo: Path, run_id: str) -> list[str]:
    return git(repo, "log", "--first-parent", "--format=%s", "main..fabro/run/" + run_id).split(
        "\n"
    )[:-1]


def test_commits_a_stage_makes_are_kept_under_its_checkpoint(repo: Path) -> None:
    write_workflow(repo, COMMITS)
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = _run_id(proc)
    assert _subjects(repo, run_id) == [
        f"fabro({run_id}): exit (succeeded)",
        f"fabro({run_id}): s2 (succeeded)",
        f"fabro({run_id}): s1 (succeeded)",
        "stage's own",
        f"fabro({run_id}): start (succeeded)",
    ]
    own = git(repo, "rev-parse", f"fabro/run/{run_id}~3").strip()
    assert git(repo, "rev-parse", f"fabro/run/{run_id}~2^").strip() == own
    assert git(repo, "ls-tree", "--name-only", own).split() == ["README.md", "a.txt", "wf.fabro"]
    files = git(repo, "ls-tree", "--name-only", f"fabro/run/{run_id}").split()
    assert {"a.txt", "m.txt", "b.txt"} <= set(files)
    assert _checkpoint(repo, run_id)["completed_nodes"] == ["start", "s1", "s2", "exit"]
    assert_fsck_clean(repo)


def test_a_stage_that_rewinds_the_run_branch_fails_clearly(repo: Path) -> None:
    write_workflow(repo, REWINDS)
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    run_id = _run_id(proc)
    assert f"refs/heads/fabro/run/{run_id} was moved during s2" in proc.stderr
    assert "git update-ref" in proc.stderr
    checkpoint = _checkpoint(repo, run_id)
    assert checkpoint["completed_nodes"] == ["start", "s1"]
    assert checkpoint["next_node_id"] == "s2"
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 1
    assert "Traceback" not in resumed.stderr
    assert "was moved while the run was stopped" in resumed.stderr


def test_a_stage_that_switches_branch_fails_and_resume_puts_head_back(
    repo: Path, hermetic_env: Path
) -> None:
    marker = hermetic_env / "switched"
    write_workflow(
        repo,
        "digraph Switch {\n"
        "  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        f'  s1 [shape=parallelogram, script="if [ ! -f {marker} ]; then touch {marker}; '
        "git checkout -q -b other && echo o > o.txt && git add o.txt && git commit -q -m other-work; "
        'fi; echo x > x.txt"]\n'
        "  start -> s1 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 1
    assert "left the run's worktree on branch other" in proc.stderr
    run_id = _run_id(proc)
    other = git(repo, "rev-parse", "other").strip()
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert git(repo, "rev-parse", "other").strip() == other
    assert git(repo, "log", "-1", "--format=%s", "other").strip() == "other-work"
    assert "x.txt" in git(repo, "ls-tree", "--name-only", f"fabro/run/{run_id}").split()
    assert _checkpoint(repo, run_id)["completed_nodes"] == ["start", "s1", "exit"]
    assert_fsck_clean(repo)


def test_kill_after_a_stages_own_commit_then_resume(repo: Path, hermetic_env: Path) -> None:
    marker = hermetic_env / "killed"
    write_workflow(
        repo,
        "digraph Killed {\n"
        "  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  s1 [shape=parallelogram, script="echo a > a.txt && git add a.txt && '
        'git commit -q -m \\"stage\'s own\\" && '
        f'if [ ! -f {marker} ]; then touch {marker}; kill -9 $PPID; exit 0; fi"]\n'
        '  s2 [shape=parallelogram, script="echo b > b.txt"]\n'
        "  start -> s1 -> s2 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", cwd=repo)
    assert proc.returncode != 0 and marker.exists()
    (run_id,) = [r["run_id"] for r in _ps(repo)]
    cut_off = git(repo, "rev-parse", f"fabro/run/{run_id}").strip()
    assert git(repo, "log", "-1", "--format=%s", cut_off).strip() == "stage's own"
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert _subjects(repo, run_id) == [
        f"fabro({run_id}): exit (succeeded)",
        f"fabro({run_id}): s2 (succeeded)",
        f"fabro({run_id}): s1 (succeeded)",
        "stage's own",
        f"fabro({run_id}): start (succeeded)",
    ]
    assert _checkpoint(repo, run_id)["completed_nodes"] == ["start", "s1", "s2", "exit"]
    assert cut_off in git(repo, "reflog", "--format=%H", f"fabro/run/{run_id}")
    assert_fsck_clean(repo)


# -- the user's sparse checkout ----------------------------------------------------------------


def test_a_sparse_checkout_in_the_users_repository_does_not_limit_the_run(repo: Path) -> None:
    (repo / "inside").mkdir()
    (repo / "inside" / "i.txt").write_text("in\n")
    (repo / "outside").mkdir()
    (repo / "outside" / "o.txt").write_text("out\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two dirs")
    write_workflow(
        repo,
        "digraph Sparse {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  s1 [shape=parallelogram, script="echo new > outside/new.txt && echo changed > outside/o.txt"]\n'
        '  s2 [shape=parallelogram, script="test -f outside/new.txt && echo seen > inside/seen.txt"]\n'
        "  start -> s1 -> s2 -> exit\n}\n",
    )
    git(repo, "sparse-checkout", "set", "inside")
    assert not (repo / "outside").exists()
    config = git(repo, "config", "--list", "--show-origin")
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = _run_id(proc)
    tip = f"fabro/run/{run_id}"
    assert git(repo, "show", f"{tip}:outside/new.txt") == "new\n"
    assert git(repo, "show", f"{tip}:outside/o.txt") == "changed\n"
    assert git(repo, "show", f"{tip}:inside/seen.txt") == "seen\n"
    # The user's checkout and settings are as they were.
    assert git(repo, "config", "--list", "--show-origin") == config
    assert not (repo / "outside").exists()
    assert git(repo, "sparse-checkout", "list").split() == ["inside"]


def test_a_tree_git_cannot_record_fails_the_run_with_gits_message(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph Unrecordable {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  s1 [shape=parallelogram, script="echo fine > fine.txt"]\n'
        '  s2 [shape=parallelogram, script="git init -q nested && echo x > x.txt"]\n'
        '  s3 [shape=parallelogram, script="echo never > never.txt"]\n'
        "  start -> s1 -> s2 -> s3 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "'nested/' does not have a commit checked out" in proc.stderr
    run_id = _run_id(proc)
    assert json.loads(proc.stdout.splitlines()[-1])["status"] == "failed"
    checkpoint = _checkpoint(repo, run_id)
    assert checkpoint["status"] == "failed"
    assert checkpoint["completed_nodes"] == ["start", "s1"]
    assert checkpoint["next_node_id"] == "s2"
    assert "does not have a commit checked out" in checkpoint["error"]
    assert _subjects(repo, run_id)[0] == f"fabro({run_id}): s1 (succeeded)"


# -- refs that lead to objects git no longer has -----------------------------------------------


def test_refs_to_missing_objects_are_named_with_the_way_back(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph Fails {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  s1 [shape=parallelogram, script="echo a > a.txt"]\n'
        '  s2 [shape=parallelogram, script="exit 3"]\n'
        "  start -> s1 -> s2 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 1
    run_id = _run_id(proc)
    branch = f"refs/heads/fabro/run/{run_id}"
    drop_object(repo, git(repo, "rev-parse", branch).strip())
    for args in (("inspect", run_id), ("resume", run_id)):
        proc = run_fabro(*args, cwd=repo)
        assert "Traceback" not in proc.stderr and "bad object" not in proc.stderr
        assert f"{branch} points at" in proc.stderr and "is missing" in proc.stderr
        assert f"git update-ref -d {branch}" in proc.stderr
    assert proc.returncode == 1  # resume

    meta = f"refs/fabro/meta/{run_id}"
    (repo / ".git" / meta).write_text("0123456789abcdef0123456789abcdef01234567\n")
    proc = run_fabro("ps", cwd=repo)
    assert proc.returncode == 0
    assert f"skipped {meta}" in proc.stderr and f"git update-ref -d {meta}" in proc.stderr
    for args in (("logs", run_id), ("inspect", run_id), ("resume", run_id)):
        proc = run_fabro(*args, cwd=repo)
        assert proc.returncode == 1, args
        assert "Traceback" not in proc.stderr and "bad object" not in proc.stderr
        assert f"{meta} points at 0123456789ab" in proc.stderr
        assert "git fabro fetch" in proc.stderr and f"git update-ref -d {meta}" in proc.stderr


def test_a_run_commit_that_fails_after_the_checkpoint_is_made_on_resume(repo: Path) -> None:
    # s2 leaves a lock on its own run branch behind, as a crashed git would: the stage
    # is recorded in the meta snapshot, and then its run commit cannot be made.
    lock = '\\"$(git rev-parse --git-common-dir)/refs/heads/fabro/run/$FABRO_RUN_ID.lock\\"'
    write_workflow(
        repo,
        "digraph Locked {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  s1 [shape=parallelogram, script="echo a > a.txt"]\n'
        f'  s2 [shape=parallelogram, script="echo b > b.txt && touch {lock}"]\n'
        '  s3 [shape=parallelogram, script="echo c > c.txt"]\n'
        "  start -> s1 -> s2 -> s3 -> exit\n}\n",
    )
    # The run waits out the lock as long as git would be told to (not its 4 s default:
    # how long it waits is shown on a fake clock, tests/store/test_store_retry.py).
    git(repo, "config", "core.filesRefLockTimeout", "100")
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 1
    assert "stayed locked by another process for 0.1s" in proc.stderr
    assert "Traceback" not in proc.stderr
    run_id = _run_id(proc)
    checkpoint = _checkpoint(repo, run_id)
    assert checkpoint["completed_nodes"] == ["start", "s1", "s2"]
    assert checkpoint["next_node_id"] == "s3"
    assert checkpoint["pending_commit"]["node_id"] == "s2"
    (repo / ".git" / "refs" / "heads" / "fabro" / "run" / f"{run_id}.lock").unlink()
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert _checkpoint(repo, run_id)["completed_nodes"] == ["start", "s1", "s2", "s3", "exit"]
    assert _subjects(repo, run_id) == [
        f"fabro({run_id}): {node} (succeeded)" for node in ("exit", "s3", "s2", "s1", "start")
    ]
    assert_fsck_clean(repo)


def test_a_branch_stage_git_cannot_record_fails_its_branch(repo: Path) -> None:
    write_workflow(
        repo,
        "digraph Fanned {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        "  fan [shape=component]\n"
        '  b1 [shape=parallelogram, script="echo b1 > b1.txt"]\n'
        '  b2 [shape=parallelogram, script="git init -q nested && echo b2 > b2.txt"]\n'
        "  join [shape=tripleoctagon]\n"
        "  start -> fan\n  fan -> b1\n  fan -> b2\n  b1 -> join\n  b2 -> join\n"
        "  join -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert "Traceback" not in proc.stderr
    run_id = _run_id(proc)
    results = json.loads(
        git(repo, "show", f"refs/fabro/meta/{run_id}:nodes/fan/parallel_results.json")
    )
    branches = {branch["id"]: branch for branch in results}
    assert branches["b2"]["status"] == "failed", branches
    assert "'nested/' does not have a commit checked out" in branches["b2"]["error"]
    assert branches["b1"]["status"] == "succeeded"
    assert _checkpoint(repo, run_id)["node_outcomes"]["fan"]["status"] == "partially_succeeded"


def test_resume_gives_a_worktree_made_sparse_its_full_tree_back(
    repo: Path, hermetic_env: Path
) -> None:
    (repo / "inside").mkdir()
    (repo / "inside" / "i.txt").write_text("in\n")
    (repo / "outside").mkdir()
    (repo / "outside" / "o.txt").write_text("out\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two dirs")
    go = hermetic_env / "go"
    write_workflow(
        repo,
        "digraph Sparse {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        f'  s1 [shape=parallelogram, script="test -f {go} && mkdir -p outside && '
        'echo changed > outside/o.txt"]\n'
        "  start -> s1 -> exit\n}\n",
    )
    proc = run_fabro("run", "wf.fabro", "--json", cwd=repo)
    assert proc.returncode == 1
    run_id = _run_id(proc)
    # The run's worktree checked out sparse, as one made before runs turned it off (and
    # kept, as a killed run keeps it: a failed run releases its own).
    worktree = run_scratch_dir(repo / ".git", run_id) / "worktree"
    git(repo, "worktree", "add", "-q", str(worktree), f"fabro/run/{run_id}")
    git(worktree, "sparse-checkout", "set", "inside")
    assert not (worktree / "outside").exists()
    go.write_text("")
    resumed = run_fabro("resume", run_id, cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    assert git(repo, "show", f"fabro/run/{run_id}:outside/o.txt") == "changed\n"
