"""How fast does `git fabro serve` pass a live run's events to its SSE clients, and what
does it weigh while it does?

A real run is started detached (its middle stage waits on a file, so it stays live and
quiet); this script then emits events into that run's live tail through the engine's own
`EventBus` and `TailFileSink`, `--rate` a second (default 1,000) for `--seconds`, while
`--clients` SSE clients (default 10, raw sockets, one thread each) follow
`/api/runs/<id>/events`. Each client notes when each event's `data:` line arrives; the
latency of an event is that moment minus the moment `emit` returned for it. It prints
the latency percentiles over every event every client saw, and the server's resident
memory (VmRSS, and its peak VmHWM) at the end.

Targets (issue 23): p95 under 100 ms, RSS under 100 MB with 10 clients.

    python benchmarks/serve_sse.py [--rate 1000] [--seconds 10] [--clients 10]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

WORKFLOW = """digraph Bench {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="while [ ! -e '%s' ]; do sleep 0.05; done"]
    start -> hold -> exit
}
"""


def sh(*args: str, cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def exe() -> list[str]:
    here = Path(sys.executable).parent / "git-fabro"
    return [str(here)] if here.exists() else [sys.executable, "-m", "fabro_git"]


class Client(threading.Thread):
    """One SSE client: the arrival time of each event id it reads."""

    def __init__(self, port: int, token: str, run_id: str, last_id: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        request = (
            f"GET /api/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nLast-Event-ID: {last_id}\r\n"
            "Connection: close\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.arrived: dict[str, float] = {}

    def run(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            now = time.monotonic()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                # Chunk-size lines of the chunked encoding are not `id:` lines.
                if line.startswith(b"id: "):
                    self.arrived[line[4:].decode().strip()] = now


def rss_kib(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="events a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()

    from fabro_git.config.locations import run_scratch_dir
    from fabro_git.events.bus import EventBus, TailFileSink
    from fabro_git.events.catalogue import RunNotice

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        repo = base / "repo"
        repo.mkdir()
        os.environ["FABRO_HOME"] = str(base / "fabro-home")
        sh("git", "init", "-q", cwd=repo)
        release = base / "release"
        (repo / "bench.fabro").write_text(WORKFLOW % release)
        sh("git", "add", "bench.fabro", cwd=repo)
        sh("git", "commit", "-qm", "bench", cwd=repo)
        run_id = sh(*exe(), "run", "bench.fabro", "-d", cwd=repo).strip()
        tail = run_scratch_dir(repo / ".git", run_id) / "events.jsonl"
        while b'"node_id":"hold"' not in (tail.read_bytes() if tail.exists() else b""):
            time.sleep(0.05)

        server = subprocess.Popen(
            [*exe(), "serve", "--port", "0"], cwd=repo, stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None
        url = urlsplit(server.stdout.readline().split(": ", 1)[1].strip())
        token = url.query.removeprefix("token=")
        last_id = json.loads(tail.read_bytes().splitlines()[-1])["id"]
        clients = [Client(url.port or 0, token, run_id, last_id) for _ in range(args.clients)]
        for client in clients:
            client.start()
        time.sleep(1.0)  # let every client be connected and caught up
        idle_rss = rss_kib(server.pid)

        bus = EventBus(run_id, [TailFileSink(tail)])
        emitted: dict[str, float] = {}
        total = int(args.rate * args.seconds)
        began = time.monotonic()
        for index in range(total):
            due = began + index / args.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            envelope = bus.emit(
                RunNotice(level="info", code="bench", message=f"event {index} of {total}")
            )
            assert envelope is not None
            emitted[str(envelope.id)] = time.monotonic()
        took = time.monotonic() - began
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(len(c.arrived) < total for c in clients):
            time.sleep(0.05)
        busy_rss, peak_rss = rss_kib(server.pid)
        bus.close()
        release.touch()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        for client in clients:
            client.sock.close()

        latencies = sorted(
            (client.arrived[event_id] - at) * 1000
            for client in clients
            for event_id, at in emitted.items()
            if event_id in client.arrived
        )
        missed = total * len(clients) - len(latencies)

        def pct(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))]

        print(
            f"{total} events in {took:.2f}s ({total / took:.0f}/s), {len(clients)} SSE clients,"
            f" {len(latencies)} deliveries, {missed} missed"
        )
        print(
            f"latency ms: p50 {pct(50):.1f}  p95 {pct(95):.1f}  p99 {pct(99):.1f}"
            f"  max {latencies[-1]:.1f}   (target p95 < 100)"
        )
        print(
            f"server RSS: {idle_rss[0] / 1024:.1f} MB with clients connected, idle;"
            f" {busy_rss / 1024:.1f} MB after the burst; peak {peak_rss / 1024:.1f} MB"
            "   (target < 100)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
