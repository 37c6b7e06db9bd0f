"""Resumable streams: seq, replay + live follow, bounds/resync, ownership, delete, TTL,
eviction, reaper. Pure asyncio on a VirtualClock; followers run as tasks and the loop is
stepped with ``settle()`` (zero-length sleeps), never wall-clock waits."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.testing.clock import VirtualClock
from vllm_duplex.text.streams import (
    ResumableStream,
    StreamEvent,
    StreamStatus,
    StreamStore,
)

KEY = "kid-owner"  # key ids are HMACs computed by the caller; opaque here
OTHER = "kid-other"


def make(clock: VirtualClock | None = None, **kw: object) -> StreamStore:
    return StreamStore(clock=clock or VirtualClock(), **kw)  # type: ignore[arg-type]


def hundred() -> dict[str, str]:
    """Data whose event (named "e") has size exactly 100: len('{"t": ""}') + 90 + len("e")."""
    return {"t": "x" * 90}


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def seqs(gen: AsyncIterator[StreamEvent]) -> list[int]:
    return [ev.seq async for ev in gen]


def follower(stream: ResumableStream, from_seq: int = 1) -> tuple[asyncio.Task[None], list[int]]:
    got: list[int] = []

    async def run() -> None:
        async for ev in stream.follow(from_seq):
            got.append(ev.seq)

    return asyncio.create_task(run(), name=f"follower-{stream.stream_id}"), got


@contextmanager
def raises(code: str, param: str | None = None) -> Iterator[pytest.ExceptionInfo[DuplexError]]:
    with pytest.raises(DuplexError) as exc:
        yield exc
    assert exc.value.code == code, exc.value
    if param is not None:
        assert exc.value.param == param


# -- append and seq ------------------------------------------------------------


async def test_seq_is_strictly_plus_one_and_size_counts_json_and_name() -> None:
    s = make().create("s1", KEY)
    assert (s.head_seq, s.first_seq, s.status) == (0, 1, StreamStatus.ACTIVE)
    evs = [s.append("text-delta", {"delta": w}) for w in ("a", "bb", "ccc")]
    assert [e.seq for e in evs] == [1, 2, 3]
    assert evs[1] == StreamEvent(2, "text-delta", {"delta": "bb"}, len(json.dumps({"delta": "bb"})) + 10)
    assert (s.head_seq, s.first_seq, s.retained_bytes) == (3, 1, sum(e.size for e in evs))


async def test_append_rejects_bad_input_without_consuming_a_seq() -> None:
    s = make().create("s1", KEY)
    with pytest.raises(TypeError):
        s.append("e", {"x": object()})
    with pytest.raises(ValueError):
        s.append("a\ndata: forged", {})  # would inject an SSE field
    assert s.append("e", {}).seq == 1
    s.complete()
    s.complete()  # idempotent
    with pytest.raises(RuntimeError):
        s.append("e", {})
    assert s.head_seq == 1


# -- replay and follow -----------------------------------------------------------


async def test_replay_from_cursor_then_follow_live() -> None:
    s = make().create("s1", KEY)
    for i in range(3):
        s.append("text-delta", {"i": i})
    task, got = follower(s, from_seq=2)
    await settle()
    assert got == [2, 3]  # replayed, now waiting live
    s.append("text-delta", {"i": 3})
    await settle()
    assert got == [2, 3, 4]
    s.append("finish", {})
    s.complete()
    await task
    assert got == [2, 3, 4, 5]


async def test_two_followers_both_see_everything_and_never_block_append() -> None:
    s = make().create("s1", KEY)
    (t1, got1), (t2, got2) = follower(s), follower(s)
    await settle()
    for i in range(5):
        s.append("e", {"i": i})  # sync: returns without any follower having run
        if i % 2:
            await settle()
    s.complete()
    await asyncio.gather(t1, t2)
    assert got1 == got2 == [1, 2, 3, 4, 5]


async def test_follow_after_completion_replays_and_ends() -> None:
    s = make().create("s1", KEY)
    for i in range(4):
        s.append("e", {"i": i})
    s.complete()
    assert await seqs(s.follow()) == [1, 2, 3, 4]
    assert await seqs(s.follow(3)) == [3, 4]
    assert await seqs(s.follow(5)) == []  # from = head + 1 on a finished stream: nothing left


async def test_disconnect_mid_follow_then_resume_has_no_gap_and_no_dup() -> None:
    s = make().create("s1", KEY)
    for i in range(3):
        s.append("e", {"i": i})
    gen = s.follow(1)
    first = [(await anext(gen)).seq, (await anext(gen)).seq]
    await gen.aclose()  # client disconnected after seq 2
    s.append("e", {"i": 3})
    s.complete()
    assert first + await seqs(s.follow(first[-1] + 1)) == [1, 2, 3, 4]


async def test_random_disconnects_reassemble_the_exact_sequence() -> None:
    """Streaming equals batch: however the client's connection is cut, the concatenation
    of what each resumed follow yielded is exactly 1..N."""
    rng = random.Random(7)
    s = make().create("s1", KEY)
    got: list[int] = []
    while s.head_seq < 200 or got[-1:] != [s.head_seq]:
        for _ in range(rng.randint(0, 5)):
            if s.head_seq < 200:
                s.append("e", {"n": s.head_seq})
        gen = s.follow(got[-1] + 1 if got else 1)
        for _ in range(min(rng.randint(1, 7), s.head_seq - (got[-1] if got else 0))):
            got.append((await anext(gen)).seq)
        await gen.aclose()
    assert got == list(range(1, 201))


async def test_cancelled_waiting_follower_leaves_the_stream_usable() -> None:
    s = make().create("s1", KEY)
    task, _ = follower(s)
    await settle()  # parked on the stream's wake event
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    s.append("e", {})
    s.complete()
    assert await seqs(s.follow()) == [1]


async def test_cursor_out_of_range_is_invalid_value_raised_before_any_await() -> None:
    s = make().create("s1", KEY)
    s.append("e", {})
    for bad in (0, -1, 3, True, "1"):
        with raises("invalid_value", param="from"):
            s.follow(bad)  # type: ignore[arg-type]  # not awaited: validation is eager
    s.check_cursor(2)  # head + 1: valid, the follower waits for the next event
    task, got = follower(s, 2)
    await settle()
    assert got == []
    s.append("e", {})
    s.complete()
    await task
    assert got == [2]


# -- bounds and resync ---------------------------------------------------------------


async def test_count_bound_trims_oldest_and_old_cursor_needs_resync() -> None:
    store = make(max_events_per_stream=3)
    s = store.create("s1", KEY)
    for i in range(5):
        s.append("e", {"i": i})
    assert (s.first_seq, s.head_seq) == (3, 5)
    assert store.stats["trimmed_events_total"] == 2
    with raises("resync_required", param="from"):
        s.follow(2)  # eager, like every cursor error
    with raises("resync_required") as exc:
        s.check_cursor(1)
    assert "oldest retained seq is 3" in exc.value.message
    assert exc.value.to_wire()["retryable"] is False
    s.complete()
    assert await seqs(s.follow(3)) == [3, 4, 5]


async def test_byte_bound_trims_oldest_but_never_the_event_just_appended() -> None:
    store = make(max_bytes_per_stream=250)
    s = store.create("s1", KEY)
    for _ in range(3):
        s.append("e", hundred())
    assert (s.first_seq, s.retained_bytes) == (2, 200)
    big = s.append("e", {"t": "x" * 990})  # 1000 bytes alone exceeds the bound
    assert (s.first_seq, s.retained_bytes, store.stats["retained_bytes"]) == (4, big.size, 1000)
    s.append("e", hundred())
    assert (s.first_seq, s.retained_bytes) == (5, 100)


async def test_lagging_follower_gets_resync_while_a_prompt_one_keeps_up() -> None:
    s = make(max_events_per_stream=3).create("s1", KEY)
    s.append("e", {})
    slow = s.follow(1)
    assert (await anext(slow)).seq == 1
    fast, got = follower(s, 2)
    for i in range(5):
        s.append("e", {"i": i})
        await settle()  # a generation awaits between tokens; the prompt follower runs
    with raises("resync_required", param="from"):
        await anext(slow)  # it needed seq 2; the window is now 4..6
    await slow.aclose()
    s.complete()
    await fast
    assert got == [2, 3, 4, 5, 6]


async def test_total_bytes_bound_trims_completed_first_then_oldest_event_then_own() -> None:
    store = make(max_total_bytes=500)
    a, b, c, d = (store.create(n, KEY) for n in "abcd")
    b.append("e", hundred())  # b1: oldest event overall
    a.append("e", hundred())  # a1: newer, but its stream completes
    a.complete()
    d.append("e", hundred())  # d1
    b.append("e", hundred())  # b2
    c.append("e", hundred())  # c1: at the bound, nothing trimmed
    assert store.stats["retained_bytes"] == 500 and store.stats["trimmed_events_total"] == 0
    expected = [(a, 2), (b, 2), (d, 2), (b, 3), (c, 2)]  # whose first_seq moves to what
    for victim, first in expected:
        c.append("e", hundred())
        assert victim.first_seq == first
        assert store.stats["retained_bytes"] == 500
    assert store.stats["trimmed_events_total"] == 5
    assert sum(x.retained_bytes for x in (a, b, c, d)) == 500


async def test_one_big_append_trims_by_oldest_event_across_streams() -> None:
    store = make(max_total_bytes=400)
    b, c, d = (store.create(n, KEY) for n in "bcd")
    for s in (b, d, d, b):  # b1 d1 d2 b2
        s.append("e", hundred())
    c.append("e", {"t": "x" * 190})  # 200 bytes: two events must go, b1 then d1
    assert (b.first_seq, d.first_seq, store.stats["retained_bytes"]) == (2, 2, 400)


async def test_memory_stays_bounded_under_random_load() -> None:
    rng = random.Random(3)
    store = make(max_events_per_stream=20, max_bytes_per_stream=1500, max_total_bytes=4000)
    streams = [store.create(f"s{i}", KEY) for i in range(6)]
    for _ in range(2000):
        s = rng.choice(streams)
        if s.status is not StreamStatus.ACTIVE:
            continue
        ev = s.append("e", {"t": "x" * rng.randint(0, 300)})
        if rng.random() < 0.01:
            s.complete()
        assert store.stats["retained_bytes"] == sum(x.retained_bytes for x in streams) <= 4000
        assert len(s._log) <= 20 and s.retained_bytes <= max(1500, ev.size)


# -- ownership and lookup -----------------------------------------------------------


async def test_foreign_key_sees_unknown_everywhere() -> None:
    clock = VirtualClock()
    store = make(clock, ttl_s=5.0)
    store.create("mine", KEY)
    store.create("anon", None)
    done = store.create("done", KEY)
    done.complete()
    await store.delete(store.create("gone", KEY).stream_id, KEY)
    await clock.advance(5.0)  # "done" expires
    for sid, owner in (("mine", KEY), ("anon", None), ("done", KEY), ("gone", KEY)):
        for key in {KEY, OTHER, None} - {owner}:
            with raises("stream_not_found", param="stream_id"):
                store.get(sid, key)
            assert store.lookup([sid], key) == {sid: StreamStatus.UNKNOWN}
            with raises("stream_not_found"):
                await store.delete(sid, key)
    assert store.get("mine", KEY).status is StreamStatus.ACTIVE
    assert store.get("anon", None).status is StreamStatus.ACTIVE
    with raises("duplicate_id", param="stream_id"):
        store.create("mine", OTHER)  # ids are global: a duplicate whoever owns it


async def test_lookup_answers_only_the_named_ids_deduplicated_in_order() -> None:
    clock = VirtualClock()
    store = make(clock, ttl_s=5.0)
    store.create("act", KEY)
    store.create("done", KEY).complete()
    store.create("old", KEY).complete()
    store.create("unasked", KEY)
    await clock.advance(5.0)  # "done" and "old" expire...
    store.create("done2", KEY).complete()  # ...this one does not
    await store.delete("act", KEY)
    store.create("act2", KEY)
    got = store.lookup(["done2", "nope", "act2", "done2", "act", "old", "bad id!"], KEY)
    assert list(got.items()) == [
        ("done2", StreamStatus.COMPLETED),
        ("nope", StreamStatus.UNKNOWN),
        ("act2", StreamStatus.ACTIVE),
        ("act", StreamStatus.DELETED),
        ("old", StreamStatus.EXPIRED),
        ("bad id!", StreamStatus.UNKNOWN),
    ]
    assert store.lookup([], KEY) == {}


@pytest.mark.parametrize("bad", ["", "a" * 129, "has space", "slash/", "ünï", "semi;colon"])
async def test_invalid_stream_ids(bad: str) -> None:
    with raises("invalid_value", param="stream_id"):
        make().create(bad, KEY)


# -- delete and stop ------------------------------------------------------------------


async def test_delete_is_idempotent_and_stops_the_generation_exactly_once() -> None:
    store = make()
    s = store.create("s1", KEY)
    s.append("e", hundred())
    gate = asyncio.Event()
    calls: list[str] = []

    async def on_stop() -> None:
        calls.append("stop")
        s.append("finish", {"reason": "stopped"})  # still active while stopping
        await gate.wait()

    s.on_stop = on_stop
    task, got = follower(s)
    d1 = asyncio.create_task(store.delete("s1", KEY))
    d2 = asyncio.create_task(store.delete("s1", KEY))  # concurrent DELETE joins the first
    await settle()
    assert calls == ["stop"] and got == [1, 2]
    gate.set()
    assert await asyncio.gather(d1, d2) == [StreamStatus.ACTIVE, StreamStatus.ACTIVE]
    await task  # the follower mid-iteration just ended
    assert (s.status, s.retained_bytes, store.stats["retained_bytes"], len(store)) == (
        StreamStatus.DELETED, 0, 0, 0)
    assert await store.delete("s1", KEY) is StreamStatus.DELETED  # repeat: no error
    await s.stop()
    assert calls == ["stop"] and store.stats["deleted_total"] == 1
    with raises("stream_not_found"):
        store.get("s1", KEY)
    with raises("stream_not_found"):
        s.follow(1)  # a handle obtained before the delete
    assert store.lookup(["s1"], KEY) == {"s1": StreamStatus.DELETED}
    with raises("duplicate_id"):
        store.create("s1", KEY)  # the tombstone keeps the id


async def test_delete_of_completed_stream_does_not_call_on_stop() -> None:
    store = make()
    s = store.create("s1", KEY)
    calls: list[int] = []

    async def on_stop() -> None:
        calls.append(1)

    s.on_stop = on_stop
    s.complete()
    assert await store.delete("s1", KEY) is StreamStatus.COMPLETED
    assert calls == [] and s.status is StreamStatus.DELETED


async def test_cancelled_delete_still_deletes_and_on_stop_finishes() -> None:
    store = make()
    s = store.create("s1", KEY)
    gate = asyncio.Event()
    finished: list[bool] = []

    async def on_stop() -> None:
        await gate.wait()
        finished.append(True)

    s.on_stop = on_stop
    d = asyncio.create_task(store.delete("s1", KEY))
    await settle()
    d.cancel()  # the HTTP client went away mid-DELETE
    with pytest.raises(asyncio.CancelledError):
        await d
    assert s.status is StreamStatus.DELETED
    gate.set()
    await settle()
    assert finished == [True] and s.status is StreamStatus.DELETED


async def test_failing_on_stop_is_logged_and_the_stream_still_completes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = make().create("s1", KEY)

    async def on_stop() -> None:
        raise RuntimeError("engine gone")

    s.on_stop = on_stop
    with caplog.at_level(logging.ERROR, logger="vllm_duplex.text.streams"):
        await s.stop()
    assert s.status is StreamStatus.COMPLETED and "on_stop failed" in caplog.text


# -- TTL, eviction, reaper --------------------------------------------------------------


async def test_completed_stream_expires_after_ttl_active_never() -> None:
    clock = VirtualClock(100.0)
    store = make(clock, ttl_s=10.0)
    active = store.create("act", KEY)
    s = store.create("s1", KEY)
    s.append("e", hundred())
    await clock.advance(3.0)
    s.complete()
    assert s.completed_at == 103.0
    await clock.advance(9.9)
    assert store.get("s1", KEY) is s  # no reaper running: expiry is checked on access
    await clock.advance(0.1)
    with raises("stream_expired", param="stream_id"):
        store.get("s1", KEY)
    assert store.lookup(["s1", "act"], KEY) == {"s1": StreamStatus.EXPIRED, "act": StreamStatus.ACTIVE}
    assert await store.delete("s1", KEY) is StreamStatus.EXPIRED
    with raises("stream_expired"):
        s.follow(1)
    assert (s.retained_bytes, store.stats["retained_bytes"], store.stats["expired_total"]) == (0, 0, 1)
    with raises("duplicate_id"):
        store.create("s1", KEY)
    await clock.advance(10_000.0)
    assert store.get("act", KEY) is active and store.collect() == 0


async def test_max_streams_evicts_oldest_completed_else_resource_exhausted() -> None:
    store = make(max_streams=2)
    a, b = store.create("a", KEY), store.create("b", KEY)
    with raises("resource_exhausted") as exc:
        store.create("c", KEY)
    assert exc.value.to_wire()["retryable"] is True
    b.complete()
    a.complete()  # b finished first, so b goes first
    store.create("c", KEY)
    assert len(store) == 2 and store.stats["evicted_total"] == 1
    with raises("stream_expired"):
        store.get("b", KEY)
    assert store.get("a", KEY) is a
    store.create("d", KEY)  # evicts a
    with raises("resource_exhausted"):
        store.create("e", KEY)  # c and d are active


async def test_tombstones_are_bounded() -> None:
    store = make(tombstones=2)
    for sid in ("a", "b", "c"):
        store.create(sid, KEY)
        await store.delete(sid, KEY)
    assert store.lookup(["a", "b", "c"], KEY) == {
        "a": StreamStatus.UNKNOWN, "b": StreamStatus.DELETED, "c": StreamStatus.DELETED}
    assert store.stats["tombstones"] == 2


async def test_reaper_expires_on_virtual_clock_and_followers_end() -> None:
    clock = VirtualClock()
    store = make(clock, ttl_s=5.0, reap_interval_s=1.0)
    await store.start()
    await store.start()  # idempotent: still one reaper
    assert [t.get_name() for t in asyncio.all_tasks()].count("duplex-stream-reaper") == 1
    s = store.create("s1", KEY)
    s.append("e", {})
    s.append("e", {})
    s.complete()
    gen = s.follow(1)
    assert (await anext(gen)).seq == 1  # then the client stalls, seq 2 unread
    await clock.advance(4.0)
    assert len(store) == 1
    await clock.advance(1.0)
    assert len(store) == 0 and store.stats["expired_total"] == 1  # the reaper, not an accessor
    assert await seqs(gen) == []  # the follower just ends (no resync: the stream is gone)
    await store.stop()
    assert "duplex-stream-reaper" not in [t.get_name() for t in asyncio.all_tasks()]
    await store.stop()  # idempotent


async def test_store_stop_stops_active_streams_and_refuses_new_ones() -> None:
    store = make()
    await store.start()
    s = store.create("s1", KEY)
    done = store.create("s2", KEY)
    done.complete()
    stopped: list[str] = []

    async def on_stop() -> None:
        stopped.append(s.stream_id)

    s.on_stop = on_stop
    task, got = follower(s)
    s.append("e", {})
    await store.stop()
    await task
    assert stopped == ["s1"] and s.status is StreamStatus.COMPLETED and got == [1]
    assert store.get("s2", KEY) is done  # finished streams stay readable
    with raises("resource_exhausted"):
        store.create("s3", KEY)
    await store.start()
    store.create("s3", KEY)
    await store.stop()


def test_constructor_rejects_nonsense_limits() -> None:
    for kw in ({"max_streams": 0}, {"max_total_bytes": 0}, {"ttl_s": -1.0}, {"reap_interval_s": 0.0},
               {"tombstones": -1}, {"ttl_s": float("nan")}):
        with pytest.raises(ValueError):
            StreamStore(**kw)  # type: ignore[arg-type]
