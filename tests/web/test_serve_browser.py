"""`git fabro serve` in a real headless Chromium (Debian's `chromium`, driven by
Playwright): the run list, a node going from running to succeeded as the run goes on,
a gate answered by a click, hostile run output shown as text, and 403 without the token.

Few tests, each through the real command: a browser is slow to start. Without Chromium
they skip and say why; `.ci/run` installs it, so there they run. With
SERVE_SCREENSHOT=PATH the run-page test saves its screenshot there (the README's
docs/serve.png is made so).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import run_events, run_fabro, write_workflow
from llm_server import LlmServer, Reply, ToolUse

from web.serving import (
    WAITING_WORKFLOW,
    Server,
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
    """A browser tab on the server, signed in through the printed address; it records
    the page's console errors (a CSP violation is one) and failed scripts."""

    def __init__(self, browser: Any, server: Server) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.server = server
        self.page.goto(server.url)

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
    stranger = browser.new_context()
    try:
        response = stranger.new_page().goto(server.base + "/")
        assert response.status == 403
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
