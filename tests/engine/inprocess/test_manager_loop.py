"""The manager loop's controls (`manager.poll_interval`, `manager.max_cycles`,
`manager.stop_condition`) on a child workflow, in this process on trio's MockClock: the
child's waits take virtual hours, so only the controls decide when the stage ends."""

from __future__ import annotations

from pathlib import Path

from engine.inprocess.harness import walk

# A child that passes a conditional at once, then waits an hour.
CHILD = (
    "digraph Kid { s [shape=Mdiamond]; e [shape=Msquare]; plan [shape=diamond]; "
    'nap [shape=insulator, duration=\\"1h\\"]; s -> plan -> nap -> e }'
)

PARENT = """
digraph Parent {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    boss  [shape=house, stack.child_dot_source="%s"%s]
    after [shape=insulator, duration="1s"]
    start -> boss
    boss -> after [condition="outcome=succeeded"]
    boss -> exit
    after -> exit
}
"""


def _walk(tmp_path: Path, attrs: str):  # type: ignore[no-untyped-def]
    return walk(PARENT % (CHILD, attrs), tmp_path)


def _boss(walked):  # type: ignore[no-untyped-def]
    [completed] = [e for e in walked.named("stage.completed") if e.node_id == "boss"]
    return completed.properties


def test_a_child_that_ends_between_polls_ends_the_stage_at_once(tmp_path: Path) -> None:
    walked = _walk(tmp_path, "")
    assert walked.status == "succeeded", walked.error
    boss = _boss(walked)
    assert boss.status == "succeeded"
    # The default poll (45s) and cycles (1,000) leave an hour's child alone.
    assert 3600 <= walked.time_of("stage.completed", "boss") < 3600 + 45  # type: ignore[operator]


def test_max_cycles_stop_the_child_after_that_many_polls(tmp_path: Path) -> None:
    walked = _walk(tmp_path, ', manager.poll_interval="10s", manager.max_cycles=3')
    boss = _boss(walked)
    assert boss.status == "failed"
    assert "3 cycles" in boss.error
    ended = walked.time_of("stage.completed", "boss")
    assert ended is not None and 30 <= ended < 31
    # The child's stage in flight ended, as a cancelled one.
    [nap] = [e for e in walked.named("stage.completed") if e.node_id == "boss/nap"]
    assert nap.properties.status == "failed"
    assert walked.status == "failed" and "manager.max_cycles" in (walked.error or "")


def test_the_stop_condition_ends_the_child_early_as_a_success(tmp_path: Path) -> None:
    walked = _walk(
        tmp_path,
        ', manager.poll_interval="1m", manager.stop_condition="context.current_node=nap"',
    )
    boss = _boss(walked)
    assert boss.status == "succeeded", boss.error
    assert "stop condition" in (boss.notes or "")
    ended = walked.time_of("stage.completed", "boss")
    assert ended is not None and 60 <= ended < 61
    assert walked.time_of("stage.started", "after") is not None
