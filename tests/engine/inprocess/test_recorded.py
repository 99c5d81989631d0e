"""An in-process walk is recorded as a run is: a real recorder checkpoints every stage
of the main walk to the meta ref of a real repository (the harness runs in place, so
there is no run branch)."""

from __future__ import annotations

from pathlib import Path

from helpers import git, read_checkpoint

from engine.inprocess.harness import walk


def test_every_stage_of_the_main_walk_is_checkpointed_to_the_meta_ref(tmp_path: Path) -> None:
    walked = walk(
        """
        digraph W {
            start [shape=Mdiamond]
            exit  [shape=Msquare]
            make  [shape=parallelogram, script="echo made > made.txt"]
            start -> make -> exit
        }
        """,
        tmp_path,
    )
    assert walked.status == "succeeded", walked.error
    meta = "refs/fabro/meta/RUN"
    subjects = git(walked.worktree, "log", "--format=%s", meta).split("\n")[:3]
    assert subjects == ["checkpoint exit@1", "checkpoint make@1", "checkpoint start@1"]
    checkpoint = read_checkpoint(walked.worktree, meta)
    assert checkpoint["completed_nodes"] == ["start", "make", "exit"]
    record = checkpoint["node_outcomes"]["make"]
    assert record["status"] == "succeeded" and record["node_id"] == "make"
    # The stage's status.json is its record, byte for byte the same JSON.
    status = git(walked.worktree, "show", f"{meta}:nodes/make/status.json")
    assert status.startswith('{\n  "status": "succeeded",')
    # checkpoint.completed names no commit: a run in place has no branch of its own.
    completed = walked.props("checkpoint.completed")
    assert len(completed) == 3 and all(p.git_commit_sha is None for p in completed)
