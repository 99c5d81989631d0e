"""A fetched run whose files inflate past what a reader takes is refused unread, and a
run's events are read a segment at a time: what the read commands hold is bounded by
one file, never by what the run's objects inflate to.

The runs are forged as a remote could forge them: a blob of 200 MB of zeros is about
1 MB of zlib (written here as git writes a loose object, without making the 200 MB),
and 120 segments that are one blob of 1 MB cost git one object. Each command runs as
a process of its own, allowed far less memory than reading such a file takes.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest
from helpers import big_delta_segment, forge_meta_files, git, loose_zeros, run_json

# What the forged files inflate to: three times a file's cap (`store.blobs`).
HUGE = 200 << 20
# Far under what reading HUGE bytes takes, far over what the commands take (about 40 MB).
MEMORY_MB = 150


def _measured(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`git fabro ARGS` allowed `MEMORY_MB` of data at most (git's and the command's
    under it, each): a command that reads more than that fails with a MemoryError, a
    bug report (exit 3). The kernel's own count of a child's peak would be no use here:
    it includes the pages of the test's process, which the child is a copy of until it
    starts git."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_MB << 20, MEMORY_MB << 20))

    return subprocess.run(
        ["git", "fabro", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        preexec_fn=limited,
        check=False,
    )


def _refused(proc: subprocess.CompletedProcess[str], run_id: str, path: str) -> None:
    """One error line, naming the run, the file and its size; nothing else printed."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert f"run {run_id}" in errors[0] and path in errors[0], proc.stderr
    assert f"{HUGE:,} bytes" in errors[0], proc.stderr
    assert proc.stdout == ""


@pytest.fixture
def hello_run(repo: Path) -> str:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    return str(result["run_id"])


@pytest.mark.parametrize("packed", [False, True], ids=["loose", "packed"])
def test_an_event_segment_that_inflates_past_the_cap_is_refused_unread(
    repo: Path, hello_run: str, packed: bool
) -> None:
    run_id = hello_run
    segment = "events/000/000002.jsonl"
    sha = loose_zeros(repo, HUGE)
    forge_meta_files(repo, f"refs/fabro/meta/{run_id}", {segment: sha})
    if packed:  # judged by the pack entry's header, as a fetched run's would be
        git(repo, "repack", "-a", "-d", "-q")
        assert not (repo / ".git" / "objects" / sha[:2] / sha[2:]).exists()
    for command in (
        ["logs", run_id],
        ["logs", run_id, "--follow"],
        ["events", run_id],
        ["show", run_id, "greet"],
    ):
        proc = _measured(*command, cwd=repo)
        _refused(proc, run_id, segment)
    # Every run's events: the forged one is skipped with a warning, and hides no other.
    proc = _measured("events", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert f"warning: skipped refs/fabro/meta/{run_id}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_checkpoint_that_inflates_past_the_cap_is_refused_unread(
    repo: Path, hello_run: str, tmp_path: Path
) -> None:
    run_id = hello_run
    forge_meta_files(
        repo, f"refs/fabro/meta/{run_id}", {"checkpoint.json": loose_zeros(repo, HUGE)}
    )
    for command in (
        ["show", run_id],
        ["inspect", run_id],
        ["artifact", "list", run_id],
        ["dump", run_id, "-o", str(tmp_path / "dump")],
        ["resume", run_id],
    ):
        proc = _measured(*command, cwd=repo)
        _refused(proc, run_id, "checkpoint.json")
    assert not (tmp_path / "dump").exists()
    # The events need no checkpoint: they read as before.
    proc = _measured("logs", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert '"event":"run.completed"' in proc.stdout


def test_a_run_of_many_big_segments_is_read_a_segment_at_a_time(
    repo: Path, hello_run: str, tmp_path: Path
) -> None:
    """120 segments of 1 MB: 120 MB of events, which the reader once held twice over
    (joined, then decoded); read a segment at a time, the commands hold one."""
    run_id = hello_run
    line, blob = big_delta_segment(repo, run_id, 10)
    line += "\n"
    segments = {f"events/000/{number:06d}.jsonl": blob for number in range(1, 121)}
    forge_meta_files(repo, f"refs/fabro/meta/{run_id}", segments, drop="events")
    elsewhere = {"FABRO_HOME": str(tmp_path / "machine-b")}  # no live tail: as in a clone
    proc = _measured("logs", run_id, "-n", "1", cwd=repo, env=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == line
    for command in (["events", run_id], ["events", run_id, "--follow"]):
        proc = _measured(*command, "--filter", "event=run.*", cwd=repo, env=elsewhere)
        assert proc.returncode == 0 and proc.stdout == "", proc.stderr


def test_a_checkpoint_bigger_than_its_header_says_is_refused_unread(
    repo: Path, hello_run: str
) -> None:
    """A loose file whose header says 5 bytes and which inflates to HUGE (named by its
    true content, so nothing else gives it away): dulwich takes a loose file whole,
    whatever its header says, so it is held to its header before it is read."""
    run_id = hello_run
    sha = loose_zeros(repo, HUGE, said=5)
    forge_meta_files(repo, f"refs/fabro/meta/{run_id}", {"checkpoint.json": sha})
    proc = _measured("show", run_id, cwd=repo)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"object {sha} in " in proc.stderr and "is damaged" in proc.stderr, proc.stderr
    assert proc.stdout == ""
