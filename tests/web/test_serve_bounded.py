"""`git fabro serve` reads a run as the commands do: its events a segment at a time, a big
artifact streamed from git, and a run it must refuse refused before its answer starts.

The runs are forged as a remote could forge them (see tests/cli/test_hostile_sizes.py):
120 segments that are one blob of 1 MB, a segment of zeros bigger than a segment may
be, an artifact bigger than a file read whole may be. The server's own peak memory is
read from /proc (`VmHWM`: of that process only, not the test's it was forked from).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import big_delta_segment, forge_meta_files, loose_zeros, run_fabro, run_json

from web.serving import Response, Server, request, start_server

# The forged events: 1,200 lines of 100 KB, ten to a segment of 1 MB, 120 segments.
SEGMENTS = 120
LINES_PER_SEGMENT = 10
# How much the server's peak may grow while it streams them and answers the run's pages:
# a segment and a batch of events in memory, with room to spare. Measured: 10-11 MB;
# 270 MB when each request read the run's events whole, 117 MB with batches of 200
# events whatever their size.
GROWTH_MB = 60
# Bigger than a segment or a file read whole may be (`store.blobs`: 64 MiB).
OVER_CAP = 70 << 20


@pytest.fixture
def hello_run(repo: Path) -> str:
    proc, result = run_json("run", "hello", cwd=repo)
    assert result["status"] == "succeeded", proc.stderr
    return str(result["run_id"])


@pytest.fixture
def elsewhere(repo: Path, tmp_path: Path) -> Iterator[Server]:
    """A server on the repository as a clone has it: no live tail for its runs."""
    running = start_server(repo, env={**os.environ, "FABRO_HOME": str(tmp_path / "machine-b")})
    try:
        yield running
    finally:
        running.stop()


def _blob(repo: Path, data: bytes) -> str:
    proc = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=repo, input=data, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode().strip()


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _drained(response: Response) -> tuple[int, bytes]:
    """The number of SSE messages of a stream read to its end, and its last one, read
    as they come rather than held."""
    count, last = 0, b""
    while True:
        done, sep, response.buffer = response.buffer.rpartition(b"\n\n")
        if sep:
            count += done.count(b"\n\n") + 1
            last = done.rpartition(b"\n\n")[2]
        if not response.read_more():
            assert not response.buffer, response.buffer[:300]
            return count, last


def test_a_run_of_many_big_segments_is_served_in_bounded_memory(
    repo: Path, hello_run: str, elsewhere: Server, tmp_path: Path
) -> None:
    run_id = hello_run
    recorded = run_fabro("logs", run_id, cwd=repo, env={"FABRO_HOME": str(tmp_path / "machine-b")})
    assert recorded.returncode == 0, recorded.stderr
    line, blob = big_delta_segment(repo, run_id, LINES_PER_SEGMENT)
    # After the run's own segments: its stages read as before, then 120 MB of deltas.
    forged = {f"events/000/{number:06d}.jsonl": blob for number in range(100, 100 + SEGMENTS)}
    forge_meta_files(repo, f"refs/fabro/meta/{run_id}", forged)

    pid = elsewhere.proc.pid
    assert request(elsewhere, "/api/runs").status == 200
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak, from now
    before = _status_kb(pid, "VmRSS")

    stream = request(elsewhere, f"/api/runs/{run_id}/events", stream=True)
    assert stream.status == 200
    count, last = _drained(stream)
    assert count == len(recorded.stdout.splitlines()) + SEGMENTS * LINES_PER_SEGMENT
    assert last == f"id: {json.loads(line)['id']}\ndata: {line}".encode()
    for path in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/stages"):
        response = request(elsewhere, path)
        assert response.status == 200, response.buffer
        said = json.loads(response.buffer)
        rows = said if isinstance(said, list) else said["stages"]
        assert [row["stage_id"] for row in rows] == ["start@1", "greet@1", "show@1", "exit@1"]
    response = request(elsewhere, f"/api/runs/{run_id}/stages/greet@1")
    assert response.status == 200, response.buffer
    assert json.loads(response.buffer)["status"] == "succeeded"

    grown = (_status_kb(pid, "VmHWM") - before) >> 10
    assert grown < GROWTH_MB, f"the server's peak grew by {grown} MB"


def test_a_run_with_an_over_size_segment_is_refused_before_its_stream_starts(
    repo: Path, hello_run: str, elsewhere: Server
) -> None:
    run_id = hello_run
    segment = "events/000/000002.jsonl"
    forge_meta_files(repo, f"refs/fabro/meta/{run_id}", {segment: loose_zeros(repo, OVER_CAP)})
    for path in (
        f"/api/runs/{run_id}/events",
        f"/api/runs/{run_id}",
        f"/api/runs/{run_id}/stages",
        f"/api/runs/{run_id}/stages/greet@1",
    ):
        response = request(elsewhere, path)
        assert response.status == 500, (path, response.buffer[:300])
        assert response.headers["content-type"] == "application/json", path
        said = json.loads(response.buffer)
        assert said["error"].startswith(f"run {run_id}: its {segment} "), said
        assert f"{OVER_CAP:,} bytes" in said["error"]
        assert f"git fabro rm {run_id}" in said["hint"]
    # (no traceback on the server's stderr: `stop` checks it)


def test_an_artifact_bigger_than_a_file_read_whole_is_downloaded_whole(
    repo: Path, hello_run: str, elsewhere: Server
) -> None:
    run_id = hello_run
    # Each MiB numbered: a piece sent twice, or out of order, changes the digest.
    data = b"".join(number.to_bytes(8, "big") * (1 << 17) for number in range(OVER_CAP >> 20))
    forge_meta_files(
        repo, f"refs/fabro/meta/{run_id}", {"assets/greet/retry_1/big.bin": _blob(repo, data)}
    )

    response = request(
        elsewhere, f"/api/runs/{run_id}/artifacts/greet/retry_1/big.bin", stream=True
    )
    assert response.status == 200, response.body()[:300]
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"] == 'attachment; filename="big.bin"'
    assert response.headers["content-length"] == str(len(data))
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    digest, size = hashlib.sha256(), 0
    while True:
        digest.update(response.buffer)
        size += len(response.buffer)
        response.buffer = b""
        if not response.read_more():
            break
    assert size == len(data)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


def test_every_runs_events_pass_over_a_run_that_cannot_be_read(repo: Path, hello_run: str) -> None:
    """The stream of every run's events (`/api/events`) goes on past a run refused for an
    over-size segment, as `git fabro events` does, rather than ending in a traceback:
    the runs before it, and a run that starts later, still come. (A server with the
    runs' live tails: one that has only git's events sees a run that starts later only
    as far as its first snapshot.)"""
    forged = run_json("run", "hello", cwd=repo)[1]["run_id"]
    forge_meta_files(
        repo, f"refs/fabro/meta/{forged}", {"events/000/000002.jsonl": loose_zeros(repo, OVER_CAP)}
    )
    server = start_server(repo)
    stream = request(server, "/api/events", stream=True)
    try:
        assert stream.status == 200
        while f'"run_id":"{hello_run}","event":"run.completed"'.encode() not in stream.buffer:
            assert stream.read_more(), stream.buffer[-300:]
        later = run_json("run", "hello", cwd=repo)[1]["run_id"]
        while f'"run_id":"{later}","event":"run.completed"'.encode() not in stream.buffer:
            assert stream.read_more(), stream.buffer[-300:]
        assert f'"run_id":"{forged}"'.encode() not in stream.buffer
    finally:
        stream.close()
        server.stop()  # and finds no traceback on the server's stderr
