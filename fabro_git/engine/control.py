"""A live run's control socket: `git fabro interrupt` and `git fabro steer` talk to it.

The socket is `control.sock` in the run's scratch dir, which is private (0700), and is
itself 0600; the server also checks the peer's uid (`SO_PEERCRED`) where the platform
has it. One request a connection, one JSON line each way:

    {"op": "interrupt", "actor": {...}}      -> {"ok": true}
    {"op": "steer", "text": "...", "actor": {...}} -> {"ok": true, "delivered": false}
    {"op": "answer", "id": 3, "text": "A"}  -> {"ok": true, "accepted": true}

A few requests are answered by a stream of lines instead, until the run ends or the
client hangs up: `{"op": "attach"}` is followed by one line per human gate opening or
closing (`GateUpdate`, for `git fabro attach`).

Requests are the tagged union `Request`, told apart by `op`; replies are `Reply`, whose
fields a request does not use are left out, so the lines are the ones above.

A Unix socket path is limited to about 100 bytes, and scratch paths can be longer; on
Linux the path is reached through `/proc/self/fd/<dir fd>/control.sock`, which the
kernel resolves through the open directory, so any depth works.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import msgspec
import trio

from fabro_git.engine.interviewer import Question
from fabro_git.events.envelope import Actor

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024


class GateUpdate(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of an `attach` stream: a gate opened (`question`, `id`), or the gate
    `closed`, with its `answer` and who gave it (`by`: "terminal" or "attach")."""

    question: Question | None = None
    id: int | None = None
    closed: int | None = None
    answer: str | None = None
    by: str | None = None


Send = Callable[[GateUpdate], Awaitable[None]]


class Requester(msgspec.Struct, frozen=True):
    """Who asked, as the requesting command said: a user of this machine either way."""

    login: str | None = None

    def as_actor(self) -> Actor:
        if self.login is not None:
            return Actor(kind="user", login=self.login, auth_method="local")
        return Actor(kind="user", auth_method="local")


class _Request(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", omit_defaults=True):
    actor: Requester = Requester()


class Interrupt(_Request, frozen=True, tag="interrupt"):
    """Stop the stage in flight at a checkpoint (`git fabro interrupt`)."""


class Steer(_Request, frozen=True, tag="steer"):
    """Text for the agent stages in flight (`git fabro steer`)."""

    text: str


class Answer(_Request, frozen=True, tag="answer"):
    """An answer to the open gate `id` (`git fabro attach`)."""

    id: int
    text: str


class Attach(_Request, frozen=True, tag="attach"):
    """Follow the run's gates as they open and close: answered by a stream."""


Request = Interrupt | Steer | Answer | Attach


class Reply(msgspec.Struct, frozen=True, omit_defaults=True):
    ok: bool
    error: str | None = None
    delivered: bool | None = None  # to a steer: whether an agent in flight took it
    accepted: bool | None = None  # to an answer: whether its gate was still open


_request_decoder = msgspec.json.Decoder(Request)
_reply_decoder = msgspec.json.Decoder(Reply)
_update_decoder = msgspec.json.Decoder(GateUpdate)


class Stream(msgspec.Struct, frozen=True):
    """A reply that goes on: `run(send)` sends lines until it returns, or until the
    client hangs up (it is cancelled then)."""

    run: Callable[[Send], Awaitable[None]]


Handle = Callable[[Request], Awaitable[Reply | Stream]]


def socket_path(scratch: Path) -> Path:
    return scratch / SOCKET_NAME


@contextlib.contextmanager
def _short_path(path: Path) -> Iterator[str]:
    """A name for `path` short enough for a Unix socket address."""
    if len(os.fsencode(str(path))) < 100 or not sys.platform.startswith("linux"):
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _same_user(sock: trio.socket.SocketType) -> bool:
    if not hasattr(socket, "SO_PEERCRED"):
        return True  # the 0700 directory and 0600 socket are the guard there
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


async def serve(
    scratch: Path, handle: Handle, *, task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED
) -> None:
    """Answer control requests until cancelled; the socket file goes with the server."""
    path = socket_path(scratch)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a run that was killed
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        with _short_path(path) as address:
            await listener.bind(address)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    listener.listen(8)
    task_status.started(path)
    try:
        async with trio.open_nursery() as nursery:
            while True:
                conn, _ = await listener.accept()
                nursery.start_soon(_answer, conn, handle)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def _answer(conn: trio.socket.SocketType, handle: Handle) -> None:
    with conn:
        if not _same_user(conn):
            return
        data = b""
        with trio.move_on_after(5):
            while b"\n" not in data and len(data) < MAX_REQUEST:
                chunk = await conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        line = data.split(b"\n", 1)[0]
        reply: Reply | Stream
        try:
            request = _request_decoder.decode(line)
        except msgspec.ValidationError:
            reply = Reply(ok=False, error=f"unknown request {_op_of(line)!r}")
        except (msgspec.DecodeError, RecursionError):  # nested past any request's depth
            reply = Reply(ok=False, error="not a control request")
        else:
            reply = await handle(request)
        if isinstance(reply, Stream):
            await _stream(conn, reply)
            return
        with contextlib.suppress(OSError):
            await _send_bytes(conn, msgspec.json.encode(reply))


def _op_of(line: bytes) -> object:
    """The `op` of a request that is no `Request`, for the error."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value.get("op") if isinstance(value, dict) else None


async def _send_bytes(conn: trio.socket.SocketType, line: bytes) -> None:
    out = line + b"\n"
    while out:
        out = out[await conn.send(out) :]


async def _stream(conn: trio.socket.SocketType, reply: Stream) -> None:
    async def send(message: GateUpdate) -> None:
        await _send_bytes(conn, msgspec.json.encode(message))

    with contextlib.suppress(OSError):
        await _send_bytes(conn, msgspec.json.encode(Reply(ok=True)))
        async with trio.open_nursery() as nursery:

            async def until_hangup() -> None:
                while await conn.recv(4096):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_hangup)
            await reply.run(send)
            nursery.cancel_scope.cancel()


def request(scratch: Path, payload: Request, *, timeout: float = 10.0) -> Reply | None:
    """Send one request to the run's control socket; None when nothing is listening."""
    path = socket_path(scratch)
    if not path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            with _short_path(path) as address:
                sock.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # a socket file left by a run that was killed
        sock.sendall(msgspec.json.encode(payload) + b"\n")
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    try:
        return _reply_decoder.decode(data.split(b"\n", 1)[0])
    except msgspec.DecodeError:
        return None


async def subscribe(scratch: Path, payload: Request) -> AsyncIterator[GateUpdate]:
    """Send a streaming request and yield the run's lines until it hangs up. Yields
    nothing when nothing is listening."""
    path = socket_path(scratch)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            with _short_path(path) as address:
                await sock.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            return
        await _send_bytes(sock, msgspec.json.encode(payload))
        data = b""
        while True:
            chunk = await sock.recv(65536)
            if not chunk:
                return
            data += chunk
            *lines, data = data.split(b"\n")
            for line in lines:
                with contextlib.suppress(msgspec.DecodeError):
                    yield _update_decoder.decode(line)
