"""A local server that speaks the providers' wire formats, for tests of the real SDKs.

It answers the Anthropic Messages API (`…/messages`), the OpenAI Responses API
(`…/responses`) and Chat Completions (`…/chat/completions`), each plain or as SSE,
with text, reasoning, tool calls and usage in the provider's own field names. Each test
scripts it: a queue of replies and faults (HTTP errors in the provider's error format,
or a stream cut off mid-response), consumed one per request; with the queue empty it
answers "ok". It records every request so tests can assert on what the SDK sent.
Queues can also be kept per protocol (`script_for`) and per conversation
(`script_when`, matched on the request's first user message), for callers that hold
several conversations at once; `Together` holds a reply until its partners arrived,
`Held` until the test opens its gate (`in_flight` counts the requests being answered).

It runs in a thread on 127.0.0.1 with an ephemeral port; the CLI under test reaches it
through the `*_BASE_URL` variables.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ToolUse:
    """A tool call. With a `thought_signature` (Gemini 3 on Chat Completions) the call
    carries it in `extra_content`, and a later request that sends the call back without
    it is refused with a 400, as Gemini does."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None
    thought_signature: str | None = None


@dataclass(frozen=True)
class LongText:
    """A reply text too long to hold: `size` characters of `unit` repeated, made as it
    is sent, in deltas of about `piece` characters (a whole number of units)."""

    unit: str
    size: int
    piece: int = 1 << 16

    def __bool__(self) -> bool:
        return self.size > 0

    def pieces(self) -> Iterator[str]:
        block = self.unit * max(1, self.piece // len(self.unit))
        left = self.size
        while left > 0:
            yield block[:left]
            left -= len(block)

    def chunks(self) -> Iterator[bytes]:
        """The text's UTF-8 bytes, a piece at a time (to hash it as git would)."""
        for piece in self.pieces():
            yield piece.encode()


@dataclass(frozen=True)
class Reply:
    """A successful answer. `text` is streamed a word at a time, or, with `cuts`, in
    pieces cut at those character offsets (reasoning too); a `LongText` in its own
    pieces (Anthropic's Messages API only)."""

    text: str | LongText = "ok"
    tool_calls: tuple[ToolUse, ...] = ()
    reasoning: str | None = None
    input_tokens: int = 12
    output_tokens: int = 5
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cuts: tuple[int, ...] = ()


@dataclass(frozen=True)
class Fault:
    """An HTTP error in the provider's format. `kind`: rate_limit, server, auth, quota."""

    status: int
    kind: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Drop:
    """Start a streamed reply, then close the connection after `after` SSE events."""

    reply: Reply = Reply(text="this answer is cut off before it ends")
    after: int = 3


@dataclass(frozen=True)
class StreamError:
    """Start a streamed reply, then send the provider's in-stream error event (an
    overload) after `after` events, as a real server does when it fails mid-answer."""

    reply: Reply = Reply(text="this answer fails part way through")
    after: int = 3


@dataclass(frozen=True)
class Garbled:
    """Start a streamed reply, then send an event whose data is not what the provider
    sends (`data`: JSON cut short by default, or JSON of the wrong shape) after `after`
    events, and end the stream there, as a broken proxy or a hostile endpoint might."""

    reply: Reply = Reply(text="this answer turns to noise part way")
    after: int = 3
    data: str = '{"type": "content_block_delta", "index": 0, "delta": '


@dataclass(frozen=True)
class Stall:
    """Wait `seconds` before answering with `reply`, to run a client into its timeout."""

    seconds: float
    reply: Reply = Reply()


@dataclass(frozen=True)
class StallMidStream:
    """Start a streamed reply, then hold the connection after `after` SSE events until
    the server stops (or `seconds` pass), as a stream that hangs part way through."""

    reply: Reply = Reply(text="this answer stops part way and hangs there")
    after: int = 3
    seconds: float = 120.0


@dataclass(frozen=True)
class DripHeaders:
    """A slowloris: send the response's status line and headers one byte every
    `interval` seconds, until the client gives up or the server stops."""

    interval: float = 5.0


@dataclass(frozen=True)
class Together:
    """Answer with `reply` only once `count` requests scripted with the same `group`
    have arrived, so that each proves the others were sent while it waited. If they do
    not all come within `timeout` seconds, answer 400 (`apart`) instead."""

    group: str
    count: int
    reply: Reply = Reply()
    timeout: float = 60.0


@dataclass(frozen=True)
class Held:
    """Answer with `reply` only once the test opens `gate`: the requests it holds stay
    in flight together (`LlmServer.in_flight`) for as long as the test needs to look.
    If `gate` stays shut for `timeout` seconds, answer 400 instead."""

    gate: threading.Event
    reply: Reply = Reply()
    timeout: float = 60.0


Scripted = (
    Reply | Fault | Drop | StreamError | Stall | StallMidStream | Together | DripHeaders | Held
)


def apart(group: str) -> Fault:
    return Fault(400, "invalid", f"requests of group {group!r} did not arrive together")


def rate_limited(retry_after: float | None = None) -> Fault:
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return Fault(429, "rate_limit", "Rate limit reached; slow down", headers)


def server_error(retry_after: float | None = None) -> Fault:
    """A 500; with `retry_after`, one that says when to come back (an end-to-end test
    gives 0, so a retry waits no real backoff: the backoff is tested on a MockClock)."""
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return Fault(500, "server", "The server had an internal error", headers)


def unauthorized() -> Fault:
    return Fault(401, "auth", "Incorrect API key provided")


def quota_exhausted() -> Fault:
    return Fault(
        429, "quota", "You exceeded your current quota, please check your plan and billing details"
    )


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def api(self) -> str:
        return _api_of(self.path)


def _api_of(path: str) -> str:
    path = path.split("?")[0].rstrip("/")
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    return "unknown"


class _Httpd(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a run killed, a retry given up) is
        no error of the server's: no traceback for it in the test output."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LlmServer:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: the server's TLS settings (its certificate), to be reached over HTTPS."""
        self._script: deque[Scripted] = deque()
        self._by_api: dict[str, deque[Scripted]] = {}
        self._by_conversation: list[tuple[str, deque[Scripted]]] = []
        self._arrived: dict[str, int] = {}
        self._together = threading.Condition(threading.Lock())
        self.stopping = threading.Event()
        self.requests: list[Recorded] = []
        # Requests received and not yet answered, now and at the most.
        self.in_flight = 0
        self.most_in_flight = 0
        # Thought signatures handed out with tool calls, by call id.
        self.signatures: dict[str, str] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = _Httpd(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._scheme = "http"
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self._scheme}://{host!s}:{port}"

    def start(self) -> LlmServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def script(self, *items: Scripted) -> None:
        with self._lock:
            self._script.extend(items)

    def script_for(self, api: str, *items: Scripted) -> None:
        """Queue items answered only on one protocol (`anthropic`, `responses`, `chat`),
        for callers that send to several providers at once."""
        with self._lock:
            self._by_api.setdefault(api, deque()).extend(items)

    def script_when(self, match: str, *items: Scripted) -> None:
        """Queue items answered only to requests whose first user message contains
        `match`: one conversation's replies (a sub-agent's task), whatever the order in
        which concurrent conversations ask."""
        with self._lock:
            for known, queue in self._by_conversation:
                if known == match:
                    queue.extend(items)
                    return
            self._by_conversation.append((match, deque(items)))

    def next_scripted(self, api: str, body: dict[str, Any] | None = None) -> Scripted:
        with self._lock:
            first = _first_user_text(body or {})
            for match, queue in self._by_conversation:
                if match in first:
                    if queue:
                        return queue.popleft()
                    return Reply()
            own = self._by_api.get(api)
            if own:
                return own.popleft()
            return self._script.popleft() if self._script else Reply()

    def meet(self, together: Together) -> Reply | Fault:
        """Wait for the partners of `together`; its reply, or `apart` if they never come."""
        with self._together:
            self._arrived[together.group] = self._arrived.get(together.group, 0) + 1
            self._together.notify_all()
            met = self._together.wait_for(
                lambda: self._arrived[together.group] >= together.count, together.timeout
            )
        return together.reply if met else apart(together.group)

    def record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)

    def next_id(self) -> int:
        return next(self._ids)

    @contextlib.contextmanager
    def answering(self) -> Iterator[Callable[[], None]]:
        """Count a request in flight while it is answered: until the `done` it gives is
        called, just before the last of the answer is sent, or else until the answer
        ends. A client that has its whole answer can start its next request at once,
        before this thread runs again: counted out only after that last write, the two
        would overlap here though they never did for the client."""
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        counted = True

        def done() -> None:
            nonlocal counted
            with self._lock:
                if counted:
                    self.in_flight -= 1
                    counted = False

        try:
            yield done
        finally:
            done()


def _first_user_text(body: dict[str, Any]) -> str:
    """The first user message of a request in any of the three formats, as JSON text."""
    messages = body.get("messages") or body.get("input") or []
    if isinstance(messages, str):
        return messages
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def provider_env(server: LlmServer) -> dict[str, str]:
    """Keys and base URLs for the hosted providers (each its own made-up key) and for
    one local server, all pointing at `server`."""
    return {
        "ANTHROPIC_API_KEY": "test-anthropic-key",
        "ANTHROPIC_BASE_URL": server.url,
        "OPENAI_API_KEY": "test-openai-key",
        "OPENAI_BASE_URL": server.url + "/v1",
        "GEMINI_API_KEY": "test-gemini-key",
        "GEMINI_BASE_URL": server.url + "/v1beta/openai/",
        "KIMI_API_KEY": "test-kimi-key",
        "KIMI_BASE_URL": server.url + "/kimi/v1",
        "OLLAMA_BASE_URL": server.url + "/ollama/v1",
    }


class _Handler(BaseHTTPRequestHandler):
    owner: LlmServer
    protocol_version = "HTTP/1.1"
    # Counts this request out of the server's `in_flight` (`LlmServer.answering`).
    _done: Callable[[], None]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        # A client that gave up (a timeout test) needs no answer.
        with (
            contextlib.suppress(BrokenPipeError, ConnectionResetError),
            self.owner.answering() as done,
        ):
            self._done = done
            self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        body = json.loads(raw or b"{}")
        headers = {key.lower(): value for key, value in self.headers.items()}
        self.owner.record(Recorded("POST", self.path, headers, body))
        api = _api_of(self.path)
        if api == "unknown":
            self._send_json(
                404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            )
            return
        unsigned = _unsigned_call(body, self.owner.signatures) if api == "chat" else None
        if unsigned is not None:
            message = f"Function call `{unsigned}` is missing a thought_signature"
            self._send_json(400, _error_body(api, Fault(400, "invalid", message)))
            return
        scripted = self.owner.next_scripted(api, body)
        if isinstance(scripted, Together):
            scripted = self.owner.meet(scripted)
        if isinstance(scripted, Held):
            opened = scripted.gate.wait(scripted.timeout)
            scripted = scripted.reply if opened else Fault(400, "invalid", "held too long")
        if isinstance(scripted, Fault):
            self._send_json(scripted.status, _error_body(api, scripted), scripted.headers)
            return
        if isinstance(scripted, DripHeaders):
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-padding: "
            for byte in itertools.chain(head, itertools.repeat(ord("a"))):
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if self.owner.stopping.wait(scripted.interval):
                    break
            self.close_connection = True
            return
        if isinstance(scripted, Stall):
            time.sleep(scripted.seconds)
            scripted = scripted.reply
        model = str(body.get("model", "unknown"))
        n = self.owner.next_id()
        reply = (
            scripted.reply
            if isinstance(scripted, Drop | StreamError | StallMidStream | Garbled)
            else scripted
        )
        for i, call in enumerate(reply.tool_calls):
            if api == "chat" and call.thought_signature is not None:
                self.owner.signatures[_call_id(call, i, n)] = call.thought_signature
        if not body.get("stream"):
            self._send_json(200, _plain(api, reply, model, n))
            return
        # Made as they are sent: a `LongText` reply is never whole in memory.
        events = _events(api, reply, model, n, include_usage=_wants_usage(body))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        self.end_headers()
        ahead = next(events, None)
        index = -1
        while ahead is not None:
            event, ahead, index = ahead, next(events, None), index + 1
            if isinstance(scripted, Drop) and index == scripted.after:
                # Cut the chunked body short: the client sees an incomplete message.
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if isinstance(scripted, StallMidStream) and index == scripted.after:
                self.owner.stopping.wait(scripted.seconds)
            if isinstance(scripted, StreamError) and index == scripted.after:
                event = _stream_error(api)
            if isinstance(scripted, Garbled) and index == scripted.after:
                event = _garbled(api, scripted.data)
            payload = event.encode()
            if ahead is None:
                self._done()  # the client has the whole answer once this is sent
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            self.wfile.flush()
            if isinstance(scripted, StreamError | Garbled) and index == scripted.after:
                break
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_json(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self._done()
        self.wfile.write(data)


def _unsigned_call(body: dict[str, Any], signatures: dict[str, str]) -> str | None:
    """The name of a tool call sent back without the thought signature it came with."""
    for message in body.get("messages") or []:
        for call in message.get("tool_calls") or []:
            wanted = signatures.get(call.get("id", ""))
            sent = ((call.get("extra_content") or {}).get("google") or {}).get("thought_signature")
            if wanted is not None and sent != wanted:
                return str(call.get("function", {}).get("name"))
    return None


def _wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options") or {}
    return bool(options.get("include_usage"))


def _error_body(api: str, fault: Fault) -> dict[str, Any]:
    if api == "anthropic":
        kind = {
            "rate_limit": "rate_limit_error",
            "server": "api_error",
            "auth": "authentication_error",
            "quota": "billing_error",
            "invalid": "invalid_request_error",
        }[fault.kind]
        return {"type": "error", "error": {"type": kind, "message": fault.message}}
    kind, code = {
        "rate_limit": ("requests", "rate_limit_exceeded"),
        "server": ("server_error", None),
        "auth": ("invalid_request_error", "invalid_api_key"),
        "quota": ("insufficient_quota", "insufficient_quota"),
        "invalid": ("invalid_request_error", None),
    }[fault.kind]
    return {"error": {"message": fault.message, "type": kind, "param": None, "code": code}}


def _stream_error(api: str) -> str:
    message = "The service is overloaded; try again"
    if api == "anthropic":
        return _sse(
            "error", {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        )
    if api == "responses":
        return _sse(
            "error",
            {
                "type": "error",
                "code": "server_error",
                "message": message,
                "param": None,
                "sequence_number": 99,
            },
        )
    return _sse(None, {"error": {"message": message, "type": "server_error", "code": None}})


# The event name each API gives a text delta: a garbled event arrives under it.
_DELTA_EVENT = {"anthropic": "content_block_delta", "responses": "response.output_text.delta"}


def _garbled(api: str, data: str) -> str:
    return _sse(_DELTA_EVENT.get(api), data)


def _words(text: str | LongText, cuts: tuple[int, ...] = ()) -> Iterator[str]:
    if isinstance(text, LongText):
        return text.pieces()
    return iter(_split(text, cuts))


def _split(text: str, cuts: tuple[int, ...]) -> list[str]:
    if cuts:
        edges = [0, *sorted({cut for cut in cuts if 0 < cut < len(text)}), len(text)]
        return [text[a:b] for a, b in itertools.pairwise(edges) if b > a]
    parts = text.split(" ")
    return (
        [part + (" " if i < len(parts) - 1 else "") for i, part in enumerate(parts)] if text else []
    )


def _sse(event: str | None, data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def _call_id(call: ToolUse, index: int, n: int) -> str:
    return call.id or f"call_{n}_{index}"


def _events(api: str, reply: Reply, model: str, n: int, *, include_usage: bool) -> Iterator[str]:
    if api == "anthropic":
        yield from _anthropic_events(reply, model, n)
    elif api == "responses":
        yield from _responses_events(reply, model, n)
    else:
        yield from _chat_events(reply, model, n, include_usage=include_usage)


# ---------------------------------------------------------------------------- anthropic


def _anthropic_usage(reply: Reply) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "cache_read_input_tokens": reply.cache_read_tokens,
        "cache_creation_input_tokens": reply.cache_write_tokens,
    }


def _anthropic_stop(reply: Reply) -> str:
    return "tool_use" if reply.tool_calls else "end_turn"


def _anthropic_blocks(reply: Reply, n: int) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": f"sig_{n}"})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text, "citations": None})
    blocks += [
        {"type": "tool_use", "id": _call_id(call, i, n), "name": call.name, "input": call.arguments}
        for i, call in enumerate(reply.tool_calls)
    ]
    return blocks


def _anthropic_message(
    reply: Reply, model: str, n: int, content: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None if not content and not reply.text else _anthropic_stop(reply),
        "stop_sequence": None,
        "usage": _anthropic_usage(reply),
    }


def _anthropic_events(reply: Reply, model: str, n: int) -> Iterator[str]:
    start = _anthropic_message(reply, model, n, [])
    start["stop_reason"] = None
    start["usage"] = {**_anthropic_usage(reply), "output_tokens": 1}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("ping", {"type": "ping"})
    for index, block in enumerate(_anthropic_blocks(reply, n)):
        if block["type"] == "thinking":
            yield _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                },
            )
            for word in _words(block["thinking"], reply.cuts):
                yield _sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": word},
                    },
                )
            yield _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": block["signature"]},
                },
            )
        elif block["type"] == "text":
            yield _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": "", "citations": None},
                },
            )
            for word in _words(block["text"], reply.cuts):
                yield _sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": word},
                    },
                )
        else:
            yield _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {
                        "type": "tool_use",
                        "id": block["id"],
                        "name": block["name"],
                        "input": {},
                    },
                },
            )
            encoded = json.dumps(block["input"])
            half = len(encoded) // 2
            for piece in (encoded[:half], encoded[half:]):
                yield _sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    usage: dict[str, Any] = {
        "output_tokens": reply.output_tokens,
        "input_tokens": reply.input_tokens,
        "cache_read_input_tokens": reply.cache_read_tokens,
        "cache_creation_input_tokens": reply.cache_write_tokens,
    }
    if reply.reasoning_tokens:
        usage["output_tokens_details"] = {"thinking_tokens": reply.reasoning_tokens}
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _anthropic_stop(reply), "stop_sequence": None},
            "usage": usage,
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


# ---------------------------------------------------------------------------- responses


def _responses_usage(reply: Reply) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "input_tokens_details": {
            "cached_tokens": reply.cache_read_tokens,
            "cache_write_tokens": reply.cache_write_tokens,
        },
        "output_tokens": reply.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _responses_items(reply: Reply, n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{n}",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
                "status": "completed",
            }
        )
    if reply.text:
        items.append(
            {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
                ],
            }
        )
    items += [
        {
            "type": "function_call",
            "id": f"fc_{n}_{i}",
            "call_id": _call_id(call, i, n),
            "name": call.name,
            "arguments": json.dumps(call.arguments),
            "status": "completed",
        }
        for i, call in enumerate(reply.tool_calls)
    ]
    return items


def _response_object(reply: Reply, model: str, n: int, *, done: bool) -> dict[str, Any]:
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed" if done else "in_progress",
        "output": _responses_items(reply, n) if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "usage": _responses_usage(reply) if done else None,
    }


def _responses_events(reply: Reply, model: str, n: int) -> Iterator[str]:
    seq = itertools.count()

    def event(kind: str, **data: Any) -> str:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    yield event("response.created", response=_response_object(reply, model, n, done=False))
    yield event("response.in_progress", response=_response_object(reply, model, n, done=False))
    for index, item in enumerate(_responses_items(reply, n)):
        if item["type"] == "reasoning":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "summary": [], "status": "in_progress"},
            )
            for word in _words(reply.reasoning or "", reply.cuts):
                yield event(
                    "response.reasoning_summary_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    summary_index=0,
                    delta=word,
                )
            yield event(
                "response.reasoning_summary_text.done",
                item_id=item["id"],
                output_index=index,
                summary_index=0,
                text=reply.reasoning,
            )
        elif item["type"] == "message":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "content": [], "status": "in_progress"},
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
            for word in _words(reply.text, reply.cuts):
                yield event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=word,
                    logprobs=[],
                )
            yield event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=reply.text,
                logprobs=[],
            )
            yield event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part={**part, "text": reply.text},
            )
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            half = len(item["arguments"]) // 2
            for piece in (item["arguments"][:half], item["arguments"][half:]):
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=piece,
                )
            yield event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=_response_object(reply, model, n, done=True))


# ---------------------------------------------------------------------------- chat


def _chat_usage(reply: Reply) -> dict[str, Any]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens},
        "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
    }


def _chat_finish(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _chat_events(reply: Reply, model: str, n: int, *, include_usage: bool) -> Iterator[str]:
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        return _sse(
            None,
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage,
            },
        )

    def delta(**fields: Any) -> str:
        return chunk([{"index": 0, "delta": fields, "finish_reason": None, "logprobs": None}])

    yield delta(role="assistant", content="")
    for word in _words(reply.reasoning or "", reply.cuts):
        yield delta(reasoning_content=word)
    for word in _words(reply.text, reply.cuts):
        yield delta(content=word)
    for i, call in enumerate(reply.tool_calls):
        opening: dict[str, Any] = {
            "index": i,
            "id": _call_id(call, i, n),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        if call.thought_signature is not None:
            opening["extra_content"] = {"google": {"thought_signature": call.thought_signature}}
        yield delta(tool_calls=[opening])
        encoded = json.dumps(call.arguments)
        half = len(encoded) // 2
        for piece in (encoded[:half], encoded[half:]):
            yield delta(tool_calls=[{"index": i, "function": {"arguments": piece}}])
    yield chunk([{"index": 0, "delta": {}, "finish_reason": _chat_finish(reply), "logprobs": None}])
    if include_usage:
        yield chunk([], _chat_usage(reply))
    yield _sse(None, "[DONE]")


# ---------------------------------------------------------------------------- plain


def _plain(api: str, reply: Reply, model: str, n: int) -> dict[str, Any]:
    if api == "anthropic":
        message = _anthropic_message(reply, model, n, _anthropic_blocks(reply, n))
        message["stop_reason"] = _anthropic_stop(reply)
        return message
    if api == "responses":
        return _response_object(reply, model, n, done=True)
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": _call_id(call, i, n),
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                **(
                    {"extra_content": {"google": {"thought_signature": call.thought_signature}}}
                    if call.thought_signature is not None
                    else {}
                ),
            }
            for i, call in enumerate(reply.tool_calls)
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _chat_finish(reply), "logprobs": None}
        ],
        "usage": _chat_usage(reply),
    }
