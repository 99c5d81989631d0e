"""The run layout: sharded event segments, both layouts read back, and a run recorded
in the old flat layout still shows its log and resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import git, run_fabro, start_fabro

from fabro_git.store import runs
from fabro_git.store.repo import GitRepo
from fabro_git.store.snapshot import MetaSnapshotter


def test_segment_paths_are_sharded_by_thousands() -> None:
    assert runs.segment_path(1) == "events/000/000001.jsonl"
    assert runs.segment_path(999) == "events/000/000999.jsonl"
    assert runs.segment_path(1000) == "events/001/001000.jsonl"
    assert runs.segment_path(10_000) == "events/010/010000.jsonl"
    assert runs.segment_path(1_234_567) == "events/1234/1234567.jsonl"
    assert runs.flat_segment_path(42) == "events/000042.jsonl"
    assert runs.segment_number("000042.jsonl") == 42
    assert runs.segment_number("000") is None


def test_a_reader_walks_two_shards_and_old_flat_segments_in_order(repo: Path) -> None:
    grepo = GitRepo.discover(repo)
    files: dict[str, bytes | None] = {
        runs.flat_segment_path(1): b'{"n": 1}\n',
        runs.flat_segment_path(2): b'{"n": 2}',  # a segment without its final newline
        runs.segment_path(3): b'{"n": 3}\n',
        runs.segment_path(999): b'{"n": 999}\n',
        runs.segment_path(1000): b'{"n": 1000}\n',
        runs.segment_path(1001): b'{"n": 1001}\n',
        "events/notes.txt": b"not a segment\n",
    }
    tip = (
        MetaSnapshotter(grepo, "refs/fabro/meta/LAYOUT")
        .write(files, "init", expected_tip=None)
        .commit_sha
    )
    assert runs.list_segments(grepo, tip) == [
        "events/000001.jsonl",
        "events/000002.jsonl",
        "events/000/000003.jsonl",
        "events/000/000999.jsonl",
        "events/001/001000.jsonl",
        "events/001/001001.jsonl",
    ]
    numbers = [json.loads(line)["n"] for line in runs.read_events(grepo, tip).splitlines()]
    assert numbers == [1, 2, 3, 999, 1000, 1001]
    assert runs.read_segment(grepo, tip, 2) == b'{"n": 2}'  # the flat layout
    assert runs.read_segment(grepo, tip, 1000) == b'{"n": 1000}\n'  # the sharded one
    assert runs.read_segment(grepo, tip, 4) is None
    grepo.close()


def test_snapshot_subjects_and_trailers_read_back() -> None:
    subject = runs.snapshot_subject_checkpoint("build-it", 3)
    assert subject == "checkpoint build-it@3"
    assert runs.parse_snapshot_subject(subject) == runs.SnapshotSubject(
        "checkpoint", node_id="build-it", visit=3
    )
    assert runs.parse_snapshot_subject("init").kind == "init"
    assert runs.parse_snapshot_subject(runs.snapshot_subject_finalize("failed")).status == "failed"
    summary = runs.MetaSummary(
        "running", "wf", "a", "b", "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.000Z", 1000
    )
    from fabro_git.store.repo import parse_trailers

    assert (
        runs.MetaSummary.from_trailers(parse_trailers(f"x\n\n{summary.trailers('R')}")) == summary
    )
    message = runs.run_commit_message("R", "a", "succeeded", 2, "f" * 40)
    assert runs.is_run_commit_for(parse_trailers(message), "R", 2)
    assert not runs.is_run_commit_for(parse_trailers(message), "R", 3)


def _to_flat_layout(repo: Path, run_id: str) -> int:
    """Rewrite the run's latest snapshot the way runs were kept before sharding; returns
    the number of segments moved."""
    grepo = GitRepo.discover(repo)
    ref = runs.meta_ref(run_id)
    tip = grepo.read_ref(ref)
    assert tip is not None
    files: dict[str, bytes | None] = {}
    for path in runs.list_segments(grepo, tip):
        number = runs.segment_number(path.rsplit("/", 1)[1])
        assert number is not None and path == runs.segment_path(number)
        files[path] = None
        files[runs.flat_segment_path(number)] = grepo.read_file(tip, path)
    message = grepo.commit_info(tip).message
    MetaSnapshotter(grepo, ref).write(files, message, expected_tip=tip)
    grepo.close()
    return len(files) // 2


def test_a_run_kept_in_the_flat_layout_shows_its_log_and_resumes(
    repo: Path, tmp_path: Path
) -> None:
    hold, started = tmp_path / "hold", tmp_path / "started"
    hold.touch()
    workflow = tmp_path / "flat.fabro"
    workflow.write_text(
        "digraph Flat {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  one [shape=parallelogram, script="echo one > one.txt"]\n'
        f'  two [shape=parallelogram, script="touch {started}; while [ -e {hold} ]; do sleep 0.02; done"]\n'
        "  start -> one -> two -> exit\n}\n"
    )
    with (tmp_path / "run.err").open("wb") as err:
        proc = start_fabro(
            ["run", str(workflow)],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None, (tmp_path / "run.err").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    (meta,) = git(repo, "for-each-ref", "--format=%(refname)", "refs/fabro/meta").split()
    run_id = meta.rsplit("/", 1)[1]
    assert _to_flat_layout(repo, run_id) >= 2
    flat = git(repo, "ls-tree", "--name-only", f"{meta}:events").split()
    assert flat and all(name.endswith(".jsonl") for name in flat)

    before = run_fabro("logs", run_id, cwd=repo)
    assert before.returncode == 0, before.stderr
    assert any(json.loads(line)["event"] == "run.started" for line in before.stdout.splitlines())

    resumed = run_fabro("resume", run_id, cwd=repo, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line) for line in run_fabro("logs", run_id, cwd=repo).stdout.splitlines()]
    names = [e["event"] for e in events]
    assert names.count("run.created") == 1 and "run.completed" in names
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "an event is in the log twice"
    # The cut-off attempt of `two` is closed, read from the old layout's last segment.
    two = [e for e in events if e.get("node_id") == "two" and e["event"].startswith("stage.")]
    assert [e["event"] for e in two][:2] == ["stage.started", "stage.failed"]
    # The segments written after the resume are sharded, beside the old flat ones.
    listing = git(repo, "ls-tree", "-r", "--name-only", f"{meta}", "events/").split()
    assert any(path.count("/") == 2 for path in listing)
    assert any(path.count("/") == 1 for path in listing)


def test_a_new_segment_leaves_full_shards_untouched(repo: Path) -> None:
    grepo = GitRepo.discover(repo)
    snapshots = MetaSnapshotter(grepo, "refs/fabro/meta/SHARDS")
    first = {runs.segment_path(n): b'{"n": %d}\n' % n for n in range(1, 1001)}
    tip = snapshots.write(first, "init", expected_tip=None).commit_sha
    full = git(repo, "rev-parse", f"{tip}:events/000")
    next_tip = snapshots.write(
        {runs.segment_path(1001): b'{"n": 1001}\n'}, "checkpoint", expected_tip=tip
    ).commit_sha
    # The full shard is the same tree object; the new segment went to a shard of its own.
    assert git(repo, "rev-parse", f"{next_tip}:events/000") == full
    assert git(repo, "ls-tree", "--name-only", f"{next_tip}:events").split() == ["000", "001"]
    assert git(repo, "ls-tree", "--name-only", f"{next_tip}:events/001").split() == [
        "001000.jsonl",
        "001001.jsonl",
    ]
    grepo.close()
