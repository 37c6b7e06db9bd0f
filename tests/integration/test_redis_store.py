"""The session store's contract on a real redis-server (Debian's, a private
one on loopback for this module): the Lua scripts' compare-and-set leases,
fencing by generation, bounded Streams, resync instead of a gap, and bytes in
Redis that would name arbitrary code refused. The same contract on the
in-memory store and a virtual clock: tests/unit/test_session_store.py.
(Lease and age expiry here are Redis's own timers: short ones, waited out.)"""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest
import pytest_asyncio
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.durable.redis_store import RedisStore
from vllm_duplex.durable.store import (
    Append,
    Bounds,
    Drop,
    Fenced,
    LeaseHeld,
    Lost,
    Save,
    SessionState,
    StoreUnavailable,
    Trim,
    sha,
)
from vllm_duplex.fleet.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

STATE = SessionState(config=None, items=(), token_sha=sha("tok") or "", key_sha=None)
_n = iter(range(10**6))


def new_id() -> str:
    return f"sess_{next(_n):024d}.w1"


def appends(sid: str, gen: int, seqs, size: int = 10) -> list[Append]:
    return [Append(sid, gen, s, size, time.time(),
                   Envelope(s, Fence(sid), ev.ResponseDone(response={"id": f"r{s}"})))
            for s in seqs]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def redis():
    server = RedisServer()
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def store(redis):
    s = RedisStore(redis.url, Bounds(max_events=3, max_bytes=1000, max_age_s=0.4, keep_s=60))
    yield s
    await s.close()


async def created(store) -> str:
    sid = new_id()
    assert await store.apply([Save(sid, 1, STATE, "w1#10", 0.3)]) == {sid: 0}
    return sid


async def test_a_live_lease_is_never_taken_a_lapsed_or_dead_one_is_with_the_next_generation(store):
    sid = await created(store)
    with pytest.raises(LeaseHeld) as held:
        await store.acquire(sid, "w2#20", 5.0)
    assert held.value.owner == "w1"
    await asyncio.sleep(0.45)  # Redis expires the 0.3 s lease
    assert await store.acquire(sid, "w2#20", 5.0) == 2
    await store.mark_dead("w2#20")
    assert (await store.load(sid)).holder is None
    assert await store.acquire(sid, "w1#11", 5.0) == 3


async def test_the_stale_generation_is_fenced_inside_redis(store):
    sid = await created(store)
    assert await store.apply(appends(sid, 1, [1, 2])) == {sid: 2}
    await store.mark_dead("w1#10")
    assert await store.acquire(sid, "w2#20", 5.0) == 2
    assert isinstance((await store.apply(appends(sid, 1, [3]) + [Save(sid, 1, STATE)]))[sid],
                      Fenced)
    assert isinstance((await store.renew({sid: ("w1#10", 1)}, 5.0))[sid], Fenced)
    assert (await store.load(sid)).head_seq == 2
    assert await store.renew({sid: ("w2#20", 2)}, 5.0) == {}


async def test_a_lost_session_is_lost_and_written_again_by_a_save_with_its_holder(store):
    sid = new_id()
    assert isinstance((await store.renew({sid: ("w1#1", 4)}, 5.0))[sid], Lost)
    assert await store.apply([Save(sid, 4, STATE, "w1#1", 5.0)] + appends(sid, 4, [7, 8])) \
        == {sid: 8}
    stored = await store.load(sid)
    assert (stored.generation, stored.first_seq, stored.head_seq) == (4, 7, 8)


async def test_the_stream_is_bounded_and_answers_after_a_cursor_or_a_resync(store):
    sid = await created(store)
    await store.apply(appends(sid, 1, range(1, 6)))
    assert [e.seq for e in await store.events_after(sid, 3)] == [4, 5]
    assert await store.events_after(sid, 5) == []
    assert await store.events_after(sid, 1) is None
    await store.apply(appends(sid, 1, [6], size=995))  # over the bytes: only the newest stays
    assert [e.seq for e in await store.events_after(sid, 5)] == [6]
    assert await store.events_after(sid, 4) is None
    await asyncio.sleep(0.45)
    await store.apply(appends(sid, 1, [7, 8]))  # 6 is past max_age_s now
    assert await store.events_after(sid, 5) is None
    assert [e.seq for e in await store.events_after(sid, 6)] == [7, 8]


async def test_an_ack_trims_the_stream_up_to_its_seq_fenced_inside_redis(store):
    """``Trim`` (the client's ``session.event_ack``): the acked entries leave
    the stream (XTRIM MINID), their bytes leave the count; the head stays."""
    sid = await created(store)
    meta = f"duplex:{{{sid}}}:meta"
    await store.apply(appends(sid, 1, [1, 2, 3]))
    assert await store.apply([Trim(sid, 1, 2)]) == {sid: 3}
    stored = await store.load(sid)
    assert (stored.first_seq, stored.head_seq) == (3, 3)
    assert [e.seq for e in await store.events_after(sid, 2)] == [3]
    assert await store.events_after(sid, 1) is None  # acked, gone: a resync, never a gap
    assert int(await store._redis.hget(meta, "bytes")) == 10
    assert await store.apply([Trim(sid, 1, 1), Trim(sid, 1, 9)]) == {sid: 3}
    stored = await store.load(sid)
    assert (stored.first_seq, stored.head_seq) == (4, 3)
    assert await store.events_after(sid, 3) == []
    assert int(await store._redis.hget(meta, "bytes")) == 0
    await store.apply(appends(sid, 1, [4]))
    assert [e.seq for e in await store.events_after(sid, 3)] == [4]
    await store.mark_dead("w1#10")
    assert await store.acquire(sid, "w2#20", 5.0) == 2
    assert isinstance((await store.apply([Trim(sid, 1, 4)]))[sid], Fenced)
    assert [e.seq for e in await store.events_after(sid, 3)] == [4]
    assert isinstance((await store.apply([Trim(new_id(), 1, 1)])).popitem()[1], Lost)


async def test_drop_release_and_typed_refusals(store):
    sid = await created(store)
    with pytest.raises(DuplexError) as err:
        await store.acquire(new_id(), "w2#1", 5.0)
    assert err.value.code == "session_not_found"
    with pytest.raises(DuplexError) as err:
        await store.acquire(sid, "w2#1", 5.0, new=True)
    assert err.value.code == "duplicate_id"
    await store.apply([Drop(sid, 1, release_only=True)])
    assert (await store.load(sid)).holder is None
    assert await store.acquire(sid, "w2#1", 5.0) == 2
    await store.apply([Drop(sid, 2)])
    assert await store.load(sid) is None
    # The first owner wakes up: fenced by the generation the drop kept, never
    # "lost" (it would write its stale copy back).
    assert isinstance((await store.renew({sid: ("w1#10", 1)}, 5.0))[sid], Fenced)
    assert isinstance((await store.apply([Save(sid, 1, STATE)]))[sid], Fenced)
    # An id claimed but never used (its creation failed) is forgotten whole.
    claimed = new_id()
    assert await store.acquire(claimed, "w1#10", 5.0, new=True) == 1
    await store.apply([Drop(claimed, 1, forget=True)])
    assert await store.acquire(claimed, "w2#20", 5.0, new=True) == 1


async def test_bytes_in_redis_that_name_arbitrary_code_are_refused(store):
    sid = await created(store)
    await store._redis.set(f"duplex:{{{sid}}}:state", b"cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(pickle.UnpicklingError):
        await store.load(sid)


async def test_an_unreachable_redis_is_store_unavailable(redis):
    gone = RedisStore("redis://127.0.0.1:1/0", timeout_s=0.5)
    with pytest.raises(StoreUnavailable):
        await gone.apply([Save(new_id(), 1, STATE, "w1#1", 5.0)])
    assert await gone.ping() is False
    await gone.close()
