"""The web view's routes, its guard (token, origin, CSP) and its SSE responses.

Pages are static files of this package, picked from a fixed list (no URL path reaches
the file system); they fetch JSON and events and put run data into the page as text.
The pages and their scripts hold no run data and are served to anyone who may reach the
server; every other request needs the server's token as an `Authorization: Bearer`
header. The token is never a cookie: a cookie is the host's, whatever its port, so a
browser would hand it to any other server on 127.0.0.1. The page takes it from the
address's fragment, which no request carries (an address with it in the query is sent
on to one with it in the fragment), keeps it in the tab's sessionStorage (which is the
origin's, port included) and takes it out of the address bar. A request that changes
something also needs its Origin to be this server, and JSON.
"""

from __future__ import annotations

import contextlib
import getpass
import hmac
import json
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple, TypeVar, TypeVarTuple, cast
from urllib.parse import parse_qsl, quote, urlencode

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Match, Route

from fabro_git.engine import control
from fabro_git.errors import FabroError
from fabro_git.jsondata import JsonObject
from fabro_git.web.feeds import Feeds, Produce, all_runs_stream, new_events_stream, run_stream
from fabro_git.web.source import RepositoryRuns

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

# An ASGI app as the server (Hypercorn, its own types) and Starlette (its own) both take it.
ASGIApp = Callable[..., Awaitable[None]]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
# The files the pages are made of: a URL names one of these, never a path.
STATIC = {
    "style.css": "text/css; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "runs.js": "text/javascript; charset=utf-8",
    "run.js": "text/javascript; charset=utf-8",
}
PAGES = {"runs": "index.html", "run": "run.html"}
SAFE_METHODS = {"GET", "HEAD"}
MAX_BODY = 64 * 1024
# An artifact is sent from a copy, held in memory up to this size and on disk past it,
# and read back this much at a time.
SPOOL_BYTES = 1 << 20


class Guard:
    """Lets a request through only with the token (but for a look at the `shell`: the
    pages and their files, which hold no run data), and a state-changing one only from
    this server's own pages; puts the security headers on every answer."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        shell: Sequence[Route] = (),
        loopback: bool = True,
        host: str = "",
    ) -> None:
        self.app = app
        self.token = token
        self.shell = shell
        # On loopback only a loopback name is this server: another name is a page whose
        # DNS was pointed here (rebinding), turned away before the token is even looked at.
        # The address it was told to listen on is one (`--host 127.0.0.2`).
        self.loopback = loopback
        self.names = {"127.0.0.1", "localhost", "[::1]", _bracketed(host.lower())} - {""}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # No page speaks it, and nothing unguarded gets past: closed unopened.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in {h for h, _ in SECURITY_HEADERS}
                ]
                message = {**message, "headers": headers + SECURITY_HEADERS}
            await send(message)

        request = Request(scope)
        host = request.headers.get("host")  # a browser always sends one
        if self.loopback and host is not None and _host_name(host) not in self.names:
            await PlainTextResponse(
                "misdirected: this server answers to its own loopback address or localhost only\n",
                status_code=421,
            )(scope, receive, send_secured)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        offered = query.get("token")
        if offered is not None and self._matches(offered) and request.method in SAFE_METHODS:
            # An address printed with the token in its query (as it once was): the same
            # page with the token in the fragment, which the page's script takes up. The
            # query's token leaves the address bar and the browser's history.
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            # One leading slash: `//host/...` would send the browser to another site.
            # Percent-encoded again: the decoded path may hold any letter, or CR LF, and
            # a header value is Latin-1 text of one line.
            path = "/" + quote((scope.get("root_path", "") + scope["path"]).lstrip("/"))
            location = path + (f"?{rest}" if rest else "") + "#token=" + quote(offered, safe="")
            headers = {"location": location, "cache-control": "no-store"}
            await Response(status_code=303, headers=headers)(scope, receive, send_secured)
            return
        if not self._bearer(request) and not self._in_shell(request, scope):
            await PlainTextResponse(
                "forbidden: open the address `git fabro serve` printed (it holds the token)\n",
                status_code=403,
            )(scope, receive, send_secured)
            return
        if request.method not in SAFE_METHODS and not self._same_origin(request):
            await PlainTextResponse(
                "forbidden: a change must come from this server's own page\n", status_code=403
            )(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)

    def _in_shell(self, request: Request, scope: Scope) -> bool:
        """A look at a page or a file it is made of: no token is needed (nor could a
        browser's navigation to the page send one)."""
        if request.method not in SAFE_METHODS:
            return False
        return any(route.matches(scope)[0] is Match.FULL for route in self.shell)

    def _matches(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def _bearer(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        return header.startswith("Bearer ") and self._matches(header[len("Bearer ") :])

    def _same_origin(self, request: Request) -> bool:
        origin = request.headers.get("origin")
        host = request.headers.get("host")
        if not origin or not host or origin != f"http://{host}":
            return False
        return request.headers.get("content-type", "").split(";")[0].strip() == "application/json"


def _host_name(host: str) -> str:
    """A Host header's name, without its port (any port: a tunnel's too)."""
    return (host.rsplit(":", 1)[0] if not host.endswith("]") else host).lower()


def _bracketed(address: str) -> str:
    """An address as a Host header writes it: an IPv6 one in brackets."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


class StreamedResponse(Response):
    """An answer whose body `produce(send)` writes as it goes; it stops when the client
    hangs up (the producer is cancelled) or when the producer returns. Starlette's
    `StreamingResponse` is no substitute: it ends the body inside a task group, where
    Hypercorn's closing of the connection is cancelled (see the end of `__call__`)."""

    def __init__(self, produce: Produce, headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (name.encode(), value.encode("latin-1")) for name, value in headers.items()
        ]
        self.produce = produce

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def body(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        hung_up = False
        async with trio.open_nursery() as nursery:

            async def until_hangup() -> None:
                nonlocal hung_up
                while (await receive())["type"] != "http.disconnect":
                    pass
                hung_up = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_hangup)
            try:
                await self.produce(body)
            except OSError:
                hung_up = True  # the client went away mid-write
            nursery.cancel_scope.cancel()
        if not hung_up:
            # Outside the nursery: ending the body makes Hypercorn tell this app the
            # stream is over, which would cancel the rest of this very call (closing
            # the connection, the only end an HTTP/1.0 client has) from inside.
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class SseResponse(StreamedResponse):
    """A `text/event-stream` answer written by `produce(send)`."""

    media_type = "text/event-stream"

    def __init__(self, produce: Produce) -> None:
        # No Content-Length: the body goes on until the producer is done.
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-store",
            "x-accel-buffering": "no",
        }
        super().__init__(produce, headers)


def _package_file(name: str) -> bytes:
    return (resources.files("fabro_git.web") / "static" / name).read_bytes()


def build(
    source: RepositoryRuns, token: str, *, loopback: bool = True, host: str = ""
) -> tuple[ASGIApp, Callable[[trio.Nursery], None]]:
    """The guarded app, and the call that gives it the nursery its run feeds live in
    (made when the server starts)."""
    site = _Site(source)

    async def refused(request: Request, exc: Exception) -> Response:
        # A run git cannot read, or Graphviz missing: said as the commands say it.
        assert isinstance(exc, FabroError)
        return JSONResponse({"error": exc.message, "hint": exc.hint}, status_code=500)

    app = Starlette(routes=SHELL + site.routes(), exception_handlers={FabroError: refused})
    return Guard(app, token, shell=SHELL, loopback=loopback, host=host), site.start


RunEndpoint = Callable[[Request, str], Awaitable[Response]]


_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")


async def _blocking(fn: Callable[[*_Args], _T], *args: *_Args) -> _T:
    return await trio.to_thread.run_sync(fn, *args)


def _page(name: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        data = await _blocking(_package_file, PAGES[name])
        return Response(data, media_type="text/html; charset=utf-8")

    return endpoint


async def _static(request: Request) -> Response:
    name = str(request.path_params["name"])
    if name not in STATIC:
        return PlainTextResponse("not found\n", status_code=404)
    data = await _blocking(_package_file, name)
    return Response(data, media_type=STATIC[name], headers={"cache-control": "no-cache"})


# The pages and the files they are made of: the same for every run, and for anyone.
SHELL = [
    Route("/", _page("runs")),
    Route("/runs/{run_id}", _page("run")),
    Route("/static/{name}", _static),
    Route("/favicon.ico", lambda request: Response(status_code=204)),
]


def _no_run() -> Response:
    return JSONResponse({"error": "no such run in this repository"}, status_code=404)


class _Site:
    """The endpoints of one server over one repository's runs. Each reads the repository
    off the trio loop; the run feeds live in the nursery `start` is given."""

    def __init__(self, source: RepositoryRuns) -> None:
        self.source = source
        self.feeds: Feeds | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self.feeds = Feeds(self.source, nursery)

    def routes(self) -> list[Route]:
        """What the pages read and do: runs' data, streams and buttons (the guard asks
        for the token on each)."""
        of_run = self._of_known_run
        return [
            Route("/api/runs", self.runs),
            Route("/api/events", self.every_event),
            Route("/api/runs/{run_id}", of_run(self.run)),
            Route("/api/runs/{run_id}/row", of_run(self.row)),
            Route("/api/runs/{run_id}/stages", of_run(self.stages)),
            Route("/api/runs/{run_id}/stages/{stage_id}", of_run(self.stage)),
            Route("/api/runs/{run_id}/graph.svg", of_run(self.graph)),
            Route("/api/runs/{run_id}/artifacts/{path:path}", of_run(self.artifact)),
            Route("/api/runs/{run_id}/events", of_run(self.run_events)),
            Route("/api/runs/{run_id}/gates", of_run(self.gates)),
            Route("/api/runs/{run_id}/{action}", self.act, methods=["POST"]),
        ]

    async def known_run(self, request: Request) -> str | None:
        """The request's run id when it names a run of this repository."""
        from fabro_git.store.runs import is_run_id

        run_id = str(request.path_params["run_id"])
        if not is_run_id(run_id) or not await _blocking(self.source.exists, run_id):
            return None
        return run_id

    def _of_known_run(self, endpoint: RunEndpoint) -> Callable[[Request], Awaitable[Response]]:
        """`endpoint`, called with the request's run id, or a 404 when no such run."""

        async def checked(request: Request) -> Response:
            run_id = await self.known_run(request)
            if run_id is None:
                return _no_run()
            return await endpoint(request, run_id)

        return checked

    async def runs(self, request: Request) -> Response:
        return _json(await _blocking(self.source.rows))

    async def row(self, request: Request, run_id: str) -> Response:
        return _json(await _blocking(self.source.row, run_id))

    async def run(self, request: Request, run_id: str) -> Response:
        return _json(await _blocking(_run_view, self.source, run_id))

    async def stages(self, request: Request, run_id: str) -> Response:
        return _json((await _blocking(_run_view, self.source, run_id))["stages"])

    async def stage(self, request: Request, run_id: str) -> Response:
        stage_id = str(request.path_params["stage_id"])
        found = await _blocking(_stage_view, self.source, run_id, stage_id)
        if found is None:
            return JSONResponse({"error": "no such stage in this run"}, status_code=404)
        return _json(found)

    async def artifact(self, request: Request, run_id: str) -> Response:
        found = await _blocking(_artifact, self.source, run_id, str(request.path_params["path"]))
        if found is None:
            return JSONResponse({"error": "no such artifact in this run"}, status_code=404)
        # Never shown inline: a captured asset may be HTML or SVG written by anyone.
        headers = {
            "content-type": "application/octet-stream",
            "content-disposition": f'attachment; filename="{found.name}"',
            "content-length": str(found.size),
        }
        return StreamedResponse(lambda send: _send_file(found.body, send), headers)

    async def graph(self, request: Request, run_id: str) -> Response:
        svg = await _blocking(_graph_svg, self.source, run_id)
        return Response(svg, media_type="image/svg+xml")

    async def run_events(self, request: Request, run_id: str) -> Response:
        last_id = request.headers.get("last-event-id") or request.query_params.get("after")
        feeds = self.feeds
        assert feeds is not None, "the server answers only once started"
        # Opened before the answer starts: a run that cannot be read is refused in JSON.
        return SseResponse(await run_stream(feeds, run_id, last_id))

    async def every_event(self, request: Request) -> Response:
        if request.query_params.get("from") == "now":
            # Placed before the answer starts: a page that reads the runs once its
            # stream is open misses nothing in between.
            following = await _blocking(self.source.from_now)
            return SseResponse(lambda send: new_events_stream(following, send))
        last_id = request.headers.get("last-event-id") or request.query_params.get("after")
        return SseResponse(lambda send: all_runs_stream(self.source, last_id, send))

    async def gates(self, request: Request, run_id: str) -> Response:
        return SseResponse(lambda send: _gates(self.source, run_id, send))

    async def act(self, request: Request) -> Response:
        """A button of the run's page: answer a gate, steer, interrupt."""
        body = bytearray()
        async for chunk in request.stream():  # never more than MAX_BODY held
            body += chunk
            if len(body) > MAX_BODY:
                return JSONResponse(
                    {"error": f"request body too large (over {MAX_BODY} bytes)"},
                    status_code=413,
                )
        run_id = await self.known_run(request)
        if run_id is None:
            return _no_run()
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return JSONResponse({"error": "expected a JSON object"}, status_code=400)
        action = str(request.path_params["action"])
        message = _control_message(action, payload)
        if message is None:
            return JSONResponse({"error": f"cannot {action} with that"}, status_code=400)
        return await self._send(run_id, message)

    async def _send(self, run_id: str, message: control.Request) -> Response:
        """Sends a control request to the live run; its reply, or why it was not sent."""
        if not await _blocking(self.source.live, run_id):
            return JSONResponse({"error": f"run {run_id} is not running here"}, status_code=409)
        if isinstance(message, control.Answer):
            refused = await _unfit_answer(self.source, run_id, message.id, message.text)
            if refused is not None:
                return refused
        reply = await _blocking(control.request, self.source.scratch(run_id), message)
        if reply is None:
            return JSONResponse(
                {"error": f"run {run_id} does not answer on its control socket"}, status_code=503
            )
        return _json(msgspec.to_builtins(reply))


def _json(value: object) -> Response:
    return Response(
        json.dumps(value, ensure_ascii=False).encode("utf-8"),
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def _actor() -> control.Requester:
    try:
        login: str | None = getpass.getuser()
    except (KeyError, OSError):
        login = None
    return control.Requester(login=login)


def _control_message(action: str, payload: JsonObject) -> control.Request | None:
    """The control request for a button: answer a gate, steer, interrupt."""
    if action == "answer":
        gate_id, text = payload.get("id"), payload.get("text")
        if not isinstance(gate_id, int) or not isinstance(text, str) or not text.strip():
            return None
        return control.Answer(id=gate_id, text=text)
    if action == "steer":
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            return None
        return control.Steer(text=text, actor=_actor())
    if action == "interrupt":
        return control.Interrupt(actor=_actor())
    return None


def _attach(scratch: Path) -> AsyncGenerator[control.GateUpdate, None]:
    """The run's gates as `attach` hears them (a generator: closed when left early)."""
    return cast(
        "AsyncGenerator[control.GateUpdate, None]", control.subscribe(scratch, control.Attach())
    )


async def _unfit_answer(
    source: RepositoryRuns, run_id: str, gate_id: int, text: str
) -> Response | None:
    """Why `text` cannot answer gate `gate_id` (it is not open, or the gate cannot route
    on it), as the answer to send back; None when it can. The run takes any text, so a
    typo is caught here, as `attach` catches it, rather than failing the gate."""
    from fabro_git.engine.interviewer import ask_again, takes

    question = None
    # The run lists its open gates first thing to a client that attaches.
    with trio.move_on_after(2):
        async with contextlib.aclosing(_attach(source.scratch(run_id))) as messages:
            async for message in messages:
                if message.id == gate_id and message.question is not None:
                    question = message.question
                    break
    if question is None:
        return JSONResponse({"error": "that question is no longer open"}, status_code=409)
    if not takes(question, text):
        return JSONResponse({"error": ask_again(question, text).strip()}, status_code=400)
    return None


async def _gates(
    source: RepositoryRuns, run_id: str, send: Callable[[bytes], Awaitable[None]]
) -> None:
    """The run's human gates as they open and close, one SSE message each, while it
    lives (the control socket's `attach` stream, as `git fabro attach` reads it)."""

    scratch = source.scratch(run_id)
    while await trio.to_thread.run_sync(source.live, run_id):
        async with contextlib.aclosing(_attach(scratch)) as messages:
            async for message in messages:
                if message.question is not None or message.closed is not None:
                    await send(b"data: " + msgspec.json.encode(message) + b"\n\n")
        await send(b":\n\n")  # the run is between listeners (starting, or just ended)
        await trio.sleep(0.2)


def _graph_svg(source: RepositoryRuns, run_id: str) -> bytes:
    """The run's recorded graph, drawn by Graphviz."""
    from fabro_git.errors import ToolMissing
    from fabro_git.workflow.drawing import graphviz, render_dot
    from fabro_git.workflow.parser import parse

    try:
        return graphviz(render_dot(parse(source.open(run_id).source)), "svg")
    except ToolMissing as exc:
        # The command's hint names its --format option; here the page is the way back.
        raise ToolMissing(
            exc.message,
            hint="install Graphviz (apt-get install graphviz, brew install graphviz), "
            "then reload the page; the rest of the run's page works without it",
        ) from None


def _run_view(source: RepositoryRuns, run_id: str) -> dict[str, object]:
    """A run as its page shows it: its summary, its stages as its events tell them
    (the one in flight too) and each node's status and visits."""
    from fabro_git.web import stages as stage_view

    run = source.open(run_id)
    stages = stage_view.run_stages(event.envelope for event in run.iter_events())
    return {**source.summary(run), "stages": stages.rows, "nodes": stages.nodes}


def _stage_view(source: RepositoryRuns, run_id: str, stage_id: str) -> JsonObject | None:
    """One stage: what its events say, and once it is recorded its prompt, reply,
    command output, diff and artifacts as the run reader reads them."""
    from fabro_git.engine import reader
    from fabro_git.errors import ConfigError
    from fabro_git.web import stages as stage_view

    run = source.open(run_id)
    found = stage_view.stage_details((event.envelope for event in run.iter_events()), stage_id)
    if found is None:
        return None
    try:
        recorded: reader.Stage | None = run.stage(stage_id)
    except ConfigError:
        recorded = None
    name, _, visit = stage_id.partition("@")
    in_flight = reader.Stage("", name, int(visit) if visit.isdigit() else 1, {})
    found["transcript"] = [
        {
            "kind": entry.kind,
            "depth": entry.depth,
            "text": entry.text,
            "tool_name": entry.tool_name,
            "arguments": entry.arguments,
            "is_error": entry.is_error,
        }
        for entry in reader.transcript(run.iter_events(), recorded or in_flight)
    ]
    found["artifacts"] = []
    if recorded is None:
        return found

    def text(name: str) -> str | None:
        data = run.stage_file(recorded, name)
        return data.decode("utf-8", "replace") if data is not None else None

    found["prompt"] = text("prompt.md") or found["prompt"]
    found["reply"] = text("response.md") or found["reply"]
    found["command_output"] = text("stdout.log") or found["command_output"]
    found["command_stderr"] = text("stderr.log") or found["command_stderr"]
    found["diff"] = run.stage_diff(recorded) or found["diff"]
    if recorded.files_touched:
        found["files_touched"] = list(recorded.files_touched)
    if recorded.usage:
        found["usage"] = recorded.usage
    found["artifacts"] = [
        item.to_json() for item in reader.stage_artifacts(run.artifacts(), recorded)
    ]
    return found


class _Download(NamedTuple):
    """An artifact as it is sent: the name a client saves it under, and a copy of it."""

    name: str
    body: BinaryIO  # at its start
    size: int


def _artifact(source: RepositoryRuns, run_id: str, path: str) -> _Download | None:
    """An artifact the run reader lists, by its path in the run's artifact tree, copied
    to a temporary file: a big one streamed from git, however big it is."""
    run = source.open(run_id)
    for item in run.artifacts():
        if item.tree_path == path:
            with contextlib.ExitStack() as unsent:
                spool = unsent.enter_context(tempfile.SpooledTemporaryFile(SPOOL_BYTES))
                body = cast("BinaryIO", spool)  # as it is: typeshed says only IO[bytes]
                if not run.copy_artifact(item, body):
                    return None
                size = body.tell()
                body.seek(0)
                unsent.pop_all()
            # A header value is Latin-1 (any other letter failed the response): ASCII
            # letters and digits only, which every client saves under the same name.
            shown = "".join(
                ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in item.name
            )
            return _Download(shown[-100:], body, size)
    return None


async def _send_file(body: BinaryIO, send: Callable[[bytes], Awaitable[None]]) -> None:
    """Send an open file's bytes, a block at a time, each read on a worker thread (a copy
    past SPOOL_BYTES is on disk); closed once sent, or once the client has gone."""
    with body:
        while block := await _blocking(body.read, SPOOL_BYTES):
            await send(block)
