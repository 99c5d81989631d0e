"""LLM slots: one cap on model stages running at once across many run processes.

`git fabro batch --max-parallel N` runs each row as a process of its own, and each run
may fan out; what a provider's rate limit sees is the sum. So the driver serves a
limiter on a unix socket and hands its path to every run in `FABRO_LLM_SLOTS`
(`SLOTS_VARIABLE`); a run holds a slot for the length of each LLM stage, and a 429 one
run hears pauses every run's next request (`Retry-After` is the provider's word for
all of us, not for one connection).

The protocol is a JSON object a line, one request a connection (each message a
`msgspec.Struct` below, told apart by its `op`):

    {"op": "acquire", "holder": "<run>/<node>"}   -> {"op": "queued"} (only when it must
                                                     wait), then {"op": "granted"}
    {"op": "pause", "seconds": 7.0}               -> {"op": "ok"}
    {"op": "paused"}                              -> {"op": "paused", "seconds": 2.5}
    anything else                                 -> {"op": "error", "message": "..."}

A granted slot is the open connection itself: the holder closes it when the stage
ends, and a holder that is killed frees its slot when the kernel closes its socket.

The server (`SlotServer`) speaks the protocol from threads and leaves the counting to
a `SlotPolicy`: `LocalSlots` for the processes of one machine; an executor on a
cluster serves the same socket on each node with a policy that forwards to one shared
counter there. The run side (`LlmSlots`) never blocks the trio loop: it talks through
trio's sockets.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Protocol, TypeVar

import msgspec
import trio

from fabro_git.errors import FabroError
from fabro_git.llm import SLOTS_VARIABLE

__all__ = [
    "SLOTS_VARIABLE",
    "LlmSlots",
    "LocalSlots",
    "SlotPolicy",
    "SlotServer",
    "SlotsError",
    "SlotsUnreachable",
]

# A request or reply longer than this is not one of ours.
MAX_LINE = 4096
# The quick requests (pause, paused) are answered at once by a live limiter.
ANSWER_SECONDS = 30.0


class SlotsError(FabroError):
    """The limiter answered something that is not the protocol: a bug or a stranger."""


class SlotsUnreachable(SlotsError):
    """Nothing listens at the limiter's socket (its batch driver has gone)."""


# -- the messages -----------------------------------------------------------------------

# Seconds of a pause: a JSON number, not negative (msgspec refuses NaN and infinities).
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class _Message(msgspec.Struct, frozen=True, tag_field="op"):
    """A line of the protocol: a JSON object whose `op` names its kind."""


class AcquireRequest(_Message, frozen=True, tag="acquire"):
    holder: str = "?"


class PauseRequest(_Message, frozen=True, tag="pause"):
    seconds: Seconds


class PausedRequest(_Message, frozen=True, tag="paused"):
    pass


class QueuedReply(_Message, frozen=True, tag="queued"):
    pass


class GrantedReply(_Message, frozen=True, tag="granted"):
    pass


class OkReply(_Message, frozen=True, tag="ok"):
    pass


class PausedReply(_Message, frozen=True, tag="paused"):
    seconds: Seconds


class ErrorReply(_Message, frozen=True, tag="error"):
    message: str


SlotRequest = AcquireRequest | PauseRequest | PausedRequest
SlotReply = QueuedReply | GrantedReply | OkReply | PausedReply | ErrorReply
_Reply = TypeVar("_Reply", bound=SlotReply)

_REQUESTS = msgspec.json.Decoder(SlotRequest)
_REPLIES = msgspec.json.Decoder(SlotReply)


# -- the counting, behind the socket ----------------------------------------------------


class SlotPolicy(Protocol):
    """What `SlotServer` asks of whatever keeps the count. Every method is called from a
    server thread (one a connection), so it may block and must be thread-safe."""

    def acquire(self, holder: str, blocking: bool = True) -> bool:
        """Take a slot for `holder`; True once taken. With `blocking`, wait until one is
        free (always True); without, False at once when none is."""
        ...

    def release(self, holder: str) -> None:
        """Give back a slot `holder` took."""
        ...

    def pause(self, seconds: float) -> None:
        """A provider asked for `seconds` of quiet: no model request before they pass
        (a pause already longer stays as it is)."""
        ...

    def paused_for(self) -> float:
        """Seconds left of the current pause; 0 when there is none."""
        ...


class LocalSlots:
    """`slots` slots shared by the threads of this process (and so by every process
    talking to its `SlotServer`). `clock` gives seconds (tests pass a virtual one)."""

    def __init__(self, slots: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if slots < 1:
            raise ValueError(f"at least one slot, not {slots}")
        self.slots = slots
        self._clock = clock
        self._holders: Counter[str] = Counter()
        self._changed = threading.Condition()
        self._paused_until = -math.inf

    def acquire(self, holder: str, blocking: bool = True) -> bool:
        with self._changed:
            if blocking:
                self._changed.wait_for(self._free)
            elif not self._free():
                return False
            self._holders[holder] += 1
            self._changed.notify_all()
            return True

    def release(self, holder: str) -> None:
        with self._changed:
            if self._holders[holder] <= 0:
                raise ValueError(f"{holder} holds no slot")
            self._holders[holder] -= 1
            self._holders += Counter()  # drop the zero
            self._changed.notify_all()

    def pause(self, seconds: float) -> None:
        with self._changed:
            self._paused_until = max(self._paused_until, self._clock() + seconds)

    def paused_for(self) -> float:
        with self._changed:
            return max(0.0, self._paused_until - self._clock())

    def holders(self) -> list[str]:
        """Who holds a slot now, a name for each slot held."""
        with self._changed:
            return sorted(self._holders.elements())

    def wait_held(self, count: int, timeout: float | None = None) -> bool:
        """Wait until exactly `count` slots are held; whether they were."""
        with self._changed:
            return self._changed.wait_for(lambda: self._held() == count, timeout)

    def _held(self) -> int:
        return sum(self._holders.values())

    def _free(self) -> bool:
        return self._held() < self.slots


# -- the server -------------------------------------------------------------------------


class SlotServer:
    """Serves `policy` on a unix socket in a private (0700) temporary directory, from
    threads, until `close()`. `env()` is what a run process needs to find it."""

    def __init__(self, policy: SlotPolicy) -> None:
        self.policy = policy
        self._dir = Path(tempfile.mkdtemp(prefix="fabro-slots-"))  # made 0700
        self.path = str(self._dir / "slots.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)
            self._listener.listen(64)
        except OSError as err:  # a TMPDIR too long for a socket's name, most likely
            self._listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise SlotsError(
                f"cannot serve the LLM slot limiter at {self.path}: {err.strerror or err}",
                hint="a unix socket's path is at most 107 bytes: point TMPDIR at a "
                "shorter directory",
            ) from None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="llm-slots", daemon=True)

    def start(self) -> SlotServer:
        self._thread.start()
        return self

    def env(self) -> dict[str, str]:
        return {SLOTS_VARIABLE: self.path}

    def close(self) -> None:
        """Stop answering and remove the socket's directory. Slots still held are the
        policy's to forget; their connections simply end."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._listener.close()
        if self._thread.is_alive():
            self._thread.join()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> SlotServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._answer, args=(connection,), name="llm-slot", daemon=True
            ).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            reply: SlotReply
            try:
                request = decode(_read_line(connection), _REQUESTS)
                if isinstance(request, AcquireRequest):
                    self._hold(connection, request.holder or "?")
                    return
                reply = self._reply(request)
            except SlotsError as err:
                reply = ErrorReply(err.message)
            except OSError:
                return  # the asker went away
            with contextlib.suppress(OSError):
                connection.sendall(encode(reply))

    def _reply(self, request: PauseRequest | PausedRequest) -> SlotReply:
        if isinstance(request, PauseRequest):
            self.policy.pause(request.seconds)
            return OkReply()
        return PausedReply(self.policy.paused_for())

    def _hold(self, connection: socket.socket, holder: str) -> None:
        """Take a slot for the connection's holder, tell it, and keep the slot until the
        connection ends (whatever ends it)."""
        if not self.policy.acquire(holder, blocking=False):
            try:
                connection.sendall(encode(QueuedReply()))
            except OSError:
                return  # the asker went away before it waited
            self.policy.acquire(holder)
        try:
            connection.sendall(encode(GrantedReply()))
            while connection.recv(MAX_LINE):
                pass  # the holder says nothing more; its end is the release
        except OSError:
            pass
        finally:
            self.policy.release(holder)


def _read_line(connection: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        if len(data) > MAX_LINE:
            raise SlotsError("a request longer than a line")
        more = connection.recv(MAX_LINE)
        if not more:
            break
        data += more
    return data


_Line = TypeVar("_Line", bound=_Message)


def encode(message: _Message) -> bytes:
    return msgspec.json.encode(message) + b"\n"


def decode(line: bytes, decoder: msgspec.json.Decoder[_Line]) -> _Line:
    """One line of the protocol as its message; a SlotsError when it is not one."""
    try:
        return decoder.decode(line)
    except msgspec.DecodeError as err:  # a ValidationError too
        shown = line[:80].decode("utf-8", "replace")
        raise SlotsError(f"not a message of the LLM slot protocol ({err}): {shown!r}") from None


# -- the run's side ---------------------------------------------------------------------

Queued = Callable[[], Awaitable[None]]


async def _nothing() -> None:
    pass


class LlmSlots:
    """The limiter a run process was handed, at the socket `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LlmSlots | None:
        """The limiter `FABRO_LLM_SLOTS` names, or None when the run has none."""
        path = (os.environ if env is None else env).get(SLOTS_VARIABLE)
        return cls(path) if path else None

    @contextlib.asynccontextmanager
    async def held(self, holder: str, *, queued: Queued = _nothing) -> AsyncIterator[None]:
        """Hold a slot for the body; `queued` is awaited first if none is free."""
        stream = await self._connect()
        async with stream:
            reader = _LineReader(stream, self.path)
            await stream.send_all(encode(AcquireRequest(holder)))
            reply = await reader.next()
            if isinstance(reply, QueuedReply):
                await queued()
                reply = await reader.next()
            self._expect(reply, GrantedReply)
            yield

    async def pause(self, seconds: float) -> None:
        """Tell every run that a provider asked for `seconds` of quiet."""
        self._expect(await self._ask(PauseRequest(seconds)), OkReply)

    async def paused_for(self) -> float:
        return self._expect(await self._ask(PausedRequest()), PausedReply).seconds

    async def wait_out_pause(self, waiting: Callable[[float], Awaitable[None]]) -> float:
        """Sleep until no pause is on (telling `waiting` of the first); seconds slept."""
        slept = 0.0
        while (seconds := await self.paused_for()) > 0:
            if not slept:
                await waiting(seconds)
            await trio.sleep(seconds)
            slept += seconds
        return slept

    async def _ask(self, message: SlotRequest) -> SlotReply:
        with trio.fail_after(ANSWER_SECONDS):
            stream = await self._connect()
            async with stream:
                await stream.send_all(encode(message))
                return await _LineReader(stream, self.path).next()

    async def _connect(self) -> trio.SocketStream:
        try:
            return await trio.open_unix_socket(self.path)
        except OSError as err:
            raise SlotsUnreachable(
                f"the LLM slot limiter at {self.path} does not answer ({err.strerror or err})",
                hint=f"{SLOTS_VARIABLE} is set by `git fabro batch` for its runs; unset it "
                "to run without the limiter",
            ) from None

    def _expect(self, reply: SlotReply, kind: type[_Reply]) -> _Reply:
        if not isinstance(reply, kind):
            raise self._garbled(reply)
        return reply

    def _garbled(self, reply: SlotReply) -> SlotsError:
        if isinstance(reply, ErrorReply):
            said = reply.message
        else:
            said = msgspec.json.encode(reply).decode()[:80]
        return SlotsError(
            f"the LLM slot limiter at {self.path} answered out of protocol: {said}",
            hint=f"is {SLOTS_VARIABLE} pointing at a `git fabro batch` driver's socket?",
        )


class _LineReader:
    """Lines of the protocol off a trio stream."""

    def __init__(self, stream: trio.SocketStream, path: str) -> None:
        self._stream = stream
        self._path = path
        self._buffer = b""

    async def next(self) -> SlotReply:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                break
            more = await self._stream.receive_some(MAX_LINE)
            if not more:
                if not self._buffer:
                    raise SlotsError(
                        f"the LLM slot limiter at {self._path} hung up without an answer",
                        hint="its batch driver may have stopped",
                    )
                break
            self._buffer += more
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return decode(line, _REPLIES)
        except SlotsError as err:
            raise SlotsError(
                f"the LLM slot limiter at {self._path} answered out of protocol: {err.message}"
            ) from None
