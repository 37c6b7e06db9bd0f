"""``OneAtATime``: takeovers of one id in one process never overlap (a second
caller finds what the first left), those of other ids do not wait, and no
lock outlives its callers."""

from __future__ import annotations

import asyncio

import pytest
from vllm_duplex.durable.takeover import OneAtATime

pytestmark = pytest.mark.asyncio


async def test_turns_of_one_id_run_one_after_another_and_leave_nothing_behind():
    turns, inside, log = OneAtATime(), set(), []

    async def take(entry_id: str, who: str) -> None:
        async with turns.turn(entry_id):
            assert entry_id not in inside  # never two at once for one id
            inside.add(entry_id)
            log.append((who, entry_id))
            await asyncio.sleep(0.01)
            inside.discard(entry_id)

    await asyncio.gather(take("s1", "a"), take("s1", "b"), take("s2", "c"), take("s1", "d"))
    assert [who for who, sid in log if sid == "s1"] == ["a", "b", "d"]  # in arrival order
    assert log.index(("c", "s2")) == 1  # s2 did not wait for s1's queue
    assert turns._locks == {}


async def test_a_cancelled_caller_frees_its_turn():
    turns = OneAtATime()
    entered = asyncio.Event()

    async def hold() -> None:
        async with turns.turn("s1"):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(hold())
    await entered.wait()
    waiter = asyncio.create_task(turns.turn("s1").__aenter__())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(waiter, 1)  # the next caller gets its turn
