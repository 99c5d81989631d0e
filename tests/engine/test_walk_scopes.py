"""One walk for every scope: the run, a parallel branch and a child workflow stop,
record, gate and time out by the same rules."""

from __future__ import annotations

from pathlib import Path

from helpers import git, run_events, run_json, write_workflow

CHILD_FAN_OUT = """
digraph Child {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    a     [shape=parallelogram, script="echo a > shared.txt; sleep 0.2; test $(cat shared.txt) = a && echo a > a.txt"]
    b     [shape=parallelogram, script="echo b > shared.txt; sleep 0.2; test $(cat shared.txt) = b && echo b > b.txt"]
    join  [shape=tripleoctagon]
    start -> fan
    fan -> a
    fan -> b
    a -> join
    b -> join
    join -> exit
}
"""


def test_a_fan_out_in_a_child_workflow_gives_each_branch_its_own_worktree(repo: Path) -> None:
    write_workflow(repo, CHILD_FAN_OUT, name="child.fabro")
    write_workflow(
        repo,
        """
        digraph Parent {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            sub   [shape=house, stack.child_workflow="child.fabro"]
            start -> sub -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded", proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    branches = [e for e in events if e["event"] == "parallel.branch.completed"]
    assert sorted(e["properties"]["status"] for e in branches) == ["succeeded", "succeeded"]
    # The stages of a child's branch carry the child's prefix.
    started = {e["node_id"] for e in events if e["event"] == "stage.started"}
    assert {"sub/a", "sub/b", "sub/join"} <= started
    # The fan-in adopted the first branch: its file is on the run branch, the other's not.
    files = git(repo, "ls-tree", "--name-only", f"fabro/run/{run_id}").split()
    assert "a.txt" in files and "b.txt" not in files
    assert git(repo, "show", f"fabro/run/{run_id}:shared.txt") == "a\n"
    # Each branch committed on its own ref, under the child's node.
    refs = git(
        repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}/"
    ).split()
    assert refs == [
        f"refs/fabro/parallel/{run_id}/sub/fan-1/0",
        f"refs/fabro/parallel/{run_id}/sub/fan-1/1",
    ]
    assert git(repo, "show", f"{refs[1]}:b.txt") == "b\n"
