"""`git fabro serve` in a real headless Chromium (Debian's `chromium`, driven by
Playwright): the run list, a node going from running to succeeded as the run goes on,
a gate answered by a click, hostile run output shown as text, nothing without the token,
and the token kept in the tab (no cookie, out of the address bar, never sent to another
server on 127.0.0.1).

Few tests, each through the real command: a browser is slow to start. Without Chromium
they skip and say why; `.ci/run` installs it, so there they run. With
SERVE_SCREENSHOT=PATH the run-page test saves its screenshot there (the README's
docs/serve.png is made so).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import run_events, run_fabro, wait_until, write_workflow
from llm_server import LlmServer, Reply, ToolUse

from web.serving import (
    WAITING_WORKFLOW,
    Server,
    request,
    start_server,
    start_waiting_run,
    without_graphviz,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (it is in the test extra)")
    with sync_playwright() as driver:
        try:
            launched = driver.chromium.launch(
                executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                args=ARGS,
            )
        except Exception as exc:  # the reason Chromium cannot start, said in the skip
            pytest.skip(f"Chromium cannot start here: {str(exc).splitlines()[0]}")
        yield launched
        launched.close()


class Page:
    """A browser tab on the server, signed in through the printed address (or `address`);
    it records the page's console errors (a CSP violation is one) and failed scripts,
    and every request it makes and answer it gets."""

    def __init__(self, browser: Any, server: Server, address: str | None = None) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[Any] = []
        self.responses: list[Any] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("request", lambda request: self.requests.append(request))
        self.page.on("response", lambda response: self.responses.append(response))
        self.server = server
        self.page.goto(address or server.url)

    def open_run(self, run_id: str) -> Any:
        self.page.goto(f"{self.server.base}/runs/{run_id}")
        return self.page

    def close(self) -> None:
        self.context.close()
        assert self.errors == []


@pytest.fixture
def server(repo: Path) -> Iterator[Server]:
    running = start_server(repo)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def tab(browser: Any, server: Server) -> Iterator[Page]:
    opened = Page(browser, server)
    try:
        yield opened
    finally:
        opened.close()


def test_the_run_list_loads_and_no_token_is_forbidden(
    repo: Path, browser: Any, server: Server
) -> None:
    done = run_fabro("run", "human-gate", "--answer", "A", "--label", "team=docs", cwd=repo)
    assert done.returncode == 0, done.stderr
    # A tab without the token gets the page, which holds no run, and no run from it.
    stranger = browser.new_context()
    try:
        page = stranger.new_page()
        refused = []
        page.on("response", lambda r: "/api/" in r.url and refused.append(r.status))
        assert page.goto(server.base + "/").status == 200
        said = page.locator("#problem")
        said.wait_for()
        assert "this tab holds no token: open the address" in said.inner_text()
        assert page.locator("#runs tbody tr").count() == 0 and refused and set(refused) == {403}
    finally:
        stranger.close()

    tab = Page(browser, server)
    page = tab.page
    assert page.url == server.base + "/"  # the token left the address bar
    row = page.locator("#runs tbody tr")
    row.first.wait_for()
    assert row.count() == 1
    assert "human-gate" in row.first.inner_text() and "succeeded" in row.first.inner_text()
    assert "team=docs" in row.first.inner_text()
    page.fill("#filter-label", "team=ops")
    page.locator("#runs tbody tr").first.wait_for(state="detached")
    page.fill("#filter-label", "team=docs")
    page.locator("#runs tbody tr").first.wait_for()

    # Live: a run started now appears, runs and succeeds on the page as it goes, under
    # the filter, without a reload and without the page reading the list again.
    asked = []
    page.on("request", lambda r: r.url.split("?")[0].endswith("/api/runs") and asked.append(r))
    release = repo.parent / "release-live"
    write_workflow(repo, WAITING_WORKFLOW % release, "waiting.fabro")
    started = run_fabro("run", "waiting.fabro", "-d", "--label", "team=docs", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    row = page.locator(f'#runs tbody tr[data-run="{run_id}"]')
    row.locator(".status-running").wait_for()
    assert page.locator("#runs tbody tr").count() == 2
    release.touch()
    row.locator(".status-succeeded").wait_for()
    assert "waiting" in row.inner_text() and "team=docs" in row.inner_text()
    assert asked == []  # rows came from the event stream, not a poll of the list
    tab.close()


def test_a_node_turns_from_running_to_succeeded_while_the_run_goes_on(
    repo: Path, server: Server, tab: Page
) -> None:
    run_id, release = start_waiting_run(repo)
    page = tab.open_run(run_id)
    node = '#graph g.node[data-node="hold"]'
    page.wait_for_selector(f'{node}[data-status="running"]', state="attached")
    page.wait_for_selector(
        '#graph g.node[data-node="prepare"][data-status="succeeded"]', state="attached"
    )
    assert (
        page.locator('#graph g.node[data-node="finish"]').get_attribute("data-status") == "pending"
    )
    assert page.locator("#run-status").inner_text() == "running"
    assert page.locator("#controls").is_visible()  # steer and interrupt, while it runs
    shot = os.environ.get("SERVE_SCREENSHOT")
    if shot:  # the README's picture: a run in flight
        page.locator('#timeline li[data-stage="prepare@1"] button').click()
        page.wait_for_selector('#stage[data-stage="prepare@1"] pre')
        page.screenshot(path=shot)

    release.touch()  # the stage may finish now
    page.wait_for_selector(f'{node}[data-status="succeeded"]', state="attached")
    page.wait_for_selector("#run-status .status-succeeded")
    page.wait_for_selector('#timeline li[data-stage="finish@1"][data-status="succeeded"]')
    page.locator('#timeline li[data-stage="hold@1"] button').click()
    page.wait_for_selector('#stage[data-stage="hold@1"] pre')
    assert "released" in page.locator("#stage-body").inner_text()
    page.wait_for_selector('#events tbody tr[data-event="run.completed"]')
    assert page.locator("#controls").is_hidden()


def test_a_gate_is_answered_by_clicking_and_the_run_goes_on(
    repo: Path, server: Server, tab: Page
) -> None:
    started = run_fabro("run", "human-gate", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    page = tab.open_run(run_id)
    page.wait_for_selector("#gate:not([hidden])")
    assert page.locator("#gate-question").inner_text() == "Publish these notes?"
    assert "- First draft." in page.locator("#gate-details").inner_text()  # the diff so far
    page.locator('#gate-choices button[data-key="A"]').click()
    page.wait_for_selector("#run-status .status-succeeded")
    page.wait_for_selector("#gate", state="hidden")
    (answered,) = [e for e in run_events(run_id, repo) if e["event"] == "interview.completed"]
    assert answered["properties"]["answer"] == "A"


HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2"> & done'


def test_a_hostile_reply_and_output_are_shown_as_text(
    repo: Path, llm_server: LlmServer, server: Server, tab: Page
) -> None:
    """A model's reply, a tool call's arguments, a command's output and a node's label
    all holding markup: the page shows the characters, and nothing of it runs."""
    script = json.dumps(f"printf '%s\\n' '{HOSTILE}'")
    label = json.dumps(HOSTILE)
    write_workflow(
        repo,
        "digraph Hostile {\n"
        "  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        f'  ask [shape=box, label={label}, model="sonnet", prompt="Say it"]\n'
        f"  say [shape=parallelogram, script={script}]\n"
        "  start -> ask -> say -> exit\n}\n",
        "hostile.fabro",
    )
    llm_server.script(
        Reply(text="Looking.", tool_calls=(ToolUse("read_file", {"path": HOSTILE}, id="t1"),)),
        Reply(text=HOSTILE),
    )
    done = run_fabro("run", "hostile.fabro", cwd=repo)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])["run_id"]
    page = tab.open_run(run_id)
    page.locator('#timeline li[data-stage="ask@1"] button').click()
    reply = page.locator('#stage[data-stage="ask@1"] pre.reply')
    reply.wait_for()
    assert reply.inner_text() == HOSTILE  # the characters, not markup
    transcript = page.locator("#stage-body .transcript").inner_text()
    assert "read_file" in transcript and json.dumps(HOSTILE)[1:-1] in transcript
    page.locator('#timeline li[data-stage="say@1"] button').click()
    output = page.locator('#stage[data-stage="say@1"] pre.output').first
    output.wait_for()
    assert output.inner_text().strip() == HOSTILE
    assert HOSTILE in page.locator('#timeline li[data-stage="ask@1"]').inner_text()
    assert HOSTILE in page.locator('#graph g.node[data-node="ask"]').text_content()
    page.wait_for_selector('#events tbody tr[data-event="run.completed"]')
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img, main script").count() == 0


def test_steer_and_interrupt_are_clicked_and_the_run_takes_them(
    repo: Path, llm_server: LlmServer, hermetic_env: Path, server: Server, tab: Page
) -> None:
    """Steer while the agent's shell tool holds: the text reaches the model's next
    request. Then interrupt while a command stage holds: the run stops at a checkpoint,
    and `ps` says interrupted."""
    go = hermetic_env / "go"
    release = repo.parent / "release-never"
    wait = f"while [ ! -e '{go}' ]; do sleep 0.02; done"
    hold = f"while [ ! -e '{release}' ]; do sleep 0.02; done"
    write_workflow(
        repo,
        "digraph Steered {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  work [shape=box, model="sonnet", permissions="full", prompt="Tidy the notes"]\n'
        f"  hold [shape=parallelogram, script={json.dumps(hold)}]\n"
        "  start -> work -> hold -> exit\n}\n",
        "steered.fabro",
    )
    llm_server.script(
        Reply(text="Waiting.", tool_calls=(ToolUse("shell", {"command": wait}, id="t1"),)),
        Reply(text="Done, the other way."),
    )
    started = run_fabro("run", "steered.fabro", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    try:
        page = tab.open_run(run_id)
        page.wait_for_selector('#events tbody tr[data-event="agent.tool.started"]')
        page.fill("#steer-text", "use the other approach")
        page.click("#steer")
        page.wait_for_selector("#control-said:has-text('takes it before its next turn')")
    finally:
        go.touch()  # the tool call ends; the agent's next turn carries the steering
    page.wait_for_selector('#timeline li[data-stage="hold@1"][data-status="running"]')
    assert "use the other approach" in json.dumps(llm_server.requests[-1].body)
    page.click("#interrupt")
    page.wait_for_selector("#control-said:has-text('stopping at a checkpoint')")
    page.wait_for_selector("#run-status .status-interrupted")
    waited = run_fabro("wait", run_id, cwd=repo)
    assert waited.returncode == 130, waited.stderr
    (row,) = [json.loads(line) for line in run_fabro("ps", "--json", cwd=repo).stdout.splitlines()]
    assert row["status"] == "interrupted"
    events = run_events(run_id, repo)
    (injected,) = [e for e in events if e["event"] == "agent.steering.injected"]
    assert injected["properties"]["text"] == "use the other approach"
    (interrupted,) = [e for e in events if e["event"] == "run.interrupt"]
    assert interrupted["actor"]["kind"] == "user"
    page.wait_for_selector("#controls", state="hidden")


def test_without_graphviz_the_run_page_says_what_to_do(
    repo: Path, browser: Any, tmp_path: Path
) -> None:
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    running = start_server(repo, env=without_graphviz(tmp_path))
    try:
        tab = Page(browser, running)
        run_id = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])["run_id"]
        page = tab.open_run(run_id)
        said = page.locator("#graph-problem")
        said.wait_for()
        assert said.inner_text() == (
            "no drawing: Graphviz's `dot` is needed to render svg but is not on PATH; "
            "install Graphviz (apt-get install graphviz, brew install graphviz), then reload "
            "the page; the rest of the run's page works without it"
        )
        page.wait_for_selector('#timeline li[data-stage="publish@1"]')  # the rest is there
        # The browser logs the drawing's 500 itself; nothing else went wrong.
        assert tab.errors == [
            "Failed to load resource: the server responded with a status of 500 ()"
        ]
        tab.errors.clear()
        tab.close()
    finally:
        running.stop()


class OtherServer:
    """Another server on 127.0.0.1, on a port of its own (another user's, say): it
    answers every request and keeps the headers it was sent."""

    def __init__(self) -> None:
        heard = self.heard = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                heard.append(str(self.headers))
                body = b"<!doctype html><title>another server</title>\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def _assert_no_token_in_history(page: Any, address: str) -> None:
    """The tab shows `address`, and its history holds it and the blank tab it came from:
    no address with the token in it."""
    assert page.url == address
    assert page.evaluate("history.length") == 2
    page.go_back()
    assert page.url == "about:blank"
    page.go_forward()
    assert page.url == address


def test_the_token_stays_in_the_tab_not_a_cookie(repo: Path, browser: Any, server: Server) -> None:
    """Opening the printed address signs the tab in and leaves no cookie: a cookie is the
    host's, whatever its port, so the browser would give it to any server on 127.0.0.1.
    The run's page follows its events live through the token's header, and when its
    stream breaks it asks again from after the last event it had (Last-Event-ID)."""
    run_id, release = start_waiting_run(repo)
    # The run's first events, while it holds: the page's first stream is cut after them.
    stream = request(server, f"/api/runs/{run_id}/events", stream=True)
    first = [stream.next_message() for _ in range(3)]
    stream.close()
    other = OtherServer()
    tab = Page(browser, server)
    try:
        page = tab.page
        page.locator(f'#runs tbody tr[data-run="{run_id}"]').wait_for()  # signed in
        # Another server on this host, opened in the same browser, is told nothing.
        elsewhere = tab.context.new_page()
        elsewhere.goto(other.url)
        elsewhere.close()
        assert other.heard and not any(server.token in said for said in other.heard)
        assert page.evaluate("document.cookie") == "" and tab.context.cookies() == []
        assert [r.url for r in tab.responses if r.header_value("set-cookie")] == []
        _assert_no_token_in_history(page, server.base + "/")
        assert page.evaluate("sessionStorage.getItem('fabro-token')") == server.token
        cut = []

        def cut_first(route: Any) -> None:
            if cut:
                route.continue_()
                return
            cut.append(route.request.url)
            body = "retry: 50\n\n" + "".join(f"id: {m['id']}\ndata: {m['data']}\n\n" for m in first)
            route.fulfill(status=200, content_type="text/event-stream", body=body)

        page.route(f"**/api/runs/{run_id}/events", cut_first)
        streams = []

        def second_stream(request: Any) -> bool:
            if request.url.endswith(f"/api/runs/{run_id}/events"):
                streams.append(request)
            return len(streams) == 2

        with page.expect_request(second_stream) as again:
            page.locator(f'#runs tbody tr[data-run="{run_id}"] a').click()
        assert cut and again.value.header_value("last-event-id") == first[-1]["id"]
        page.wait_for_selector('#timeline li[data-stage="hold@1"][data-status="running"]')
        release.touch()
        page.wait_for_selector('#events tbody tr[data-event="run.completed"]')
        assert run_fabro("wait", run_id, cwd=repo).returncode == 0
        printed = run_fabro("logs", run_id, cwd=repo).stdout.splitlines()
        shown = (
            "n => Number(document.getElementById('event-count').textContent.split(' of ')[1]) >= n"
        )
        page.wait_for_function(shown, arg=len(printed))
        total = page.locator("#event-count").inner_text().split(" of ")[1]
        assert int(total) == len(printed)  # every event once: none lost, none twice

        # Every request for the run's data carried the token as a header, none a cookie,
        # and no answer set one.
        assert page.evaluate("document.cookie") == "" and tab.context.cookies() == []
        assert [r.url for r in tab.responses if r.header_value("set-cookie")] == []
        assert all(r.header_value("cookie") is None for r in tab.requests)
        data = [r for r in tab.requests if "/api/" in r.url]
        assert data and all(
            r.header_value("authorization") == f"Bearer {server.token}" for r in data
        )
        tab.close()
    finally:
        other.close()

    # The address with the token in its fragment, which no request carries: in a new
    # tab, straight to a run's page.
    fresh = Page(browser, server, f"{server.base}/runs/{run_id}#token={server.token}")
    fresh.page.wait_for_selector("#run-status .status-succeeded")
    _assert_no_token_in_history(fresh.page, f"{server.base}/runs/{run_id}")
    assert fresh.context.cookies() == []
    fresh.close()


def test_an_artifact_is_downloaded_with_the_token(repo: Path, server: Server, tab: Page) -> None:
    write_workflow(
        repo,
        "digraph Big {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  first [shape=parallelogram, script="seq 1 30000"]\n'
        "  start -> first -> exit\n}\n",
    )
    done = run_fabro("run", "wf.fabro", cwd=repo)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(run_fabro("ps", "--json", cwd=repo).stdout.splitlines()[0])["run_id"]
    page = tab.open_run(run_id)
    page.locator('#timeline li[data-stage="first@1"] button').click()
    button = page.locator('#stage button[data-artifact="first/values/command.output.json"]')
    with page.expect_download() as started:
        button.click()
    saved = started.value
    assert saved.suggested_filename == "command.output.json"
    assert json.loads(Path(saved.path()).read_text()) == "".join(f"{n}\n" for n in range(1, 30_001))
    assert tab.context.cookies() == []  # the token went as a header


def test_open_signs_the_browser_in_without_a_cookie(
    repo: Path, browser: Any, tmp_path: Path
) -> None:
    """`--open` hands the browser a private page that sends it on to the address: the
    tab lands on the run list, signed in, with the token neither in a cookie nor in the
    address bar."""
    seen = tmp_path / "browser-argv"
    fake = tmp_path / "browser"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}.tmp && mv {seen}.tmp {seen}\n')
    fake.chmod(0o755)
    started = start_server(repo, "--open", env={"BROWSER": str(fake)})
    try:
        argv = wait_until(lambda: seen.exists() and seen.read_text(), what="the browser's start")
        tab = Page(browser, started, argv.strip())
        tab.page.wait_for_url(started.base + "/")
        tab.page.wait_for_function("() => document.getElementById('run-count').textContent !== ''")
        assert tab.page.locator("#run-count").inner_text() == "0 of 0 runs"  # signed in
        assert tab.context.cookies() == []
        assert [r.url for r in tab.responses if r.header_value("set-cookie")] == []
        tab.close()
    finally:
        started.stop()
