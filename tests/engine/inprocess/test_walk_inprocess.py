"""The walk and the handlers, in this process, on a MockClock: timeouts, retries, goal
gates and the handler interface, without git or a CLI around them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import trio
import trio.testing

from engine.inprocess.harness import NeverAnswers, walk
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import Handler, StageRequest
from fabro_git.engine.watchdog import watch_for_stall
from fabro_git.events.catalogue import AgentSessionStarted, StagePrompt
from fabro_git.handlers import handler_for


def test_a_wait_longer_than_its_timeout_is_cut_off_as_a_transient_failure(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            w     [shape=insulator, duration="1h", timeout="10s"]
            start -> w -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert walked.error == "stage w failed: wait stage w timed out after 10s"
    (failed,) = walked.props("stage.failed")
    assert failed.failure_class == "transient_infra"
    # Cut off at its timeout, not after its hour.
    assert 10 <= walked.seconds < 60


def test_a_timed_out_stage_is_retried_with_its_backoff(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            w     [shape=insulator, duration="1h", timeout="5s", max_retries=2, retry_policy="linear"]
            start -> w -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    retries = walked.props("stage.retrying")
    assert [r.attempt for r in retries] == [2, 3]
    assert all(r.delay_ms > 0 for r in retries)
    assert [s.attempt for s in walked.props("stage.started")][-3:] == [1, 2, 3]


def test_a_conditional_under_a_timeout_passes_its_outcome_through(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            check [shape=diamond, timeout="1s"]
            slow  [shape=insulator, duration="1h", timeout="2s"]
            start -> check
            check -> exit [condition="outcome=succeeded"]
            check -> slow [condition="outcome!=succeeded"]
            slow -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    assert [e.node_id for e in walked.named("stage.completed")] == ["start", "check", "exit"]


def test_a_sub_workflow_longer_than_its_timeout_is_cut_off(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            sub   [shape=house, timeout="30s", stack.child_dot_source="digraph C { s [shape=Mdiamond]; e [shape=Msquare]; w [shape=insulator, duration=\\"1h\\"]; s -> w -> e }"]
            start -> sub -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert walked.error == "stage sub failed: stack.manager_loop stage sub timed out after 30s"
    # The child's stage started under the parent's name and never completed.
    assert "sub/w" in [e.node_id for e in walked.named("stage.started")]
    assert "sub/w" not in [e.node_id for e in walked.named("stage.completed")]
    assert 30 <= walked.seconds < 60


def test_a_human_gate_that_times_out_takes_its_default(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            ask   [shape=hexagon, label="Ship?", timeout="15m", human.default_choice="hold"]
            ship  [shape=insulator, duration="1s"]
            hold  [shape=insulator, duration="2s"]
            start -> ask
            ask -> ship [label="[S] Ship"]
            ask -> hold [label="[H] Hold"]
            ship -> exit
            hold -> exit
        }
        """,
        tmp_path,
        interviewer=NeverAnswers(),
    )
    assert walked.status == "succeeded", walked.error
    assert len(walked.named("interview.timeout")) == 1
    assert [p.answer for p in walked.props("interview.completed")] == ["[H] Hold"]
    assert "hold" in [e.node_id for e in walked.named("stage.completed")]


def test_a_detached_gate_keeps_its_timeout_and_waiting_on_it_is_not_a_stall(
    tmp_path: Path,
) -> None:
    # Nobody attaches: the gate's 10 s end the wait, with its default; the watchdog would
    # stop a stage silent for 2 (it looks every half second: a short wait keeps its polls,
    # each a jump of the clock, few).
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            ask   [shape=hexagon, label="Ship?", human.timeout="10s", human.default_choice="hold"]
            hold  [shape=parallelogram, script="echo held > held.txt"]
            start -> ask
            ask -> exit [label="[S] Ship"]
            ask -> hold [label="[H] Hold"]
            hold -> exit
        }
        """,
        tmp_path,
        stall=2,
        detached=True,
    )
    assert walked.status == "succeeded", walked.error
    assert len(walked.named("interview.timeout")) == 1
    assert (walked.worktree / "held.txt").read_text() == "held\n"
    assert walked.seconds >= 10


def test_a_goal_gate_in_a_child_workflow_fails_it_like_the_run(tmp_path: Path) -> None:
    child = (
        "digraph C { s [shape=Mdiamond]; e [shape=Msquare]; "
        'g [shape=parallelogram, goal_gate=true, script=\\"exit 3\\"]; '
        's -> g; g -> e [condition=\\"outcome=failed\\"]; g -> e }'
    )
    walked = walk(
        f"""
        digraph T {{
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            sub   [shape=house, stack.child_dot_source="{child}"]
            start -> sub -> exit
        }}
        """,
        tmp_path,
    )
    assert walked.status == "failed"
    assert "goal gate unsatisfied for node sub/g and no retry target" in (walked.error or "")
    # The gate is checked before the child's exit runs, as in the run.
    assert "sub/e" not in [e.node_id for e in walked.named("stage.started")]


def test_a_goal_gate_in_a_parallel_branch_fails_the_branch(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            fan   [shape=component]
            ok    [shape=insulator, duration="1s"]
            gate  [shape=parallelogram, goal_gate=true, script="exit 3"]
            join  [shape=tripleoctagon]
            start -> fan
            fan -> ok
            fan -> gate
            ok -> join
            gate -> join [condition="outcome=failed"]
            join -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "partially_succeeded", walked.error
    statuses = {e.node_id: e.properties.status for e in walked.named("parallel.branch.completed")}
    assert statuses == {"ok": "succeeded", "gate": "failed"}
    (results,) = [
        p.context_updates
        for p in walked.props("stage.completed")
        if p.context_updates and "parallel.results" in p.context_updates
    ]
    errors = {r["id"]: r.get("error") for r in results["parallel.results"]}
    assert errors["gate"] == "goal gate unsatisfied for node gate and no retry target"


def test_a_child_workflow_walks_to_its_exit(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            sub   [shape=house, stack.child_dot_source="digraph C { s [shape=Mdiamond]; e [shape=Msquare]; s -> e }"]
            start -> sub -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    assert walked.runtime.cp.completed_nodes == ["start", "sub", "exit"]


def test_handlers_emit_through_a_stamped_interface(tmp_path: Path) -> None:
    async def announce(req: StageRequest) -> Outcome:
        req.emit(StagePrompt(text=f"hello from {req.node_id}"))
        req.emit(AgentSessionStarted(model="m"), session_id="S1")
        return Outcome.success()

    def handlers(handler_type: str) -> Handler | None:
        return announce if handler_type == "wait" else handler_for(handler_type)

    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            sub   [shape=house, stack.child_dot_source="digraph C { s [shape=Mdiamond]; e [shape=Msquare]; w [shape=insulator]; s -> w -> e }"]
            start -> sub -> exit
        }
        """,
        tmp_path,
        handlers=handlers,
    )
    assert walked.status == "succeeded", walked.error
    (prompt,) = walked.named("stage.prompt")
    assert (prompt.node_id, prompt.stage_id) == ("sub/w", "sub/w@1")
    assert prompt.properties.text == "hello from sub/w"
    (session,) = walked.named("agent.session.started")
    assert (session.node_id, session.stage_id, session.session_id) == ("sub/w", "sub/w@1", "S1")


def test_the_watchdog_stops_a_stage_that_shows_no_sign_of_life(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            w     [shape=insulator, duration="1h"]
            start -> w -> exit
        }
        """,
        tmp_path,
        stall=60,
    )
    assert walked.status == "failed"
    assert walked.error is not None and walked.error.startswith("stalled after")
    # Stopped a minute (and a poll) after the stage's last sign of life, not after its
    # hour. (Time before it is not counted: the mock clock jumps from poll to poll while
    # a checkpoint's git work runs on its thread, which counts as life.)
    started = walked.time_of("stage.started", "w")
    assert started is not None
    assert 60 <= walked.seconds - started <= 61
    assert "w" not in [e.node_id for e in walked.named("stage.completed")]


def test_the_watchdog_counts_git_in_flight_as_life() -> None:
    class Run:
        activity = 0
        store_busy = 0

    fired: list[float] = []

    async def main() -> None:
        run = Run()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_for_stall, run, 10.0, fired.append)
            await trio.sleep(5)
            run.activity += 1
            await trio.sleep(8)
            assert fired == []  # 8s idle since the last event
            run.store_busy = 1
            await trio.sleep(30)
            assert fired == []  # a long git call is not a stall
            run.store_busy = 0
            await trio.sleep(15)
        assert len(fired) == 1 and 10 <= fired[0] < 12

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_stage_records_the_process_groups_it_tells_of_while_they_live(tmp_path: Path) -> None:
    seen: dict[str, list[str]] = {}

    async def spawn(req: StageRequest) -> Outcome:
        process = subprocess.Popen(["sleep", "30"], start_new_session=True)
        try:
            req.on_process_group(process.pid, True)
            seen["running"] = sorted(p.name for p in req.process_groups.iterdir())
        finally:
            process.kill()
            process.wait()
        req.on_process_group(process.pid, False)
        seen["ended"] = sorted(p.name for p in req.process_groups.iterdir())
        return Outcome.success()

    def handlers(handler_type: str) -> Handler | None:
        return spawn if handler_type == "wait" else handler_for(handler_type)

    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            w     [shape=insulator]
            start -> w -> exit
        }
        """,
        tmp_path,
        handlers=handlers,
    )
    assert walked.status == "succeeded", walked.error
    assert len(seen["running"]) == 1 and seen["ended"] == []


def test_a_branch_whose_failure_is_routed_into_the_fan_in_failed(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            fan   [shape=component]
            bad   [shape=parallelogram, script="exit 3"]
            good  [shape=parallelogram, script="true"]
            join  [shape=tripleoctagon]
            start -> fan
            fan -> bad
            fan -> good
            bad -> join [condition="outcome=failed"]
            bad -> join
            good -> join
            join -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "partially_succeeded", walked.error
    statuses = {e.node_id: e.properties.status for e in walked.named("parallel.branch.completed")}
    assert statuses == {"bad": "failed", "good": "succeeded"}
    (join,) = [e.properties for e in walked.named("stage.completed") if e.node_id == "join"]
    assert join.context_updates["parallel.fan_in.best_id"] == "good"


def test_a_command_cut_off_by_its_timeout_keeps_its_output(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph T {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            cmd   [shape=parallelogram, script="echo begun; exec sleep 600", timeout="300ms"]
            start -> cmd -> exit
        }
        """,
        tmp_path,
        mock_clock=False,
    )
    assert walked.status == "failed"
    assert walked.error == "stage cmd failed: command timed out after 0.3s"
    (done,) = [e.properties for e in walked.named("stage.completed") if e.node_id == "cmd"]
    assert done.failure_class == "transient_infra"
    assert set(done.context_updates) == {"command.output", "command.stderr"}
    assert done.context_updates["command.output"] == "begun\n"
    assert (tmp_path / "scratch" / "output" / "stdout.log").read_text() == "begun\n"
