"""`git fabro serve`'s streams and guard, spoken to as plain HTTP (no browser).

Each SSE message carries one envelope: `data:` exactly the line `git fabro logs` prints
and `id:` its id; a finished run replays and ends, a live one replays then follows to
its end; `Last-Event-ID` resumes after that event; a client that hangs up mid-stream
costs the others nothing. Without the token (a header: a cookie is none) everything but
the pages, which hold no run data, is 403; a change needs this server's Origin.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from helpers import git, run_events, run_fabro, wait_until, write_workflow

from web.serving import (
    Server,
    get_json,
    request,
    start_server,
    start_waiting_run,
    without_graphviz,
)


@pytest.fixture
def server(repo: Path) -> Iterator[Server]:
    running = start_server(repo)
    try:
        yield running
    finally:
        running.stop()


def _logs(run_id: str, repo: Path) -> list[str]:
    proc = run_fabro("logs", run_id, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _events(body: bytes) -> list[dict[str, str]]:
    """The SSE messages of a whole body."""
    out = []
    for block in body.decode("utf-8").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":")
        )
        if fields:
            out.append(fields)
    return out


def test_a_finished_runs_stream_is_what_logs_prints_then_ends(repo: Path, server: Server) -> None:
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    (row,) = get_json(server, "/api/runs")
    run_id = row["run_id"]
    assert row["status"] == "succeeded" and row["live"] is False

    response = request(server, f"/api/runs/{run_id}/events", stream=True)
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    messages = list(response.events())  # it ends by itself: the run is over
    printed = _logs(run_id, repo)
    assert [m["data"] for m in messages] == printed
    assert [m["id"] for m in messages] == [json.loads(line)["id"] for line in printed]

    # Resumed after the fifth event: exactly the rest.
    again = request(
        server, f"/api/runs/{run_id}/events", headers={"Last-Event-ID": messages[4]["id"]}
    )
    assert [m["data"] for m in _events(again.buffer)] == printed[5:]


def test_an_http_1_0_client_gets_the_whole_stream_and_its_end(repo: Path, server: Server) -> None:
    """HTTP/1.0 has no chunks: a body without a length ends when the server closes the
    connection, so a finished run's stream must be closed, not left open."""
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    (row,) = get_json(server, "/api/runs")
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    sock.sendall(
        f"GET /api/runs/{row['run_id']}/events HTTP/1.0\r\n"
        f"Authorization: Bearer {server.token}\r\n\r\n".encode()
    )
    received = b""
    try:
        while chunk := sock.recv(65536):  # until the server closes it
            received += chunk
    except TimeoutError:
        raise AssertionError(f"not closed; {len(received)} bytes so far") from None
    finally:
        sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"200"
    assert b"transfer-encoding" not in head.lower()
    assert [m["data"] for m in _events(body)] == _logs(row["run_id"], repo)


def test_a_live_run_streams_as_it_goes_and_a_client_may_hang_up(repo: Path, server: Server) -> None:
    run_id, release = start_waiting_run(repo)
    watcher = request(server, f"/api/runs/{run_id}/events", stream=True)
    leaver = request(server, f"/api/runs/{run_id}/events", stream=True)
    # Both see the run reach the stage that waits, while it waits.
    for client in (watcher, leaver):
        for message in client.events():
            event = json.loads(message["data"])
            if event["event"] == "stage.started" and event.get("node_id") == "hold":
                break
    leaver.close()  # gone mid-stream
    resumed_after = None
    seen = []
    release.touch()
    for message in watcher.events():
        seen.append(message)
        if json.loads(message["data"])["event"] == "stage.completed" and resumed_after is None:
            resumed_after = message["id"]
    watcher.close()
    assert json.loads(seen[-1]["data"])["event"] in ("run.completed", "metadata.snapshot.completed")
    printed = _logs(run_id, repo)
    assert any(json.loads(line)["event"] == "run.completed" for line in printed)

    # The whole stream, replayed now that the run is over, is what logs prints; and
    # resuming after an event met while following gives the rest of it.
    full = request(server, f"/api/runs/{run_id}/events")
    assert [m["data"] for m in _events(full.buffer)] == printed
    assert resumed_after is not None
    rest = request(server, f"/api/runs/{run_id}/events", headers={"Last-Event-ID": resumed_after})
    ids = [json.loads(line)["id"] for line in printed]
    assert [m["data"] for m in _events(rest.buffer)] == printed[ids.index(resumed_after) + 1 :]
    # The server carried on after the client that left.
    assert get_json(server, f"/api/runs/{run_id}")["status"] == "succeeded"


def test_every_runs_events_come_on_one_stream(repo: Path, server: Server) -> None:
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    # From now on: the finished run's events are not replayed, the next run's come.
    from_now = request(server, "/api/events?from=now", stream=True)
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    first = json.loads(from_now.next_message()["data"])  # type: ignore[index]
    from_now.close()
    assert first["run_id"] == get_json(server, "/api/runs")[0]["run_id"]  # the newest
    assert first["event"] == "run.created"
    runs = get_json(server, "/api/runs")
    expected = sum(len(_logs(row["run_id"], repo)) for row in runs)
    stream = request(server, "/api/events", stream=True)
    got = []
    while len(got) < expected:
        message = stream.next_message()
        assert message is not None
        got.append(json.loads(message["data"]))
    stream.close()
    assert {event["run_id"] for event in got} == {row["run_id"] for row in runs}


def test_every_runs_stream_from_now_takes_up_a_run_that_is_resumed(
    repo: Path, server: Server
) -> None:
    run_id, release = start_waiting_run(repo)
    watching = request(server, f"/api/runs/{run_id}/events", stream=True)
    for message in watching.events():  # the run holds at its waiting stage
        event = json.loads(message["data"])
        if event["event"] == "stage.started" and event.get("node_id") == "hold":
            break
    watching.close()
    assert run_fabro("interrupt", run_id, cwd=repo).returncode == 0
    assert run_fabro("wait", run_id, cwd=repo).returncode == 130
    from_now = request(server, "/api/events?from=now", stream=True)
    resumed = run_fabro("resume", run_id, "-d", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    try:
        first = json.loads(from_now.next_message()["data"])  # type: ignore[index]
        assert first["run_id"] == run_id
        printed = _logs(run_id, repo)
        ids = [json.loads(line)["id"] for line in printed]
        # The resumed run's first event, not one of before.
        assert ids.index(first["id"]) > max(
            i for i, line in enumerate(printed) if json.loads(line)["event"] == "run.interrupt"
        )
    finally:
        from_now.close()
        release.touch()
        assert run_fabro("wait", run_id, cwd=repo).returncode == 0


def test_no_token_no_answer_and_changes_need_this_origin(repo: Path, server: Server) -> None:
    for path in ("/api/runs", "/api/events", "/api/runs/x", "/api/runs/x/events", "/nope"):
        response = request(server, path, token=False)
        assert response.status == 403, path
        assert b"token" in response.body()
    # A page whose name was pointed at 127.0.0.1 (DNS rebinding) is turned away, token
    # or not; loopback names are this server, on any port (a tunnel's).
    for host, status in (("evil.example:80", 421), ("localhost:9000", 200), ("[::1]", 200)):
        assert request(server, "/api/runs", headers={"Host": host}).status == status, host
    assert request(server, "/", token=False, headers={"Host": "evil.example"}).status == 421

    # The address it sends the browser on to stays on this server, whatever the path.
    query = f"token={server.token}"
    # Percent-encoded as it came: a decoded letter of another script made the header
    # fail, and a decoded CR LF would have ended it.
    for path, kept in (
        ("//evil.example/x", "/evil.example/x"),
        ("/runs/x", "/runs/x"),
        ("/r%C3%A9sum%C3%A9", "/r%C3%A9sum%C3%A9"),
        ("/%E5%A0%B1", "/%E5%A0%B1"),
        ("/a%0D%0ASet-Cookie:%20x=1", "/a%0D%0ASet-Cookie%3A%20x%3D1"),
    ):
        entry = request(server, f"{path}?{query}", token=False)
        assert entry.status == 303, path
        assert entry.headers["location"] == f"{kept}#token={server.token}", path
        assert "set-cookie" not in entry.headers, path
    page = request(server, "/", token=False)  # the page holds nothing of a run
    assert page.status == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert b"<script" in page.body() and b"<script>" not in page.buffer  # no inline script

    # A change with the token but from elsewhere (or from nowhere) is refused.
    origin = f"http://127.0.0.1:{server.port}"
    body = b'{"text": "hello"}'
    json_type = {"Content-Type": "application/json"}
    for headers in ({**json_type, "Origin": "http://evil.example"}, json_type):
        refused = request(server, "/api/runs/x/steer", method="POST", headers=headers, body=body)
        assert refused.status == 403, headers
    sent = request(
        server,
        "/api/runs/x/steer",
        method="POST",
        headers={**json_type, "Origin": origin},
        body=body,
    )
    assert sent.status == 404  # let through, and there is no such run
    # A body larger than any request needs is refused before it is read whole.
    big = request(
        server,
        "/api/runs/01M8T2GVS8K98Q03J92RPJR39A/steer",
        method="POST",
        headers={**json_type, "Origin": origin},
        body=b'{"text": "' + b"x" * 200_000 + b'"}',
    )
    assert big.status == 413 and b"too large" in big.buffer
    # No URL path reaches the file system: a name outside the page's files is unknown.
    for path in ("/static/..%2Fapp.py", "/static/../__init__.py", "/static/index.html"):
        assert request(server, path).status == 404, path


def test_the_token_is_never_a_cookie(repo: Path, server: Server) -> None:
    """A cookie is the host's, whatever its port: a browser hands it to every server on
    127.0.0.1, and any of them could replay it here. The token is taken as a header only;
    the pages, which need none, are the same for every run and hold none of its data."""
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    (row,) = get_json(server, "/api/runs")
    run_id = row["run_id"]
    cookie = {"Cookie": f"fabro_token_{server.port}={server.token}"}
    for path in ("/api/runs", f"/api/runs/{run_id}", f"/api/runs/{run_id}/events"):
        assert request(server, path, token=False, headers=cookie).status == 403, path
    change = {**cookie, "Content-Type": "application/json", "Origin": server.base}
    steer = f"/api/runs/{run_id}/steer"
    assert request(server, steer, method="POST", token=False, headers=change).status == 403

    # The address as it was once printed, the token in its query: the same page with the
    # token in its fragment, and no cookie.
    entry = request(server, f"/runs/{run_id}?token={server.token}", token=False)
    assert entry.status == 303 and "set-cookie" not in entry.headers
    assert entry.headers["location"] == f"/runs/{run_id}#token={server.token}"
    assert entry.headers["cache-control"] == "no-store"
    shell = request(server, f"/runs/{run_id}", token=False)
    assert shell.status == 200 and "set-cookie" not in shell.headers
    assert run_id.encode() not in shell.buffer and b"human-gate" not in shell.buffer
    other = request(server, "/runs/01M8T2GVS8K98Q03J92RPJR39A", token=False)
    assert other.status == 200 and other.buffer == shell.buffer
    for path in ("/", "/static/common.js", "/static/run.js", "/favicon.ico"):
        assert request(server, path, token=False).status in (200, 204), path
    # A page's address is there to be looked at: a change to it still needs the token.
    json_change = {"Content-Type": "application/json", "Origin": server.base}
    assert request(server, "/", method="POST", token=False, headers=json_change).status == 403


def test_a_host_other_than_loopback_is_said_out_loud(repo: Path) -> None:
    running = start_server(repo, "--host", "0.0.0.0")
    assert get_json(running, "/api/runs") == []
    running.stop()
    assert b"warning: listening on 0.0.0.0, not loopback" in running.stderr


def test_the_pages_buttons_act_through_the_control_socket(repo: Path, server: Server) -> None:
    started = run_fabro("run", "human-gate", "-d", cwd=repo)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    gates = request(server, f"/api/runs/{run_id}/gates", stream=True)
    opened = json.loads(gates.next_message()["data"])  # type: ignore[index]
    assert opened["question"]["text"] == "Publish these notes?"
    assert "- First draft." in opened["question"]["details"]

    def post(action: str, payload: dict[str, object]) -> tuple[int, dict[str, object]]:
        response = request(
            server,
            f"/api/runs/{run_id}/{action}",
            method="POST",
            headers={"Content-Type": "application/json", "Origin": server.base},
            body=json.dumps(payload).encode(),
        )
        return response.status, json.loads(response.buffer)

    status, reply = post("answer", {"id": opened["id"], "text": "maybe"})
    assert status == 400 and "[A] Approve" in str(reply["error"])  # asked again, not sent
    status, reply = post("steer", {"text": "keep it short"})
    assert status == 200 and reply["delivered"] is False  # no agent in flight
    status, reply = post("answer", {"id": opened["id"], "text": "R"})
    assert status == 200 and reply["accepted"] is True
    # Revised, the gate asks again; this time the run is interrupted instead.
    while "question" not in (again := json.loads(gates.next_message()["data"])):  # type: ignore[index]
        assert again["closed"] == opened["id"]
    gates.close()
    status, reply = post("interrupt", {})
    assert status == 200 and reply["ok"] is True
    waited = run_fabro("wait", run_id, cwd=repo)
    assert waited.returncode == 130, waited.stderr
    names = [event["event"] for event in run_events(run_id, repo)]
    assert "run.steer" in names and "run.interrupt" in names
    status, reply = post("steer", {"text": "too late"})
    assert status == 409 and "not running" in str(reply["error"])


def test_a_run_git_cannot_read_is_an_error_that_says_what_to_do(repo: Path, server: Server) -> None:
    run_id = "01M8T2GVS8K98Q03J92RPJR39A"
    git(repo, "update-ref", f"refs/fabro/meta/{run_id}", "HEAD")  # not a snapshot
    (row,) = get_json(server, "/api/runs")  # listed as the reader lists it
    assert row["run_id"] == run_id and row["status"] == "unknown"
    for path in (f"/api/runs/{run_id}", f"/api/runs/{run_id}/graph.svg"):
        response = request(server, path)
        assert response.status == 500, path
        said = json.loads(response.buffer)
        assert said["error"].startswith(f"run {run_id}: the metadata snapshot")
        assert "git show" in said["hint"]
    # (the server's stderr holds no traceback: `stop` checks it)


def test_a_stages_artifacts_are_listed_and_downloaded(repo: Path, server: Server) -> None:
    write_workflow(
        repo,
        "digraph Big {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  first [shape=parallelogram, script="seq 1 30000 > numbers.txt; seq 1 30000"]\n'
        "  start -> first -> exit\n}\n",
    )
    done = run_fabro("run", "wf.fabro", cwd=repo)
    assert done.returncode == 0, done.stderr
    (row,) = get_json(server, "/api/runs")
    run_id = row["run_id"]
    stage = get_json(server, f"/api/runs/{run_id}/stages/first@1")
    assert stage["status"] == "succeeded" and stage["files_touched"] == ["numbers.txt"]
    assert stage["diff"].startswith("diff --git a/numbers.txt b/numbers.txt")
    assert stage["command_output"].startswith("1\n2\n3\n")
    (listed,) = stage["artifacts"]  # the output, offloaded as a value
    assert listed["path"] == "first/values/command.output.json"
    got = request(server, f"/api/runs/{run_id}/artifacts/{listed['path']}")
    assert got.status == 200
    assert got.headers["content-disposition"].startswith("attachment;")
    assert json.loads(got.buffer) == "".join(f"{n}\n" for n in range(1, 30_001))
    for path in ("first/values/nope.json", "../../../etc/passwd", "%2e%2e/manifest.json"):
        assert request(server, f"/api/runs/{run_id}/artifacts/{path}").status == 404, path


def test_an_artifact_named_in_any_script_downloads_under_a_plain_name(
    repo: Path, server: Server
) -> None:
    write_workflow(
        repo,
        "digraph Named {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  first [shape=parallelogram, script="mkdir -p test-results; '
        'echo hi > \'test-results/r\u00e9sum\u00e9 \u5831\u544a\\"x\\".txt\'"]\n'
        "  start -> first -> exit\n}\n",
    )
    done = run_fabro("run", "wf.fabro", cwd=repo)
    assert done.returncode == 0, done.stderr
    (row,) = get_json(server, "/api/runs")
    stage = get_json(server, f"/api/runs/{row['run_id']}/stages/first@1")
    (listed,) = stage["artifacts"]
    got = request(server, f"/api/runs/{row['run_id']}/artifacts/{quote(listed['path'])}")
    assert got.status == 200 and got.buffer == b"hi\n"
    # A header is Latin-1: a name is given in letters every client reads, quotes too.
    plain = 'attachment; filename="test-results_r_sum_____x_.txt"'
    assert got.headers["content-disposition"] == plain


def test_without_graphviz_the_drawing_is_an_error_that_says_what_to_do(
    repo: Path, tmp_path: Path
) -> None:
    done = run_fabro("run", "human-gate", "--answer", "A", cwd=repo)
    assert done.returncode == 0, done.stderr
    running = start_server(repo, env=without_graphviz(tmp_path))
    try:
        (row,) = get_json(running, "/api/runs")
        response = request(running, f"/api/runs/{row['run_id']}/graph.svg")
        assert response.status == 500
        said = json.loads(response.buffer)
        assert said["error"] == "Graphviz's `dot` is needed to render svg but is not on PATH"
        assert said["hint"].startswith("install Graphviz (apt-get install graphviz")
        assert "reload the page" in said["hint"] and "--format" not in said["hint"]
        # The rest of the run reads without it.
        assert get_json(running, f"/api/runs/{row['run_id']}")["status"] == "succeeded"
    finally:
        running.stop()


def test_a_server_on_another_loopback_address_answers_to_it(repo: Path) -> None:
    """`--host 127.0.0.2` prints that address; a Host header naming it is this server,
    while another name is still turned away."""
    started = start_server(repo, "--host", "127.0.0.2")
    try:
        assert started.base.startswith("http://127.0.0.2:")
        for host, status in ((f"127.0.0.2:{started.port}", 200), ("127.0.0.3", 421)):
            with socket.create_connection(("127.0.0.2", started.port), timeout=60) as sock:
                sock.sendall(
                    f"GET /api/runs HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                    f"Authorization: Bearer {started.token}\r\n\r\n".encode()
                )
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.split(b" ", 2)[1] == str(status).encode(), (host, answer[:200])
    finally:
        started.stop()


def test_open_hands_the_browser_a_private_page_not_the_token(repo: Path, tmp_path: Path) -> None:
    """A browser's command line is every local user's to read: `--open` gives it a file
    only this user can read, which sends it on to the address with the token."""
    seen = tmp_path / "browser-argv"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}.tmp && mv {seen}.tmp {seen}\n')
    browser.chmod(0o755)
    started = start_server(repo, "--open", env={"BROWSER": str(browser)})
    try:
        argv = wait_until(lambda: seen.exists() and seen.read_text(), what="the browser's start")
        assert started.token not in argv
        page = Path(argv.strip().removeprefix("file://"))
        assert page.stat().st_mode & 0o077 == 0
        assert started.url in page.read_text().replace("&amp;", "&")
        assert request(started, "/api/runs").status == 200  # serving: it stops cleanly
    finally:
        started.stop()
    assert not page.exists()


def test_sigterm_as_soon_as_the_address_is_printed_stops_it_cleanly(
    repo: Path, tmp_path: Path
) -> None:
    """A service manager may stop the server the moment it has started: SIGTERM right
    after the address is printed, before the server has all its parts, ends it as a
    later one does, saying so, with the page `--open` wrote removed."""
    browser = tmp_path / "browser"
    browser.write_text("#!/bin/sh\nexit 0\n")
    browser.chmod(0o755)
    private = tmp_path / "tmp"  # where its page goes, this test's alone
    private.mkdir()
    started = start_server(repo, "--open", env={"BROWSER": str(browser), "TMPDIR": str(private)})
    started.stop()  # at once: SIGTERM, then exit status 0 and no traceback
    assert b"git fabro serve: stopped" in started.stderr
    assert list(private.iterdir()) == []
