"""`git fabro serve` as the web tests use it: the real command in a repository, and a
plain HTTP client on raw sockets that reads its SSE streams as they come."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from helpers import start_fabro, write_workflow

# A workflow whose middle stage runs until the test creates a file: the test sees the
# stage running, then lets it finish.
WAITING_WORKFLOW = """digraph Waiting {
    graph [goal="Prepare, hold until released, then finish"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    prepare [shape=parallelogram, label="Prepare", script="echo prepared"]
    hold    [shape=parallelogram, label="Hold", script="while [ ! -e '%s' ]; do sleep 0.02; done; echo released"]
    finish  [shape=parallelogram, label="Finish", script="echo finished"]
    start -> prepare -> hold -> finish -> exit
}
"""


def start_waiting_run(repo: Path, name: str = "waiting.fabro") -> tuple[str, Path]:
    """A detached run of `WAITING_WORKFLOW`, and the file that lets its `hold` go on."""
    from helpers import run_fabro

    release = repo.parent / f"release-{name}"
    write_workflow(repo, WAITING_WORKFLOW % release, name)
    started = run_fabro("run", name, "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    return started.stdout.strip(), release


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str  # the printed address, token included
    base: str
    token: str
    port: int
    stderr: bytes = b""

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it: it ends cleanly, saying so."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _out, self.stderr = self.proc.communicate(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        text = self.stderr.decode(errors="replace")
        assert self.proc.returncode == 0, text
        assert "Traceback" not in text and "Error" not in text, text


def start_server(repo: Path, *extra: str, env: dict[str, str] | None = None) -> Server:
    proc = start_fabro(
        ["serve", "--port", "0", *extra],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("git fabro serve: http://"):
        proc.kill()
        _out, err = proc.communicate()
        raise AssertionError(f"serve did not start: {line!r}\n{err.decode(errors='replace')}")
    url = line.split(": ", 1)[1].strip()
    parts = urlsplit(url)
    # In the fragment (`#token=`), or in the query as it was once printed.
    token = dict(parse_qsl(parts.fragment or parts.query))["token"]
    return Server(proc, url, f"{parts.scheme}://{parts.netloc}", token, parts.port or 80)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    sock: socket.socket
    buffer: bytes = b""
    closed: bool = False
    raw: bytes = b""  # received, not yet dechunked

    def read_more(self, timeout: float = 60) -> bool:
        """Wait for more of the body; False once it has ended."""
        if self.closed:
            return False
        self.sock.settimeout(timeout)
        while not self.closed:
            chunk = self.sock.recv(65536) if self.sock.fileno() != -1 else b""
            if not chunk:
                self.closed = True
                self.sock.close()
                break
            if self.headers.get("transfer-encoding") != "chunked":
                self.buffer += chunk
                return True
            self.raw += chunk
            if self._dechunk():
                return True
        return self._dechunk()

    def _dechunk(self) -> bool:
        """Move the whole chunks received onto the body; whether there were any."""
        grown = False
        while True:
            size_line, sep, rest = self.raw.partition(b"\r\n")
            if not sep:
                return grown
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                self.closed = True
                self.sock.close()
                return grown
            if len(rest) < size + 2:
                return grown
            self.buffer += rest[:size]
            self.raw = rest[size + 2 :]
            grown = True

    def body(self) -> bytes:
        while self.read_more():
            pass
        return self.buffer

    def next_message(self, timeout: float = 60) -> dict[str, str] | None:
        """The next SSE message (its fields, `data` as sent), skipping comments; None at
        the end of the stream."""
        deadline = time.monotonic() + timeout
        while True:
            head, sep, rest = self.buffer.partition(b"\n\n")
            if sep:
                self.buffer = rest
                fields: dict[str, str] = {}
                for line in head.decode("utf-8").split("\n"):
                    if line.startswith(":"):
                        continue
                    name, _, value = line.partition(": ")
                    fields[name] = value
                if fields:
                    return fields
                continue
            left = deadline - time.monotonic()
            assert left > 0, f"no SSE message within {timeout}s; buffered {self.buffer[:300]!r}"
            if not self.read_more(left):
                assert not self.buffer.strip(), f"stream ended inside a message: {self.buffer!r}"
                return None

    def events(self) -> Iterator[dict[str, str]]:
        while (message := self.next_message()) is not None:
            yield message

    def close(self) -> None:
        self.sock.close()


def without_graphviz(tmp: Path) -> dict[str, str]:
    """The environment with a PATH that has git and this build but no Graphviz `dot`."""
    bindir = tmp / "no-graphviz-bin"
    bindir.mkdir(exist_ok=True)
    for tool in ("git", "sh"):
        found = shutil.which(tool)
        assert found is not None
        if not (bindir / tool).exists():
            (bindir / tool).symlink_to(found)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(bindir)])
    assert shutil.which("dot", path=env["PATH"]) is None
    return env


def request(
    server: Server,
    path: str,
    *,
    method: str = "GET",
    token: bool = True,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    stream: bool = False,
) -> Response:
    """One HTTP/1.1 request on its own connection: read whole and closed, or with
    `stream` left open to read as it comes (close it)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    headers = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1", "Connection: close"]
    if token:
        lines.append(f"Authorization: Bearer {server.token}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the headers: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    found = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    response = Response(int(status_line.split()[1]), found, sock)
    if found.get("transfer-encoding") == "chunked":
        response.raw = rest
        response._dechunk()
    else:
        response.buffer = rest
    if not stream:
        try:
            response.body()
        finally:
            response.close()
    return response


def get_json(server: Server, path: str) -> Any:
    response = request(server, path)
    assert response.status == 200, response.buffer
    return json.loads(response.buffer)
