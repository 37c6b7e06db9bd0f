"""Resumable streams outlive their worker (plugin/durable/streams.py): two
workers' ``StreamStore``s with their writers share one ``MemoryStore`` as
they would Redis, on a virtual clock (no engine: the generation is the test
appending events). The owner's death is what its supervisor tells the store
(``mark_dead``); the same over HTTP, the engine and real Redis:
tests/integration/test_stream_adoption.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.records import STREAM_PREFIX, StreamRecord
from vllm_duplex.durable.store import decode, encode
from vllm_duplex.durable import streams as durable_streams
from vllm_duplex.durable.streams import StreamKeeper
from vllm_duplex.durable.writer import Durability
from vllm_duplex.testing.clock import VirtualClock
from vllm_duplex.text.streams import StreamStatus, StreamStore

KEY, OTHER = "key-alice", "key-bob"


class GatedStore(MemoryStore):
    """A shared store whose writes can be held back."""

    def __init__(self, clock) -> None:
        super().__init__(clock, shared=True)
        self.open = asyncio.Event()
        self.open.set()

    async def apply(self, writes):
        await self.open.wait()
        return await super().apply(writes)


class Worker:
    def __init__(self, store, clock, name: str, ttl_s: float = 60.0) -> None:
        self.name = name
        self.streams = StreamStore(clock=clock, ttl_s=ttl_s)
        self.durability = Durability(store, f"{name}#1", lease_ttl_s=1.0, clock=clock)
        self.keeper = StreamKeeper(self.streams, self.durability)
        self.streams.keeper = self.keeper

    def key_id(self, api_key: str) -> str:
        return f"{self.name}:{api_key}"  # an HMAC of this process, as the routes pass it

    async def reach(self, *ids: str, api_key: str = KEY) -> dict[str, DuplexError]:
        return await self.streams.reach(ids, api_key, self.key_id(api_key))

    def get(self, sid: str, api_key: str = KEY):
        return self.streams.get(sid, self.key_id(api_key))


@pytest.fixture
async def fleet(monkeypatch):
    clock = VirtualClock(1000.0)
    # The record's times are unix seconds: here they move with the virtual clock.
    monkeypatch.setattr(durable_streams, "time", SimpleNamespace(time=lambda: 1.7e9 + clock.now()))
    store = GatedStore(clock)
    a, b = Worker(store, clock, "wa"), Worker(store, clock, "wb")
    await a.durability.start()
    await b.durability.start()
    yield store, clock, a, b
    for w in (a, b):
        await w.streams.stop()
        await w.durability.stop()


async def until(check, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.005)


async def stored_head(store, sid: str) -> int:
    stored = await store.load(STREAM_PREFIX + sid)
    return stored.head_seq if stored is not None else -1


async def head_is(store, sid: str, seq: int) -> bool:
    return await stored_head(store, sid) == seq


async def on_the_clock(clock, coro):
    """``coro`` while the virtual clock moves on (a lease check polls it)."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        await clock.advance(0.05)
        await asyncio.sleep(0.001)
    return task.result()


async def take(it, n: int) -> list:
    return [await asyncio.wait_for(anext(it), 2.0) for _ in range(n)]


async def test_a_follower_gets_an_event_only_once_the_store_holds_it(fleet):
    store, _, a, _ = fleet
    s = await a.streams.open("s-held", a.key_id(KEY), KEY)
    follower = s.follow(1)
    await until(lambda: head_is(store, "s-held", 0))  # created by its first save
    store.open.clear()
    s.append("text-delta", {"delta": "Hel"})
    nxt = asyncio.ensure_future(anext(follower))
    await asyncio.sleep(0.05)
    assert not nxt.done()  # appended here, not yet in the store
    store.open.set()
    ev = await asyncio.wait_for(nxt, 2.0)
    assert ev.seq == 1 and await stored_head(store, "s-held") == 1
    await follower.aclose()


async def test_a_stream_cut_by_its_owners_death_replays_after_the_cursor_then_ends_in_error(fleet):
    store, clock, a, b = fleet
    s = await a.streams.open("s-live", a.key_id(KEY), KEY)
    follower = s.follow(1)
    for word in ("The", " capital", " of"):
        s.append("text-delta", {"delta": word})
    seen = await take(follower, 3)  # what the client got before the connection dropped
    await follower.aclose()
    s.append("text-delta", {"delta": " France"})
    s.append("text-delta", {"delta": " is"})
    await until(lambda: head_is(store, "s-live", 5))

    await store.mark_dead(a.durability.holder)  # A dies mid-generation
    assert await b.reach("s-live") == {}
    moved = b.get("s-live")
    assert moved.status is StreamStatus.COMPLETED and moved.first_seq == 1
    rest = [ev async for ev in moved.follow(seen[-1].seq + 1)]
    assert [ev.seq for ev in rest] == [4, 5, 6]  # no gap, no duplicate, then the end
    assert [ev.data.get("delta") for ev in rest[:2]] == [" France", " is"]
    assert rest[-1].event == "error"
    err = rest[-1].data["error"]
    assert err["code"] == "engine_dead" and err["reason"] == "owner_lost"
    assert err["owner_instance_id"] == "wa"
    # The whole stream, on B, as A sent it.
    whole = [ev async for ev in moved.follow(1)]
    assert [(e.seq, e.data) for e in whole[:3]] == [(e.seq, e.data) for e in seen]
    # ... and in the store: the terminal event and the completed status.
    await until(lambda: head_is(store, "s-live", 6))
    await until(lambda: _completed(store, "s-live"))

    # A, still running, writes once more: fenced, it drops its copy.
    s.append("text-delta", {"delta": " Paris"})
    await until(lambda: _moved(a.keeper))
    assert "s-live" not in a.streams._live
    assert await stored_head(store, "s-live") == 6  # the stale owner wrote nothing
    # Asked again, A names the new owner without waiting out a lease.
    there = (await on_the_clock(clock, a.reach("s-live")))["s-live"]
    assert there.code == "wrong_instance" and there.details["owner_instance_id"] == "wb"


async def _completed(store, sid: str) -> bool:
    stored = await store.load(STREAM_PREFIX + sid)
    return stored is not None and stored.state.status == "completed"


async def _moved(keeper) -> bool:
    return keeper.moved == 1


async def test_a_completed_stream_replays_whole_until_its_ttl_deleted_and_foreign_ones_do_not(fleet):
    store, clock, a, b = fleet
    done = await a.streams.open("s-done", a.key_id(KEY), KEY)
    for word in ("Paris", "."):
        done.append("text-delta", {"delta": word})
    done.append("finish", {"finish_reason": "stop"})
    done.complete()
    gone = await a.streams.open("s-gone", a.key_id(KEY), KEY)
    gone.append("text-delta", {"delta": "x"})
    await a.streams.delete("s-gone", a.key_id(KEY))
    await until(lambda: _completed(store, "s-done"))
    assert await store.load(STREAM_PREFIX + "s-gone") is None  # deleted: dropped
    await clock.advance(20)  # 20 s of its 60 s TTL pass on A

    await store.mark_dead(a.durability.holder)
    # Another key's stream is not taken over: unknown to it, as before.
    assert await b.reach("s-done", api_key=OTHER) == {}
    with pytest.raises(DuplexError) as foreign:
        b.get("s-done", OTHER)
    assert foreign.value.code == "stream_not_found"
    # A lookup reaches only the ids not here: two unknown ones, one to take over.
    assert await b.reach("s-done", "s-gone", "never") == {}
    assert b.streams.lookup(["s-done", "s-gone", "never"], b.key_id(KEY)) == {
        "s-done": StreamStatus.COMPLETED, "s-gone": StreamStatus.UNKNOWN,
        "never": StreamStatus.UNKNOWN}
    replay = [(e.seq, e.event, e.data) async for e in b.get("s-done").follow(1)]
    assert replay == [(1, "text-delta", {"delta": "Paris"}), (2, "text-delta", {"delta": "."}),
                      (3, "finish", {"finish_reason": "stop"})]
    assert await stored_head(store, "s-done") == 3  # nothing appended to a finished one
    # Its TTL runs on from when it completed: expired after the other 40 s, and dropped.
    await clock.advance(39)
    assert b.get("s-done").status is StreamStatus.COMPLETED
    await clock.advance(2)
    with pytest.raises(DuplexError) as expired:
        b.get("s-done")
    assert expired.value.code == "stream_expired"
    await until(lambda: head_is(store, "s-done", -1))


async def test_ids_are_claimed_across_the_store_and_a_stopping_worker_releases_its_streams(fleet):
    store, clock, a, b = fleet
    s = await a.streams.open("s-one", a.key_id(KEY), KEY)
    with pytest.raises(DuplexError) as dup:
        await b.streams.open("s-one", b.key_id(KEY), KEY)
    assert dup.value.code == "duplicate_id"
    s.append("text-delta", {"delta": "a"})
    await until(lambda: head_is(store, "s-one", 1))
    # A live owner: B names it at once when asked not to wait.
    with pytest.raises(DuplexError) as live:
        await on_the_clock(clock, b.keeper.reach("s-one", KEY, b.key_id(KEY), patient=False))
    assert live.value.code == "wrong_instance"
    await a.streams.stop()  # a deploy: the generation is stopped, the stream released
    await a.durability.stop()
    assert await b.reach("s-one") == {}  # no lease to wait for: taken at once
    moved = b.get("s-one")
    assert moved.status is StreamStatus.COMPLETED
    assert [(e.seq, e.data) async for e in moved.follow(1)] == [(1, {"delta": "a"})]


def test_what_the_store_keeps_of_a_stream_loads_back_through_the_allow_list():
    record = StreamRecord("completed", "abc", 300.0, 1.7e9, 1.7e9)
    assert decode(encode(record)) == record
    event = (3, "error", {"error": {"code": "engine_dead", "reason": "owner_lost"}})
    assert decode(encode(event)) == event
