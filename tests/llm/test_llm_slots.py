"""The LLM slot limiter: its socket protocol, what a holder's death does, and the pause
one run's 429 puts on the others, through the real SDKs against the wire-format server.

The pause runs on trio's `MockClock` without autojump: virtual time moves only when the
test says, so "B had not asked before A's pause ran out" is a fact, not a race.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from llm_server import LlmServer, Reply, provider_env, rate_limited

from fabro_git.events.catalogue import AgentLlmRetry, RunNotice
from fabro_git.llm import SLOTS_VARIABLE
from fabro_git.llm.client import complete
from fabro_git.llm.slots import LlmSlots, LocalSlots, SlotsError, SlotServer, SlotsUnreachable
from fabro_git.llm.types import Message, Request, StreamEvent, Target

ANTHROPIC = Target("anthropic", "claude-sonnet-4-6")


@pytest.fixture
def slots() -> Iterator[SlotServer]:
    with SlotServer(LocalSlots(1)) as server:
        yield server


def _local(server: SlotServer) -> LocalSlots:
    assert isinstance(server.policy, LocalSlots)
    return server.policy


def test_a_slot_is_held_while_the_body_runs_and_a_second_holder_queues(
    slots: SlotServer,
) -> None:
    policy = _local(slots)
    told: list[str] = []

    async def main() -> None:
        first_in = trio.Event()
        first_out = trio.Event()

        async def first() -> None:
            async with LlmSlots(slots.path).held("run-a/one"):
                first_in.set()
                await first_out.wait()

        async def second() -> None:
            async def queued() -> None:
                told.append("queued")
                first_out.set()  # only now may the first give its slot back

            async with LlmSlots(slots.path).held("run-b/two", queued=queued):
                told.append("granted")
                assert policy.holders() == ["run-b/two"]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await first_in.wait()
            assert policy.holders() == ["run-a/one"]
            nursery.start_soon(second)

    trio.run(main)
    assert told == ["queued", "granted"]
    assert policy.wait_held(0, timeout=30)


def test_a_killed_holder_frees_its_slot(slots: SlotServer) -> None:
    holder = (
        "import sys, trio\n"
        "from fabro_git.llm.slots import LlmSlots\n"
        "async def main():\n"
        "    async with LlmSlots(sys.argv[1]).held('doomed'):\n"
        "        print('held', flush=True)\n"
        "        await trio.sleep_forever()\n"
        "trio.run(main)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder, slots.path], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "held\n"
            assert _local(slots).holders() == ["doomed"]
        finally:
            os.kill(proc.pid, signal.SIGKILL)
    assert _local(slots).wait_held(0, timeout=30), _local(slots).holders()

    async def take() -> None:
        async def queued() -> None:
            raise AssertionError("the dead holder's slot was not free")

        async with LlmSlots(slots.path).held("next", queued=queued):
            pass

    trio.run(take)


@contextlib.contextmanager
def _answering(reply: bytes) -> Iterator[str]:
    """A unix socket at a private path that answers every connection with `reply`."""
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "odd.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(4096)
                connection.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()
        shutil.rmtree(directory)


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 400 Bad Request\r\n\r\n", b'{"op": "granted"}\n', b'{"op": "paused"}\n', b""],
    ids=["not-json", "wrong-op", "no-seconds", "hang-up"],
)
def test_a_garbled_reply_is_a_clear_error(reply: bytes) -> None:
    with _answering(reply) as path, pytest.raises(SlotsError) as caught:
        trio.run(LlmSlots(path).paused_for)
    message = str(caught.value)
    assert f"the LLM slot limiter at {path}" in message, message
    assert "out of protocol" in message or "hung up" in message, message


def test_a_garbled_request_is_answered_with_an_error(slots: SlotServer) -> None:
    for request in (b"GET / HTTP/1.1\r\n\r\n", b'{"op": "dance"}\n', b'{"op": "pause"}\n'):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(slots.path)
            client.sendall(request)
            answer = json.loads(client.makefile("rb").readline())
        assert answer["op"] == "error" and answer["message"], answer
    assert _local(slots).holders() == [] and _local(slots).paused_for() == 0


def test_an_unreachable_limiter_says_where_and_what_to_do(tmp_path: Path) -> None:
    path = str(tmp_path / "gone.sock")
    with pytest.raises(SlotsUnreachable) as caught:
        trio.run(LlmSlots(path).pause, 3.0)
    assert f"the LLM slot limiter at {path} does not answer" in caught.value.message
    assert SLOTS_VARIABLE in (caught.value.hint or "")


def test_the_server_removes_its_private_directory(tmp_path: Path) -> None:
    server = SlotServer(LocalSlots(2)).start()
    directory = Path(server.path).parent
    assert directory.stat().st_mode & 0o777 == 0o700
    assert server.env() == {SLOTS_VARIABLE: server.path}
    server.close()
    assert not directory.exists()


def test_a_pause_keeps_the_longer_and_runs_out_on_the_clock() -> None:
    now = [100.0]
    policy = LocalSlots(1, clock=lambda: now[0])
    assert policy.paused_for() == 0
    policy.pause(7)
    policy.pause(2)  # shorter: the 7 s stand
    now[0] += 3
    assert policy.paused_for() == pytest.approx(4)
    now[0] += 4
    assert policy.paused_for() == 0
    assert policy.acquire("a", blocking=False) and policy.holders() == ["a"]
    assert not policy.acquire("b", blocking=False)
    policy.release("a")
    assert policy.acquire("b", blocking=False) and policy.holders() == ["b"]


def test_a_429_to_one_run_makes_the_others_next_request_wait(llm_server: LlmServer) -> None:
    """Run A is rate-limited for 7 s; B asks while that pause is on, and its request
    reaches the server only once the clock has passed the pause, after A's retry."""
    llm_server.script_when("from A", rate_limited(retry_after=7), Reply(text="A, after the wait"))
    llm_server.script_when("from B", Reply(text="B, after the shared pause"))
    clock = trio.testing.MockClock()  # no autojump: time moves when the test jumps it
    notices: list[RunNotice] = []
    arrival: dict[str, float] = {}

    with SlotServer(LocalSlots(2, clock=clock.current_time)) as slots:
        env = {**provider_env(llm_server), **slots.env()}
        settled = trio.Event()

        async def ask(who: str, *, retried: trio.Event | None = None) -> None:
            async def on_retry(event: AgentLlmRetry) -> None:
                assert retried is not None
                retried.set()

            async def on_notice(event: RunNotice) -> None:
                notices.append(event)
                settled.set()

            async def sink(event: StreamEvent) -> None:
                arrival.setdefault(who, trio.current_time())

            request = Request(messages=(Message.user(f"hello from {who}"),), timeout=None)
            await complete(
                request, ANTHROPIC, env=env, sink=sink, on_retry=on_retry, on_notice=on_notice
            )

        async def main() -> None:
            retried = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: ask("A", retried=retried))
                await retried.wait()  # A has had its 429 and told the limiter

                async def b() -> None:
                    await ask("B")
                    settled.set()

                nursery.start_soon(b)
                # B either waits out the pause (told by a notice) or asks at once.
                await settled.wait()
                assert notices, "B asked while A's pause was on"
                await trio.testing.wait_all_tasks_blocked()
                asked = [_who(r.body) for r in llm_server.requests]
                assert asked == ["A"], asked  # B has not asked yet
                clock.jump(7)

        trio.run(main, clock=clock)

    asked = [_who(r.body) for r in llm_server.requests]
    assert sorted(asked[1:]) == ["A", "B"] and asked[0] == "A", asked
    assert arrival["B"] >= 7, arrival
    [notice] = notices
    assert (notice.level, notice.code) == ("info", "llm_shared_pause")
    assert "waiting 7.0s" in notice.message, notice.message


def _who(body: dict) -> str:
    return "A" if "from A" in json.dumps(body) else "B"


def test_a_run_without_a_limiter_never_loads_it() -> None:
    code = (
        "import sys\n"
        "import fabro_git.handlers.llm, fabro_git.llm.client, fabro_git.engine.runner\n"
        "print('fabro_git.llm.slots' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == "False\n"
    assert LlmSlots.from_env({}) is None
    assert LlmSlots.from_env({SLOTS_VARIABLE: "/x.sock"}) is not None


def test_a_stage_timeout_stands_still_while_the_stage_waits_for_a_slot() -> None:
    from fabro_git.engine.stage import deadline_stopped

    seen: list[str] = []

    async def main() -> float:
        with trio.move_on_after(5) as timeout:
            with deadline_stopped(timeout):
                await trio.sleep(60)  # waiting for a slot: the batch's time, not the stage's
            seen.append("waited")
            await trio.sleep(4.5)
            seen.append("worked")
            await trio.sleep(1)
            seen.append("overran")
        assert timeout.cancelled_caught
        return trio.current_time()

    ended = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen == ["waited", "worked"] and ended == pytest.approx(65)
    assert trio.run(_no_timeout_no_change) == "ok"


async def _no_timeout_no_change() -> str:
    from fabro_git.engine.stage import deadline_stopped

    with deadline_stopped(None):
        pass
    with trio.CancelScope() as unbounded, deadline_stopped(unbounded):
        pass
    return "ok" if unbounded.deadline == float("inf") else "changed"


def test_a_socket_path_too_long_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(SlotsError) as caught:
        SlotServer(LocalSlots(1))
    assert "cannot serve the LLM slot limiter" in caught.value.message
    assert "TMPDIR" in (caught.value.hint or "")
    assert list(deep.iterdir()) == []  # its directory went with it
