"""The web view's routes, its guard (token, origin, CSP) and its SSE responses.

Pages are static files of this package, picked from a fixed list (no URL path reaches
the file system); they fetch JSON and events and put run data into the page as text.
Every request needs the server's token: the URL printed at start holds it once, the
answer sets it as an HttpOnly, SameSite=Strict cookie and sends the browser on to the
same page without it. A request that changes something also needs its Origin to be
this server, and JSON.
"""

from __future__ import annotations

import getpass
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from fabro_git.web.feeds import Feeds, all_runs_stream, run_stream
from fabro_git.web.source import RunSource

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


def cookie_name(port: int) -> str:
    # Cookies ignore ports: two servers on one host would share one cookie otherwise.
    return f"fabro_token_{port}"


class Guard:
    """Lets a request through only with the token, and a state-changing one only from
    this server's own pages; puts the security headers on every answer."""

    def __init__(self, app: ASGIApp, token: str, port: int) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_name(port)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in {h for h, _ in SECURITY_HEADERS}
                ]
                message = {**message, "headers": headers + SECURITY_HEADERS}
            await send(message)

        request = Request(scope)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        offered = query.get("token")
        if offered is not None and self._matches(offered) and request.method in SAFE_METHODS:
            # The printed URL: keep the token as a cookie and drop it from the address bar
            # (and from the browser's history).
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            location = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
            response: Response = Response(status_code=303, headers={"location": location})
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send_secured)
            return
        if not self._matches(request.cookies.get(self.cookie, "")) and not self._bearer(request):
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


class SseResponse(Response):
    """A `text/event-stream` answer written by `produce(send)`; it stops when the client
    hangs up (the producer is cancelled) or when the producer returns."""

    media_type = "text/event-stream"

    def __init__(self, produce: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]):
        # No Content-Length: the body goes on until the producer is done.
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]
        self.produce = produce

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def body(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async with trio.open_nursery() as nursery:

            async def until_hangup() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_hangup)
            try:
                await self.produce(body)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass  # the client went away mid-write
            nursery.cancel_scope.cancel()


def _package_file(name: str) -> bytes:
    return (resources.files("fabro_git.web") / "static" / name).read_bytes()


def build(
    source: RunSource, token: str, port: int
) -> tuple[ASGIApp, Callable[[trio.Nursery], None]]:
    """The guarded app, and the call that gives it the nursery its run feeds live in
    (made when the server starts)."""
    from fabro_git.store.runs import is_run_id
    from fabro_git.web import stages as stage_view

    state: dict[str, Feeds] = {}

    def feeds() -> Feeds:
        return state["feeds"]

    def start(nursery: trio.Nursery) -> None:
        state["feeds"] = Feeds(source, nursery)

    async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args)

    async def known_run(request: Request) -> str | None:
        run_id = str(request.path_params["run_id"])
        if not is_run_id(run_id) or not await blocking(source.exists, run_id):
            return None
        return run_id

    def no_run() -> Response:
        return JSONResponse({"error": "no such run in this repository"}, status_code=404)

    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            data = await blocking(_package_file, PAGES[name])
            return Response(data, media_type="text/html; charset=utf-8")

        return endpoint

    async def static(request: Request) -> Response:
        name = str(request.path_params["name"])
        if name not in STATIC:
            return PlainTextResponse("not found\n", status_code=404)
        data = await blocking(_package_file, name)
        return Response(data, media_type=STATIC[name], headers={"cache-control": "no-cache"})

    async def runs(request: Request) -> Response:
        return _json(await blocking(source.rows))

    async def events_of(run_id: str) -> list[dict[str, Any]]:
        data, _offset = await blocking(source.events, run_id)
        return stage_view.envelopes(data)

    async def run(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        summary = await blocking(source.summary, run_id)
        events = await events_of(run_id)
        summary = {k: v for k, v in summary.items() if k != "graph_source"}
        return _json(
            {
                **summary,
                "stages": stage_view.stage_rows(events),
                "nodes": stage_view.node_states(events),
            }
        )

    async def stages(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        return _json(stage_view.stage_rows(await events_of(run_id)))

    async def stage(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        found = stage_view.stage_details(
            await events_of(run_id), str(request.path_params["stage_id"])
        )
        if found is None:
            return JSONResponse({"error": "no such stage in this run"}, status_code=404)
        return _json(found)

    async def graph(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        svg = await blocking(_graph_svg, source, run_id)
        return Response(svg, media_type="image/svg+xml")

    async def run_events(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        last_id = request.headers.get("last-event-id") or request.query_params.get("after")
        return SseResponse(lambda send: run_stream(feeds(), run_id, last_id, send))

    async def every_event(request: Request) -> Response:
        last_id = request.headers.get("last-event-id") or request.query_params.get("after")
        return SseResponse(lambda send: all_runs_stream(feeds(), last_id, send))

    async def gates(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        return SseResponse(lambda send: _gates(source, run_id, send))

    async def act(request: Request) -> Response:
        run_id = await known_run(request)
        if run_id is None:
            return no_run()
        body = await request.body()
        try:
            payload = json.loads(body) if len(body) <= MAX_BODY else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return JSONResponse({"error": "expected a JSON object"}, status_code=400)
        action = str(request.path_params["action"])
        message = _control_message(action, payload)
        if message is None:
            return JSONResponse({"error": f"cannot {action} with that"}, status_code=400)
        if not await blocking(source.live, run_id):
            return JSONResponse({"error": f"run {run_id} is not running here"}, status_code=409)
        from fabro_git.engine import control

        reply = await blocking(control.request, source.scratch(run_id), message)
        if reply is None:
            return JSONResponse(
                {"error": f"run {run_id} does not answer on its control socket"}, status_code=503
            )
        return _json(reply)

    routes = [
        Route("/", page("runs")),
        Route("/runs/{run_id}", page("run")),
        Route("/static/{name}", static),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/api/runs", runs),
        Route("/api/events", every_event),
        Route("/api/runs/{run_id}", run),
        Route("/api/runs/{run_id}/stages", stages),
        Route("/api/runs/{run_id}/stages/{stage_id}", stage),
        Route("/api/runs/{run_id}/graph.svg", graph),
        Route("/api/runs/{run_id}/events", run_events),
        Route("/api/runs/{run_id}/gates", gates),
        Route("/api/runs/{run_id}/{action}", act, methods=["POST"]),
    ]
    return Guard(Starlette(routes=routes), token, port), start


def _json(value: Any) -> Response:
    return Response(
        json.dumps(value, ensure_ascii=False).encode("utf-8"),
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def _actor() -> dict[str, Any]:
    try:
        login: str | None = getpass.getuser()
    except (KeyError, OSError):
        login = None
    return {"login": login, "via": "web"}


def _control_message(action: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The control request for a button: answer a gate, steer, interrupt."""
    if action == "answer":
        gate_id, text = payload.get("id"), payload.get("text")
        if not isinstance(gate_id, int) or not isinstance(text, str) or not text.strip():
            return None
        return {"op": "answer", "id": gate_id, "text": text}
    if action == "steer":
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            return None
        return {"op": "steer", "text": text, "actor": _actor()}
    if action == "interrupt":
        return {"op": "interrupt", "actor": _actor()}
    return None


async def _gates(source: RunSource, run_id: str, send: Callable[[bytes], Awaitable[None]]) -> None:
    """The run's human gates as they open and close, one SSE message each, while it
    lives (the control socket's `attach` stream, as `git fabro attach` reads it)."""
    from fabro_git.engine import control

    scratch = source.scratch(run_id)
    while await trio.to_thread.run_sync(source.live, run_id):
        async for message in control.subscribe(scratch, {"op": "attach"}):
            if "question" in message or "closed" in message:
                data = json.dumps(message, ensure_ascii=False)
                await send(f"data: {data}\n\n".encode())
        await send(b":\n\n")  # the run is between listeners (starting, or just ended)
        await trio.sleep(0.2)


def _graph_svg(source: RunSource, run_id: str) -> bytes:
    """The run's recorded graph, drawn by Graphviz."""
    from fabro_git.workflow.drawing import graphviz, render_dot
    from fabro_git.workflow.parser import parse

    graph_source = str(source.summary(run_id)["graph_source"])
    return graphviz(render_dot(parse(graph_source)), "svg")
