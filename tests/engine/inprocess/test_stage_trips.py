"""A command stage's trips to a worker thread: each is a hand-off each way, which a
loaded machine makes dear, so the blocking work around a stage shares them. The
checkpoint of the stage before takes the repository guard's look before this one, with
its asset baseline; the guard's look after it takes the asset capture and, in a run
with a branch of its own, the stage's tree and files_touched; its checkpoint is the
other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from engine.inprocess.harness import walk


def _workflow(stages: int) -> str:
    nodes = "".join(
        f'    s{i} [shape=parallelogram, script="echo {i} > f{i}.txt"]\n' for i in range(stages)
    )
    chain = " -> ".join(["start", *(f"s{i}" for i in range(stages)), "exit"])
    return (
        "digraph W {\n    start [shape=Mdiamond]\n    exit [shape=Msquare]\n"
        f"{nodes}    {chain}\n}}\n"
    )


def _trips(
    tmp_path: Path, stages: int, monkeypatch: pytest.MonkeyPatch, *, run_branch: bool
) -> int:
    count = 0
    original = trio.to_thread.run_sync

    async def counted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        return await original(fn, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(trio.to_thread, "run_sync", counted)
        walked = walk(_workflow(stages), tmp_path / str(stages), run_branch=run_branch)
    assert walked.status == "succeeded", walked.error
    assert [f"f{i}.txt" for i in range(stages)] == sorted(
        p.name for p in walked.worktree.glob("f*.txt")
    )
    completed = {
        e.node_id: getattr(e.properties, "files_touched", None)
        for e in walked.events
        if e.event == "stage.completed" and e.node_id not in ("start", "exit")
    }
    # Each stage's own file, found on the guard's trip (or none, in place).
    assert completed == {f"s{i}": [f"f{i}.txt"] if run_branch else [] for i in range(stages)}
    return count


@pytest.mark.parametrize("run_branch", [False, True], ids=["in-place", "run-branch"])
def test_a_command_stage_takes_two_trips_to_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_branch: bool
) -> None:
    # The difference between three command stages and one: what a command stage costs,
    # whatever the run's start and end take.
    three = _trips(tmp_path, 3, monkeypatch, run_branch=run_branch)
    per_stage = (three - _trips(tmp_path, 1, monkeypatch, run_branch=run_branch)) / 2
    # The guard's look after (with the asset capture and the tree), the checkpoint (with
    # the next stage's look before).
    assert per_stage == 2
