"""files_touched of `backend="cli"` stages, end to end, on both of its paths.

Right after a checkpoint of the main run scanned the worktree, the stage knows the
worktree without a scan (the run tip's tree) and takes its "after" from its own
checkpoint's scan; otherwise it snapshots the dirty set before and after with `git
status` (`fabro_git.store.touched`). Which path a stage took is read from git's own
trace (`GIT_TRACE`): the snapshots are the only `status --porcelain=v2` calls. Both
paths must give the same files_touched: what the agent created, edited, deleted or
committed, never what was dirty before and left alone, nor ignored files.

The agent is a small script run through `[run.agent] cli_command`, doing per node and
per attempt what the test's plan file says.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from helpers import git, meta_file, run_events, run_json, trust_project, write_workflow

AGENT = r"""
import json, os, subprocess, sys

node = sys.argv[sys.argv.index("--node") + 1]
plan = json.load(open(os.environ["TOUCH_PLAN"]))
log = plan["log"]
done = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
attempt = sum(1 for call in done if call["node"] == node)
with open(log, "a") as fh:
    fh.write(json.dumps({"node": node, "cwd": os.getcwd()}) + "\n")
steps = plan["nodes"][node]
step = steps[min(attempt, len(steps) - 1)]

def apply(step):
    for path, text in step.get("write", {}).items():
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    for path in step.get("delete", []):
        os.remove(path)
    for path in step.get("chmod_x", []):
        os.chmod(path, os.stat(path).st_mode | 0o111)
    for path in step.get("touch", []):
        os.utime(path)
    if step.get("branch"):
        subprocess.run(["git", "checkout", "-q", "-b", step["branch"]], check=True)
    if step.get("commit"):
        subprocess.run(["git", "add", "-A"], check=True)
        subprocess.run(["git", "commit", "-q", "-m", step["commit"]], check=True)

apply(step)
if step.get("then"):
    apply(step["then"])
sys.stdin.read()
print(step.get("reply", "done"))
"""

CONFIG = '[run.agent]\ncli_command = ["touchagent", "--node", "{node_id}"]\n'


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The agent on PATH, and git tracing its commands into the returned file."""
    bindir = tmp_path / "agent-bin"
    bindir.mkdir()
    launcher = bindir / "touchagent"
    launcher.write_text(f"#!{sys.executable}\n{AGENT}")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    trace = tmp_path / "git-trace.log"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    return trace


def _setup(
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nodes: dict[str, list[dict]],
    *,
    config: str = "",
) -> None:
    (repo / ".fabro").mkdir(exist_ok=True)
    (repo / ".fabro" / "project.toml").write_text(CONFIG + config)
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "a.txt").write_text("a\n")
    (repo / "b.txt").write_text("b\n")
    (repo / "sub").mkdir()
    (repo / "sub" / "c.txt").write_text("c\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    trust_project(repo)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"log": str(tmp_path / "calls.jsonl"), "nodes": nodes}))
    monkeypatch.setenv("TOUCH_PLAN", str(plan))


def _snapshots(trace: Path) -> int:
    """How many dirty-set snapshots the run took (each is one traced `git status`)."""
    if not trace.exists():
        return 0
    return sum("status --porcelain=v2" in line for line in trace.read_text().splitlines())


def _touched(repo: Path, run_id: str) -> dict[str, list[str]]:
    """files_touched by node from stage.completed, checked against status.json."""
    found: dict[str, list[str]] = {}
    for event in run_events(run_id, repo):
        if event["event"] == "stage.completed":
            found[event["node_id"]] = event["properties"]["files_touched"]
    for node, files in found.items():
        if "/" not in node:
            status = json.loads(meta_file(repo, run_id, f"nodes/{node}/status.json"))
            assert status["files_touched"] == files, node
    return found


def _run(repo: Path, graph: str) -> str:
    write_workflow(repo, graph)
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return result["run_id"]


# `prep` is a command stage: its checkpoint scans the worktree, so `work` needs no
# snapshot. Without it, `work` follows the start node, which passes on what the fresh
# checkout of the run's worktree is: the tip's tree.
WITH_PREP = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    prep [shape=parallelogram, script="echo p > prep.txt"]
    work [shape=box, backend="cli", prompt="Work"]
    start -> prep -> work -> exit
}
"""
WITHOUT_PREP = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, backend="cli", prompt="Work"]
    start -> work -> exit
}
"""
# A hook that does nothing still sends the stage to its snapshots: it could have.
IDLE_HOOK = '[[run.hooks]]\nevent = "stage_start"\nblocking = true\ncommand = "true"\n'
PATHS = pytest.mark.parametrize(
    ("graph", "config", "snapshots"),
    [(WITH_PREP, "", 0), (WITHOUT_PREP, "", 0), (WITHOUT_PREP, IDLE_HOOK, 2)],
    ids=["checkpoint", "fresh-checkout", "snapshots"],
)


@PATHS
def test_what_the_cli_created_edited_deleted_or_chmodded_counts(
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent: Path,
    graph: str,
    config: str,
    snapshots: int,
) -> None:
    step = {
        "write": {"a.txt": "a, edited\n", "new/deep/d.txt": "d\n", "debug.log": "ignored\n"},
        "delete": ["b.txt"],
        "chmod_x": ["sub/c.txt"],
        "touch": ["README.md"],  # a new mtime, the same bytes: not a change
    }
    _setup(repo, tmp_path, monkeypatch, {"work": [step]}, config=config)
    run_id = _run(repo, graph)
    assert _touched(repo, run_id)["work"] == ["a.txt", "b.txt", "new/deep/d.txt", "sub/c.txt"]
    assert _snapshots(agent) == snapshots
    branch = f"fabro/run/{run_id}"
    assert git(repo, "show", f"{branch}:new/deep/d.txt") == "d\n"
    assert "debug.log" not in git(repo, "ls-tree", "-r", "--name-only", branch).split()


@PATHS
def test_commits_the_cli_made_count_even_when_their_change_was_put_back(
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent: Path,
    graph: str,
    config: str,
    snapshots: int,
) -> None:
    step = {
        "write": {"a.txt": "committed\n", "x.txt": "x\n"},
        "commit": "agent: edit a, add x",
        # Then a.txt goes back to what it was, uncommitted, and y.txt is new.
        "then": {"write": {"a.txt": "a\n", "y.txt": "y\n"}},
    }
    _setup(repo, tmp_path, monkeypatch, {"work": [step]}, config=config)
    run_id = _run(repo, graph)
    assert _touched(repo, run_id)["work"] == ["a.txt", "x.txt", "y.txt"]
    assert _snapshots(agent) == snapshots
    branch = f"fabro/run/{run_id}"
    assert "agent: edit a, add x" in git(repo, "log", "--format=%s", branch)
    assert git(repo, "show", f"{branch}:a.txt") == "a\n"


def test_a_file_a_hook_made_before_the_stage_is_not_the_clis(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    hook = (
        '[[run.hooks]]\nevent = "stage_start"\nblocking = true\n'
        'command = "if [ \\"$FABRO_NODE_ID\\" = work ]; then echo h > hooked.txt; fi"\n'
    )
    _setup(repo, tmp_path, monkeypatch, {"work": [{"write": {"out.txt": "o\n"}}]}, config=hook)
    run_id = _run(repo, WITH_PREP)
    touched = _touched(repo, run_id)
    # The hook ran after prep's checkpoint scanned the worktree: the stage snapshots it.
    assert touched["work"] == ["out.txt"]
    assert _snapshots(agent) == 2
    assert git(repo, "show", f"fabro/run/{run_id}:hooked.txt") == "h\n"


def test_excluded_paths_count_when_the_cli_touches_them_and_only_then(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    graph = WITH_PREP.replace(
        'script="echo p > prep.txt"',
        'script="mkdir -p cache && echo o > cache/old.tmp && echo e > cache/edit.tmp"',
    )
    step = {"write": {"cache/new.tmp": "n\n", "cache/edit.tmp": "edited\n", "out.txt": "o\n"}}
    _setup(
        repo,
        tmp_path,
        monkeypatch,
        {"work": [step]},
        config='[run.checkpoint]\nexclude_globs = ["cache/**"]\n',
    )
    run_id = _run(repo, graph)
    touched = _touched(repo, run_id)
    # cache/old.tmp was dirty before the stage (no checkpoint records it) and left alone.
    assert touched["work"] == ["cache/edit.tmp", "cache/new.tmp", "out.txt"]
    assert touched["prep"] == []
    assert _snapshots(agent) == 2
    files = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{run_id}").split()
    assert "out.txt" in files and not [f for f in files if f.startswith("cache/")]


def test_the_next_cli_stage_reads_its_start_from_the_last_ones_checkpoint(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    graph = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    one [shape=box, backend="cli", prompt="One"]
    two [shape=box, backend="cli", prompt="Two"]
    start -> one -> two -> exit
}
"""
    nodes = {
        "one": [{"write": {"f.txt": "f\n", "g.txt": "g\n"}}],
        "two": [{"write": {"g.txt": "g2\n", "h.txt": "h\n"}, "delete": ["a.txt"]}],
    }
    _setup(repo, tmp_path, monkeypatch, nodes)
    run_id = _run(repo, graph)
    touched = _touched(repo, run_id)
    assert touched["one"] == ["f.txt", "g.txt"]
    # f.txt, made by `one`, is left alone by `two`.
    assert touched["two"] == ["a.txt", "g.txt", "h.txt"]
    assert _snapshots(agent) == 0
    assert git(repo, "show", f"fabro/run/{run_id}:g.txt") == "g2\n"


def test_a_retried_stage_counts_its_last_attempt_and_records_all_of_it(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    graph = WITH_PREP.replace(
        'prompt="Work"', 'prompt="Work", max_retries=1, retry_policy="standard"'
    )
    nodes = {
        "work": [
            {"write": {"first.txt": "1\n"}, "reply": 'again {"outcome": "retry"}'},
            {"write": {"second.txt": "2\n"}, "reply": 'ok {"outcome": "success"}'},
        ]
    }
    _setup(repo, tmp_path, monkeypatch, nodes)
    run_id = _run(repo, graph)
    touched = _touched(repo, run_id)
    # The second attempt found first.txt dirty and left it: only second.txt is its.
    assert touched["work"] == ["second.txt"]
    assert _snapshots(agent) == 2  # the first attempt took none, the second two
    branch = f"fabro/run/{run_id}"
    assert git(repo, "show", f"{branch}:first.txt") == "1\n"
    assert git(repo, "show", f"{branch}:second.txt") == "2\n"


def test_cli_stages_in_parallel_branches_and_child_workflows(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    graph = """\
digraph D {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    b1    [shape=box, backend="cli", prompt="B1"]
    b2    [shape=parallelogram, script="echo c > c2.txt"]
    join  [shape=tripleoctagon]
    sub   [shape=house, stack.child_workflow="flows/child.fabro"]
    after [shape=box, backend="cli", prompt="After"]
    start -> fan
    fan -> b1 -> join
    fan -> b2 -> join
    join -> sub -> after -> exit
}
"""
    child = """\
digraph Child {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    c1    [shape=parallelogram, script="echo x > child-made.txt"]
    c2    [shape=box, backend="cli", prompt="C2"]
    start -> c1 -> c2 -> exit
}
"""
    nodes = {
        "b1": [{"write": {"branch.txt": "b\n"}, "delete": ["b.txt"]}],
        "c2": [{"write": {"in-child.txt": "c\n"}}],
        "after": [{"write": {"last.txt": "l\n"}}],
    }
    _setup(repo, tmp_path, monkeypatch, nodes)
    (repo / "flows").mkdir()
    (repo / "flows" / "child.fabro").write_text(child)
    git(repo, "add", "flows")
    run_id = _run(repo, graph)
    touched = _touched(repo, run_id)
    assert touched["b1"] == ["b.txt", "branch.txt"]
    assert touched["join"] == ["b.txt", "branch.txt"]
    # child-made.txt is c1's: dirty when c2 starts, and left alone.
    assert touched["sub/c2"] == ["in-child.txt"]
    assert touched["sub"] == ["child-made.txt", "in-child.txt"]
    assert touched["after"] == ["last.txt"]
    # A branch and a child have no checkpoint of their own: b1 and c2 snapshot; `after`
    # follows the checkpoint of `sub`, which scanned the worktree.
    assert _snapshots(agent) == 4


def test_a_cli_that_switches_branches_fails_the_run_clearly(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    step = {"branch": "elsewhere", "write": {"out.txt": "o\n"}, "commit": "on another branch"}
    _setup(repo, tmp_path, monkeypatch, {"work": [step]})
    write_workflow(repo, WITH_PREP)
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "work left the run's worktree on branch elsewhere" in proc.stderr + json.dumps(result)
    assert _snapshots(agent) == 0
    # Nothing of the other branch reached the run branch.
    files = git(repo, "ls-tree", "-r", "--name-only", f"fabro/run/{result['run_id']}").split()
    assert "prep.txt" in files and "out.txt" not in files


def test_setup_commands_and_a_wait_node_send_the_stage_to_its_snapshots(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    graph = """\
digraph D {
    graph [setup="echo s > from-setup.txt"]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, backend="cli", prompt="Work"]
    pause [shape=insulator, duration="10ms"]
    more [shape=box, backend="cli", prompt="More"]
    start -> work -> pause -> more -> exit
}
"""
    nodes = {
        "work": [{"write": {"out.txt": "o\n"}}],
        "more": [{"write": {"more.txt": "m\n"}}],
    }
    _setup(repo, tmp_path, monkeypatch, nodes)
    run_id = _run(repo, graph)
    touched = _touched(repo, run_id)
    # The setup's file was dirty before `work` and left alone.
    assert touched["work"] == ["out.txt"]
    assert touched["more"] == ["more.txt"]
    # Neither stage could trust a scan: the setup ran after the checkout, and a person
    # may edit the worktree while the run waits.
    assert _snapshots(agent) == 4
    assert git(repo, "show", f"fabro/run/{run_id}:from-setup.txt") == "s\n"


def test_a_conditional_node_passes_the_checkpoint_on(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    graph = """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    prep [shape=parallelogram, script="echo p > prep.txt"]
    check [shape=diamond]
    work [shape=box, backend="cli", prompt="Work"]
    start -> prep -> check
    check -> work [condition="outcome=success"]
    check -> exit [condition="outcome!=success"]
    work -> exit
}
"""
    _setup(repo, tmp_path, monkeypatch, {"work": [{"write": {"prep.txt": "edited\n"}}]})
    run_id = _run(repo, graph)
    assert _touched(repo, run_id)["work"] == ["prep.txt"]
    assert _snapshots(agent) == 0


def test_a_hook_running_beside_the_run_sends_the_next_stage_to_its_snapshots(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Path
) -> None:
    # Non-blocking: the run goes on while it runs, so it may still be writing when the
    # stage starts. The stage must not trust the checkpoint's scan, whenever it ends.
    hook = (
        '[[run.hooks]]\nevent = "checkpoint_saved"\nblocking = false\n'
        'command = "if [ \\"$FABRO_NODE_ID\\" = prep ]; then echo h > beside.txt; fi"\n'
    )
    _setup(repo, tmp_path, monkeypatch, {"work": [{"write": {"out.txt": "o\n"}}]}, config=hook)
    run_id = _run(repo, WITH_PREP)
    assert "out.txt" in _touched(repo, run_id)["work"]
    assert _snapshots(agent) == 2
