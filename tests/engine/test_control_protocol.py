"""The control socket's protocol, in process: typed requests and replies that keep the
lines of the wire as they were (a client or run of an older build still understands
them), and the same answers to requests that are not ones."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import msgspec
import trio

from fabro_git.engine import control


def test_requests_and_replies_are_the_lines_they_were() -> None:
    steer = control.Steer(text="use the other API", actor=control.Requester(login="ada"))
    assert json.loads(msgspec.json.encode(steer)) == {
        "op": "steer",
        "text": "use the other API",
        "actor": {"login": "ada"},
    }
    assert json.loads(msgspec.json.encode(control.Answer(id=3, text="A"))) == {
        "op": "answer",
        "id": 3,
        "text": "A",
    }
    assert json.loads(msgspec.json.encode(control.Reply(ok=True, delivered=False))) == {
        "ok": True,
        "delivered": False,
    }
    # What an older client sends: an actor whose login is unknown.
    old = b'{"op": "interrupt", "actor": {"login": null}}'
    assert msgspec.json.decode(old, type=control.Request) == control.Interrupt()


def _raw_request(path: Path, line: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(line + b"\n")
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return json.loads(data.split(b"\n", 1)[0])


def test_the_server_answers_typed_requests_and_refuses_others(tmp_path: Path) -> None:
    seen: list[control.Request] = []

    async def handle(request: control.Request) -> control.Reply | control.Stream:
        seen.append(request)
        if isinstance(request, control.Steer):
            return control.Reply(ok=True, delivered=request.text == "go")
        return control.Reply(ok=True)

    replies: list[dict[str, object]] = []
    typed: list[control.Reply | None] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            path = await nursery.start(control.serve, tmp_path, handle)
            for line in (
                b'{"op": "steer", "text": "go", "actor": {"login": "ada"}}',
                b'{"op": "steer"}',
                b'{"op": "nope"}',
                b"not json",
                # Nested past any request (and past the decoders' stack): a refusal, and
                # the server, which is the run's, goes on answering.
                b'{"op": "nope", "a": ' + b"[" * 30000 + b"]" * 30000 + b"}",
                b'{"a": ' + b"[" * 30000 + b"]" * 30000 + b', "op": "steer", "text": "x"}',
            ):
                replies.append(await trio.to_thread.run_sync(_raw_request, path, line))
            typed.append(
                await trio.to_thread.run_sync(
                    control.request, tmp_path, control.Answer(id=1, text="A")
                )
            )
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert replies == [
        {"ok": True, "delivered": True},
        {"ok": False, "error": "unknown request 'steer'"},
        {"ok": False, "error": "unknown request 'nope'"},
        {"ok": False, "error": "not a control request"},
        {"ok": False, "error": "unknown request None"},
        {"ok": False, "error": "not a control request"},
    ]
    assert typed == [control.Reply(ok=True)]
    assert seen == [
        control.Steer(text="go", actor=control.Requester(login="ada")),
        control.Answer(id=1, text="A"),
    ]
    assert seen[0].actor.as_actor().login == "ada"
