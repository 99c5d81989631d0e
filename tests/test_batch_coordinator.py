"""The batch coordinator's bookkeeping, in process: the class a Ray actor runs on the
driver's node for a batch on a cluster (`fabro_git.engine.batch_ray.Coordinator`). Its
slots, its shared pause and its progress news, without a cluster: the cluster tests
(tests/test_batch_ray.py) show it behind Ray."""

from __future__ import annotations

import asyncio

import msgspec

from fabro_git.engine.batch import RowSummary
from fabro_git.engine.batch_ray import Coordinator


def _summary(row: int) -> bytes:
    return msgspec.msgpack.encode(RowSummary(row, f"run-{row}", "succeeded", 2, None, ""))


def test_slots_are_shared_and_an_attempt_lost_with_its_node_gives_its_slots_back() -> None:
    async def scenario() -> list[str]:
        coordinator = Coordinator(2)
        seen = []
        await coordinator.note_started(1, "first")
        await coordinator.note_started(2, "only")
        await coordinator.acquire("1/first/a")
        await coordinator.acquire("2/only/a")
        assert not await coordinator.try_acquire("2/only/b")  # both slots are held
        waiting = asyncio.ensure_future(coordinator.acquire("2/only/b"))
        await asyncio.sleep(0)
        seen.append("waiting" if not waiting.done() else "granted too early")
        # Row 1's node died: Ray starts it again; its lost attempt's slot is freed.
        await coordinator.note_started(1, "second")
        await asyncio.wait_for(waiting, 1)
        seen.append("granted")
        await coordinator.release("2/only/a")
        assert await coordinator.try_acquire("1/second/a")
        # A row that ends gives back whatever its attempts still held.
        await coordinator.note_ended(2, _summary(2))
        assert coordinator.held == {"1/second/a": 1}
        return seen

    assert asyncio.run(scenario()) == ["waiting", "granted"]


def test_a_pause_keeps_the_longer_and_the_news_says_each_row_once() -> None:
    async def scenario() -> None:
        coordinator = Coordinator(1)
        await coordinator.pause(30.0)
        await coordinator.pause(5.0)  # a shorter pause does not cut the longer one
        assert 29.0 < await coordinator.paused_for() <= 30.0
        await coordinator.note_started(3, "a")
        await coordinator.note_started(3, "b")  # a retry is not a new start
        await coordinator.note_ended(3, _summary(3))
        await coordinator.note_ended(3, _summary(3))  # told twice, counted once
        news = await coordinator.take_news()
        assert [what for what, _ in news] == ["started", "ended"]
        assert msgspec.msgpack.decode(news[1][1], type=RowSummary).row == 3
        assert await coordinator.take_news() == []
        assert await coordinator.running_count() == 0
        await coordinator.vouch_config(3, "digest-one")
        await coordinator.vouch_config(3, "digest-two")  # the first start's stands
        assert await coordinator.config_of(3) == "digest-one"

    asyncio.run(scenario())
