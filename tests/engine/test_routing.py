"""Routing and handler semantics through real runs: loops, gates, retries, parallel, children.

One or two runs of each through `git fabro`, for what needs the real command: its flags
and output, piped stdin, --detach, the run branch and the metadata ref. The many cases
walk in process in tests/engine/inprocess/test_routing_inprocess.py (loop restarts after
transient failures and a human gate's answers by label or key, or auto-approved, among
them), and a loop restart runs through the command in test_event_contract_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import (
    assert_fsck_clean,
    git,
    meta_file,
    run_events,
    run_fabro,
    run_json,
    write_workflow,
)


def stages(events: list[dict]) -> list[tuple[str, str]]:
    return [
        (e["node_id"], e["properties"]["status"]) for e in events if e["event"] == "stage.completed"
    ]


def test_branch_loop_example_loops_until_the_test_passes(repo: Path) -> None:
    proc, result = run_json("run", "branch-loop", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    nodes = [n for n, _ in stages(events)]
    # test fails at least once, the fix runs, and test runs again before exit
    assert nodes.count("test") >= 2
    assert "fix" in nodes
    assert nodes[-1] == "exit"


HUMAN = """
digraph H {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    approve [shape=hexagon, label="Ship it?"]
    yes [shape=parallelogram, script="echo shipped > result"]
    no [shape=parallelogram, script="echo revised > result"]
    start -> approve
    approve -> yes [label="[A] Approve"]
    approve -> no  [label="[R] Revise"]
    yes -> exit
    no -> exit
}
"""


def test_human_gate_takes_queued_answers(repo: Path) -> None:
    write_workflow(repo, HUMAN)
    proc, result = run_json("run", "wf.fabro", "--answer", "R", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "show", f"fabro/run/{result['run_id']}:result") == "revised\n"
    events = run_events(result["run_id"], repo)
    completed = next(e for e in events if e["event"] == "interview.completed")
    assert completed["properties"]["answer"] == "R"
    checkpoint = json.loads(meta_file(repo, result["run_id"], "checkpoint.json"))
    assert checkpoint["context_values"]["human.gate.selected"] == "R"
    assert checkpoint["context_values"]["human.gate.label"] == "[R] Revise"
    edge = next(
        e
        for e in events
        if e["event"] == "edge.selected" and e["properties"]["from_node"] == "approve"
    )
    assert edge["properties"]["reason"] == "preferred_label"


def test_unanswered_human_gate_fails_closed(repo: Path) -> None:
    write_workflow(repo, HUMAN)
    proc, result = run_json("run", "wf.fabro", cwd=repo, input="")
    assert proc.returncode == 1
    assert result["status"] == "failed"
    assert "was not answered; failing closed" in proc.stderr
    nodes = [n for n, _ in stages(run_events(result["run_id"], repo))]
    assert "yes" not in nodes and "no" not in nodes


def test_human_gate_reads_piped_stdin(repo: Path) -> None:
    write_workflow(repo, HUMAN)
    proc, result = run_json("run", "wf.fabro", cwd=repo, input="A\n")
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "succeeded"
    # "A" took the Approve edge: the `yes` stage ran, not `no`.
    assert git(repo, "show", f"fabro/run/{result['run_id']}:result") == "shipped\n"


def test_transient_failures_are_retried_then_allow_partial(repo: Path) -> None:
    # One retry on the short preset's backoff (0.1-0.3 s); the standard backoff's
    # seconds and more attempts are walked on a mock clock in
    # inprocess/test_routing_inprocess.py.
    write_workflow(
        repo,
        """
        digraph R {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            slow [shape=parallelogram, script="sleep 5", timeout="200ms", retry_policy="standard", max_retries=1, allow_partial=true]
            start -> slow -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == "partially_succeeded"
    events = run_events(result["run_id"], repo)
    retrying = [e["properties"] for e in events if e["event"] == "stage.retrying"]
    assert [(r["attempt"], r["max_attempts"]) for r in retrying] == [(2, 2)]
    failed = [e["properties"] for e in events if e["event"] == "stage.failed"]
    assert [f["will_retry"] for f in failed] == [True]
    assert all(f["failure_class"] == "transient_infra" for f in failed)
    assert ("slow", "partially_succeeded") in stages(events)


def test_goal_gate_sends_the_run_back(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph G {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fix [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n"]
            verify [shape=parallelogram, script="test $(cat n) -ge 2", goal_gate=true, retry_target="fix"]
            start -> fix -> verify
            verify -> exit [condition="outcome=succeeded"]
            verify -> exit [condition="outcome=failed", label="give up"]
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    nodes = [n for n, _ in stages(events)]
    assert nodes == ["start", "fix", "verify", "fix", "verify", "exit"]
    assert any(
        e["event"] == "run.notice" and e["properties"]["code"] == "goal_gate_retry" for e in events
    )


PARALLEL = """
digraph P {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    fan [shape=component, join_policy="%(policy)s", max_parallel=2]
    a [shape=parallelogram, script="%(a)s"]
    b [shape=parallelogram, script="echo b > b.txt"]
    c [shape=parallelogram, script="echo c > c.txt; exit 1"]
    merge [shape=tripleoctagon]
    after [shape=parallelogram, script="ls *.txt > seen"]
    start -> fan
    fan -> a
    fan -> b
    fan -> c
    a -> merge
    b -> merge
    c -> merge
    merge -> after -> exit
}
"""


def test_parallel_wait_all_merges_the_best_branch(repo: Path) -> None:
    write_workflow(repo, PARALLEL % {"policy": "wait_all", "a": "echo a > a.txt"})
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    completed = next(e["properties"] for e in events if e["event"] == "parallel.completed")
    assert completed["success_count"] == 2 and completed["failure_count"] == 1
    assert [r["id"] for r in completed["results"]] == ["a", "b", "c"]
    assert ("fan", "partially_succeeded") in stages(events)
    # The first successful branch (a) wins; its files reach the run branch and the
    # fan-in's commit has the branch head as its second parent.
    assert git(repo, "show", f"fabro/run/{run_id}:seen") == "a.txt\n"
    merge_commit = git(
        repo, "log", "--format=%H %P %s", f"fabro/run/{run_id}", "--grep", ": merge ("
    ).split()
    assert len(merge_commit) >= 4 and merge_commit[3].startswith(f"fabro({run_id})")
    second_parent = merge_commit[2]
    assert (
        git(repo, "log", "-1", "--format=%s", second_parent).strip()
        == f"fabro({run_id}): a (succeeded)"
    )
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["context_values"]["parallel.fan_in.best_id"] == "a"
    results = json.loads(meta_file(repo, run_id, "nodes/merge/parallel_results.json"))
    assert {r["id"]: r["status"] for r in results} == {
        "a": "succeeded",
        "b": "succeeded",
        "c": "failed",
    }
    # Each branch has its own ref, never nested under an existing ref path.
    refs = git(repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}").split()
    assert sorted(refs) == [f"refs/fabro/parallel/{run_id}/fan-1/{i}" for i in range(3)]
    assert git(repo, "worktree", "list").count("\n") == 1, "branch worktrees are removed"
    assert_fsck_clean(repo)


def test_sub_workflow_runs_child_stages(repo: Path) -> None:
    (repo / "child.fabro").write_text(
        """
        digraph Child {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            inner [shape=parallelogram, script="echo child > child.txt"]
            start -> inner -> exit
        }
        """
    )
    git(repo, "add", "child.fabro")
    write_workflow(
        repo,
        """
        digraph Parent {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            sub [shape=house, stack.child_workflow="child.fabro"]
            start -> sub -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    events = run_events(run_id, repo)
    assert (
        next(e for e in events if e["event"] == "subgraph.started")["properties"]["start_node"]
        == "start"
    )
    done = next(e for e in events if e["event"] == "subgraph.completed")["properties"]
    assert done["status"] == "succeeded" and done["steps_executed"] == 3
    assert ("sub/inner", "succeeded") in stages(events)
    assert git(repo, "show", f"fabro/run/{run_id}:child.txt") == "child\n"


def test_wait_node_and_setup_commands(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph S {
            graph [setup="echo one > setup1\\necho two > setup2"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            pause [shape=insulator, duration="150ms"]
            use [shape=parallelogram, script="cat setup1 setup2"]
            start -> pause -> use -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    events = run_events(result["run_id"], repo)
    names = [e["event"] for e in events]
    assert names.count("setup.command.completed") == 2
    assert names.index("setup.completed") < names.index("stage.started")
    pause = next(e for e in events if e["event"] == "stage.completed" and e["node_id"] == "pause")
    assert pause["properties"]["duration_ms"] >= 140
    checkpoint = json.loads(meta_file(repo, result["run_id"], "checkpoint.json"))
    assert checkpoint["context_values"]["command.output"] == "one\ntwo\n"


def test_failing_setup_fails_the_run(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph S {
            graph [setup="echo broken >&2; exit 4"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            start -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 1
    failed = next(
        e["properties"] for e in run_events(result["run_id"], repo) if e["event"] == "setup.failed"
    )
    assert failed["exit_code"] == 4 and "broken" in failed["stderr"]


def test_stall_watchdog_cancels_a_hung_stage(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph Stall {
            graph [stall_timeout="1s"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            hang [shape=parallelogram, script="sleep 30"]
            start -> hang -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo, timeout=60)
    assert proc.returncode == 1
    assert "stall watchdog" in proc.stderr
    events = run_events(result["run_id"], repo)
    timeout = next(e for e in events if e["event"] == "watchdog.timeout")
    assert timeout["properties"]["idle_seconds"] >= 1


def test_dry_run_walks_llm_stages_with_routing_directives(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph D {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            review [shape=tab, prompt="Review {{ goal }}", dry_run.response="Needs work. {\\"preferred_next_label\\": \\"fix\\", \\"context_updates\\": {\\"score\\": 40}}"]
            fix [shape=parallelogram, script="echo fixed > fixed"]
            review -> fix [label="Fix"]
            review -> exit [label="Approve"]
            start -> review
            fix -> exit
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", "--dry-run", "--goal", "the patch", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    assert git(repo, "show", f"fabro/run/{run_id}:fixed") == "fixed\n"
    prompt = meta_file(repo, run_id, "nodes/review/prompt.md")
    assert "Review the patch" in prompt
    assert "preferred_next_label" in meta_file(repo, run_id, "nodes/review/response.md")
    checkpoint = json.loads(meta_file(repo, run_id, "checkpoint.json"))
    assert checkpoint["context_values"]["score"] == 40
    assert checkpoint["context_values"]["last_stage"] == "review"


def test_detach_prints_the_id_and_the_run_finishes(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph Bg {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            work [shape=parallelogram, script="echo bg > bg.txt"]
            start -> work -> exit
        }
        """,
    )
    proc = run_fabro("run", "wf.fabro", "-d", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert len(run_id) == 26
    follow = run_fabro("logs", run_id, "-f", cwd=repo, timeout=60)
    assert '"run.completed"' in follow.stdout
    # Once `logs -f` has seen the end, the run is over for `ps` too.
    rows = [json.loads(x) for x in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()]
    assert rows[0]["status"] == "succeeded"
    assert git(repo, "show", f"fabro/run/{run_id}:bg.txt") == "bg\n"


def test_a_fan_out_visited_twice_keeps_each_visits_branch_refs(repo: Path) -> None:
    write_workflow(
        repo,
        """
        digraph Twice {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            a [shape=parallelogram, script="echo a >> a.txt"]
            b [shape=parallelogram, script="echo b >> b.txt"]
            merge [shape=tripleoctagon]
            count [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; test $((n+1)) -ge 2"]
            start -> fan
            fan -> a
            fan -> b
            a -> merge
            b -> merge
            merge -> count
            count -> exit [condition="outcome=succeeded"]
            count -> fan [condition="outcome=failed"]
        }
        """,
    )
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    run_id = result["run_id"]
    refs = git(repo, "for-each-ref", "--format=%(refname)", f"refs/fabro/parallel/{run_id}").split()
    assert sorted(refs) == sorted(
        f"refs/fabro/parallel/{run_id}/fan-{visit}/{i}" for visit in (1, 2) for i in range(2)
    )
    # Both visits' merges are on the run branch: the first visit's branch head is an
    # ancestor of the second's, so nothing that was pushed is ever rewound.
    first = git(repo, "rev-parse", f"refs/fabro/parallel/{run_id}/fan-1/0").strip()
    second = git(repo, "rev-parse", f"refs/fabro/parallel/{run_id}/fan-2/0").strip()
    git(repo, "merge-base", "--is-ancestor", first, f"fabro/run/{run_id}")
    git(repo, "merge-base", "--is-ancestor", second, f"fabro/run/{run_id}")
    assert git(repo, "show", f"fabro/run/{run_id}:a.txt") == "a\na\n"
