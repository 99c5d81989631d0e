"""Routing semantics in this process on trio's MockClock: loops and their limits, the
circuit breaker, retries and their backoff, failure edges, retry targets, goal gates,
loop restarts, edge choice, human gates' answers and parallel outcomes. The end-to-end tests in
tests/engine/test_routing.py keep one or two runs of each through `git fabro`."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from engine.inprocess.harness import Walked, walk
from fabro_git.engine.interviewer import make_interviewer
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import Handler, StageRequest
from fabro_git.handlers import handler_for


def stages(walked: Walked) -> list[tuple[str, str]]:
    """(node, status) of each completed stage, in order."""
    return [(e.node_id or "", e.properties.status) for e in walked.named("stage.completed")]


def nodes(walked: Walked) -> list[str]:
    return [node for node, _ in stages(walked)]


def plain(props: Any) -> Any:
    """An event's properties as plain dicts and lists, as `git fabro logs` prints them."""
    return msgspec.to_builtins(props)


LOOP = """
digraph L {
    graph [loop_restart_signature_limit=20]
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n; test $((n+1)) -ge %(need)d", max_visits=%(limit)d]
    start -> work
    work -> exit [condition="outcome=succeeded"]
    work -> work [condition="outcome=failed"]
}
"""


def test_max_visits_stops_a_loop(tmp_path: Path) -> None:
    walked = walk(LOOP % {"need": 10, "limit": 3}, tmp_path)
    assert walked.status == "failed"
    assert "node work has run 3 times, its limit (max_visits=3 on the node)" in (walked.error or "")
    assert nodes(walked).count("work") == 3


def test_a_loop_within_its_visit_limit_succeeds(tmp_path: Path) -> None:
    walked = walk(LOOP % {"need": 3, "limit": 5}, tmp_path)
    assert walked.status == "succeeded", walked.error
    assert (walked.worktree / "n").read_text() == "3\n"
    assert nodes(walked).count("work") == 3


def test_the_circuit_breaker_stops_repeated_deterministic_failures(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph C {
            graph [loop_restart_signature_limit=2]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            build [shape=parallelogram, script="echo 'error at line 12' >&2; exit 1"]
            start -> build
            build -> exit [condition="outcome=succeeded"]
            build -> build [condition="outcome=failed"]
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    error = walked.error or ""
    assert "stage build failed the same way 2 times (command exited with status 1); stopping" in (
        error
    )
    assert "signature 'build|" not in error and "cycle detected" not in error


def test_transient_failures_are_retried_with_the_standard_backoff_then_allow_partial(
    tmp_path: Path,
) -> None:
    # `max_retries` without a preset keeps the standard backoff: 5 s, then 10 s, each
    # with 0.5x-1.5x jitter, waited on the walk's clock.
    walked = walk(
        """
        digraph R {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            slow [shape=insulator, duration="1h", timeout="200ms", max_retries=2, allow_partial=true]
            start -> slow -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "partially_succeeded", walked.error
    retrying = walked.props("stage.retrying")
    assert [r.attempt for r in retrying] == [2, 3]
    assert all(r.max_attempts == 3 for r in retrying)
    first, second = (r.delay_ms for r in retrying)
    assert 2500 <= first <= 7500 and 5000 <= second <= 15000
    failed = walked.props("stage.failed")
    assert [f.will_retry for f in failed] == [True, True]
    assert all(f.failure_class == "transient_infra" for f in failed)
    assert ("slow", "partially_succeeded") in stages(walked)
    # Each attempt started after its backoff had passed.
    starts = [at for e, at in zip(walked.events, walked.times, strict=True) if _started(e, "slow")]
    assert len(starts) == 3 and None not in starts
    gaps = [b - a for a, b in itertools.pairwise(starts)]  # type: ignore[operator]
    assert gaps[0] >= 0.2 + first / 1000 and gaps[1] >= 0.2 + second / 1000


def _started(env: Any, node: str) -> bool:
    return bool(env.event == "stage.started" and env.node_id == node)


def test_deterministic_failures_are_not_retried(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph R {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            bad [shape=parallelogram, script="exit 2", retry_policy="standard"]
            start -> bad -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert walked.named("stage.retrying") == []
    assert [f.will_retry for f in walked.props("stage.failed")] == [False]


def test_auto_status_and_failure_edges(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph A {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            optional [shape=parallelogram, script="exit 1", auto_status=true]
            check [shape=parallelogram, script="exit 3"]
            recover [shape=parallelogram, script="echo recovered > r"]
            start -> optional -> check
            check -> recover [condition="outcome=failed && failure_class=deterministic"]
            check -> exit
            recover -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    seen = stages(walked)
    assert ("optional", "succeeded") in seen
    assert ("check", "failed") in seen
    assert ("recover", "succeeded") in seen
    assert (walked.worktree / "r").read_text() == "recovered\n"


def test_a_failed_stage_takes_its_retry_target_not_its_unconditional_edge(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            prep [shape=parallelogram, script="touch prepared"]
            risky [shape=parallelogram, script="test -f prepared && test -f again || { touch again; exit 1; }", retry_target="prep"]
            start -> prep -> risky -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    assert nodes(walked) == ["start", "prep", "risky", "prep", "risky", "exit"]


def test_a_goal_gate_sends_the_run_back_to_its_retry_target(tmp_path: Path) -> None:
    walked = walk(
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
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    assert nodes(walked) == ["start", "fix", "verify", "fix", "verify", "exit"]
    assert [n.code for n in walked.props("run.notice")] == ["goal_gate_retry"]


def test_a_goal_gate_without_a_retry_target_fails_the_run(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph G {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            verify [shape=parallelogram, script="exit 1", goal_gate=true]
            start -> verify
            verify -> exit [condition="outcome=failed"]
            verify -> exit [condition="outcome=succeeded"]
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert "goal gate unsatisfied for node verify and no retry target" in (walked.error or "")
    # The gate is checked at the exit, before the exit stage runs.
    assert "exit" not in nodes(walked)


def test_a_loop_restart_is_blocked_for_deterministic_failures(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph LR {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            prep [shape=parallelogram, script="true"]
            a [shape=parallelogram, script="exit 1"]
            start -> prep -> a
            a -> exit [condition="outcome=succeeded"]
            a -> prep [condition="outcome=failed", loop_restart=true]
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert "loop_restart blocked: failure_class=deterministic" in (walked.error or "")
    assert walked.named("loop.restart") == []


def test_a_loop_restart_resets_visits_after_transient_failures(tmp_path: Path) -> None:
    # `gate` outlives its timeout (a transient failure) until `count` has run three
    # times; the restart resets visit counts, so `count` (max_visits=1) runs again.
    async def gate(req: StageRequest) -> Outcome:
        if int((req.worktree / "n").read_text()) < 3:
            await trio.sleep_forever()
        return Outcome.success()

    def handlers(handler_type: str) -> Handler | None:
        return gate if handler_type == "wait" else handler_for(handler_type)

    walked = walk(
        """
        digraph LR {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            count [shape=parallelogram, script="n=$(cat n 2>/dev/null || echo 0); echo $((n+1)) > n", max_visits=1]
            gate [shape=insulator, timeout="300ms"]
            start -> count -> gate
            gate -> exit [condition="outcome=succeeded"]
            gate -> count [condition="outcome=failed", loop_restart=true]
        }
        """,
        tmp_path,
        handlers=handlers,
    )
    assert walked.status == "succeeded", walked.error
    assert nodes(walked).count("count") == 3
    assert [plain(r) for r in walked.props("loop.restart")] == [
        {"from_node": "gate", "to_node": "count"}
    ] * 2
    assert [f.failure_class for f in walked.props("stage.failed")] == ["transient_infra"] * 2


def test_edge_weights_then_the_lexical_tiebreak_choose_the_edge(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph W {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            a [shape=parallelogram, script="true"]
            b [shape=parallelogram, script="echo b > which"]
            c [shape=parallelogram, script="echo c > which"]
            d [shape=parallelogram, script="echo d > which"]
            start -> a
            a -> b
            a -> d [weight=5]
            a -> c [weight=5]
            b -> exit
            c -> exit
            d -> exit
        }
        """,
        tmp_path,
    )
    # The weight beats the lexically first target (b); between equal weights the
    # lexically first (c) wins over the first written (d).
    assert walked.status == "succeeded", walked.error
    assert (walked.worktree / "which").read_text() == "c\n"
    assert nodes(walked) == ["start", "a", "c", "exit"]


def test_a_conditional_node_routes_on_the_previous_outcome_and_context(tmp_path: Path) -> None:
    source = """
        digraph Cond {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            probe [shape=parallelogram, script="echo %s"]
            gate [shape=diamond]
            high [shape=parallelogram, script="echo high > band"]
            low [shape=parallelogram, script="echo low > band"]
            start -> probe -> gate
            gate -> high [condition="outcome=succeeded && command.output >= 80"]
            gate -> low
            high -> exit
            low -> exit
        }
        """
    high = walk(source % 85, tmp_path / "high")
    assert high.status == "succeeded", high.error
    assert (high.worktree / "band").read_text() == "high\n"
    low = walk(source % 79, tmp_path / "low")
    assert (low.worktree / "band").read_text() == "low\n"


PARALLEL = """
digraph P {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    fan [shape=component, join_policy="%(policy)s", max_parallel=2]
    a [shape=parallelogram, script="%(a)s"]
    b [shape=parallelogram, script="%(b)s"]
    c [shape=parallelogram, script="echo c > c.txt; exit 1"]
    merge [shape=tripleoctagon]
    after [shape=parallelogram, script="true"]
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


def test_parallel_wait_all_counts_its_branches_and_picks_the_best(tmp_path: Path) -> None:
    walked = walk(
        PARALLEL % {"policy": "wait_all", "a": "echo a > a.txt", "b": "echo b > b.txt"}, tmp_path
    )
    assert walked.status == "partially_succeeded", walked.error
    (completed,) = walked.props("parallel.completed")
    assert (completed.success_count, completed.failure_count) == (2, 1)
    assert [r.id for r in completed.results] == ["a", "b", "c"]
    assert ("fan", "partially_succeeded") in stages(walked)
    (merge,) = [p for n, p in _completed(walked) if n == "merge"]
    assert merge.context_updates["parallel.fan_in.best_id"] == "a"


def _completed(walked: Walked) -> list[tuple[str, Any]]:
    return [(e.node_id or "", e.properties) for e in walked.named("stage.completed")]


def test_a_fan_out_whose_branches_all_failed_fails(tmp_path: Path) -> None:
    walked = walk(PARALLEL % {"policy": "first_success", "a": "exit 1", "b": "exit 1"}, tmp_path)
    assert walked.status == "failed"
    assert "every parallel branch failed" in (walked.error or "")
    assert "after" not in nodes(walked)


def test_parallel_branches_get_isolated_context(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph Iso {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            fan [shape=component]
            x [shape=parallelogram, script="echo from-x"]
            y [shape=parallelogram, script="echo from-y"]
            merge [shape=tripleoctagon]
            start -> fan
            fan -> x
            fan -> y
            x -> merge
            y -> merge
            merge -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    (completed,) = walked.props("parallel.completed")
    outputs = {r.id: r.context_updates["command.output"] for r in completed.results}
    assert outputs == {"x": "from-x\n", "y": "from-y\n"}


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


@pytest.mark.parametrize(
    ("answers", "auto_approve", "result"),
    [
        (["approve"], False, "shipped"),  # a queued answer matches a label
        (["R"], False, "revised"),  # or an accelerator key
        ([], True, "shipped"),  # auto-approval takes the first choice
    ],
    ids=["by-label", "by-key", "auto-approve"],
)
def test_a_human_gate_routes_on_its_answer(
    tmp_path: Path, answers: list[str], auto_approve: bool, result: str
) -> None:
    interviewer = make_interviewer(auto_approve=auto_approve, answers=answers, interactive=False)
    walked = walk(HUMAN, tmp_path, interviewer=interviewer)
    assert walked.status == "succeeded", walked.error
    assert (walked.worktree / "result").read_text() == f"{result}\n"
    (edge,) = [e for e in walked.props("edge.selected") if e.from_node == "approve"]
    assert edge.reason == "preferred_label"
