"""The bus fans events out, hands each out once for a segment, and survives a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from event_contract.check import check_jsonl
from event_contract.seed import Catalogue

from fabro_git.events.bus import EventBus, MemorySink, TailFileSink, tail_after
from fabro_git.events.catalogue import GitCommit, RunNotice, StagePrompt
from fabro_git.events.envelope import decode_event, encode_event


def notice(n: int) -> RunNotice:
    return RunNotice(level="info", code=f"c{n}", message=f"m{n}")


def codes(data: bytes) -> list[str]:
    return [decode_event(line)["properties"]["code"] for line in data.splitlines()]


def test_emit_stamps_and_fans_out() -> None:
    a, b = MemorySink(), MemorySink()
    bus = EventBus("run1", [a])
    bus.add_sink(b)
    env = bus.emit(GitCommit(sha="abc"), node_id="code")
    assert env.run_id == "run1"
    assert env.event == "git.commit"
    assert env.node_label == "code"
    assert a.envelopes == [env] and b.envelopes == [env]
    assert a.lines == [encode_event(env)]
    assert bus.last_event_id == env.id
    bus.remove_sink(b)
    bus.emit(notice(1))
    assert a.names == ["git.commit", "run.notice"]
    assert b.names == ["git.commit"]
    assert a.of(RunNotice) == a.of("run.notice") == [a.envelopes[1]]


def test_take_segment_returns_exactly_the_new_lines() -> None:
    sink = MemorySink()
    bus = EventBus("run1", [sink])
    assert bus.take_segment() == b""
    bus.emit(notice(1))
    bus.emit(notice(2))
    first = bus.take_segment()
    assert first == sink.lines[0] + b"\n" + sink.lines[1] + b"\n"
    assert bus.take_segment() == b""
    assert not bus.has_pending
    bus.emit(notice(3))
    assert codes(bus.take_segment()) == ["c3"]


def test_a_failing_sink_does_not_lose_the_event() -> None:
    class Broken:
        def handle(self, env: object, line: bytes) -> None:
            raise BrokenPipeError("terminal went away")

        def close(self) -> None:
            pass

    bus = EventBus("run1", [Broken()])
    with pytest.raises(BrokenPipeError):
        bus.emit(notice(1))
    assert codes(bus.take_segment()) == ["c1"]


def test_tail_sink_appends_and_flushes(tmp_path: Path) -> None:
    tail = tmp_path / "scratch" / "events.jsonl"
    sink = TailFileSink(tail)
    bus = EventBus("run1", [sink])
    env = bus.emit(notice(1))
    assert codes(tail.read_bytes()) == ["c1"]  # visible before close: flushed per event
    bus.close()
    with pytest.raises(ValueError, match="closed"):
        sink.handle(env, encode_event(env))
    again = EventBus("run1", [TailFileSink(tail)])
    again.emit(notice(2))
    again.close()
    data = tail.read_bytes()
    assert codes(data) == ["c1", "c2"]
    assert data.endswith(b"\n")


def test_tail_sink_ends_a_torn_line_before_appending(tmp_path: Path) -> None:
    tail = tmp_path / "events.jsonl"
    bus = EventBus("run1", [TailFileSink(tail)])
    bus.emit(notice(1))
    bus.close()
    with tail.open("ab") as f:
        f.write(b'{"id": "0192')  # a writer killed mid-line
    bus = EventBus("run1", [TailFileSink(tail)])
    bus.emit(notice(2))
    bus.close()
    lines = tail.read_bytes().splitlines()
    assert len(lines) == 3
    assert lines[1] == b'{"id": "0192'
    assert decode_event(lines[2])["properties"]["code"] == "c2"


def test_resume_requeues_only_unsnapshotted_lines(tmp_path: Path) -> None:
    tail = tmp_path / "events.jsonl"
    first = EventBus("run1", [TailFileSink(tail)])
    first.emit(notice(1))
    first.emit(notice(2))
    first.take_segment()  # snapshot holds c1, c2
    snapshotted = first.last_event_id
    first.emit(notice(3))
    first.emit(notice(4))
    first.close()  # crash: c3, c4 only in the tail
    with tail.open("ab") as f:
        f.write(b'{"id": "torn')

    resumed = EventBus("run1", [TailFileSink(tail)])
    assert resumed.restore_pending(tail_after(tail.read_bytes(), snapshotted)) == 2
    resumed.emit(notice(5))
    assert codes(resumed.take_segment()) == ["c3", "c4", "c5"]
    resumed.close()


def test_tail_after() -> None:
    bus = EventBus("run1")
    envs = [bus.emit(notice(n)) for n in range(4)]
    data = bus.take_segment() + b"garbage\n" + b'{"id": "frag'
    assert codes(tail_after(data, None)) == ["c0", "c1", "c2", "c3"]
    assert codes(tail_after(data, envs[1].id)) == ["c2", "c3"]
    assert codes(tail_after(data, envs[3].id)) == []
    # The id is gone from the tail (scratch recreated): fall back to id order.
    later = data.split(b"\n", 2)[2]
    assert codes(tail_after(later, envs[0].id)) == ["c2", "c3"]
    assert codes(tail_after(later, envs[1].id)) == ["c2", "c3"]


def test_close_closes_sinks() -> None:
    sink = MemorySink()
    bus = EventBus("run1", [sink])
    bus.emit(notice(1))
    bus.close()
    assert sink.closed
    assert codes(bus.take_segment()) == ["c1"]


def test_concurrent_trio_tasks_write_whole_lines(tmp_path: Path, catalogue: Catalogue) -> None:
    tail = tmp_path / "events.jsonl"
    bus = EventBus("01JQXYZ", [TailFileSink(tail)])

    async def branch(name: str) -> None:
        for i in range(50):
            bus.emit(StagePrompt(text=f"{name} {i} " + "x" * 5000), node_id=name)
            await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for name in ("a", "b", "c"):
                nursery.start_soon(branch, name)

    trio.run(main)
    bus.close()
    data = tail.read_bytes()
    assert data == bus.take_segment()
    assert len(data.splitlines()) == 150
    assert check_jsonl(data, catalogue) == []
