"""Mailbox: lane priority, FIFO per lane, bounded DATA lane, close semantics."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_duplex.domain.commands import (
    AudioAppend,
    AudioCommit,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
)
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.session.mailbox import (
    Lane,
    Mailbox,
    MailboxClosed,
    MailboxFull,
    lane_of,
)


async def drain(mb: Mailbox) -> list[tuple[Lane, object]]:
    out = []
    while mb.qsize():
        out.append(await mb.get())
    return out


async def test_priority_order_across_lanes() -> None:
    mb: Mailbox[str] = Mailbox()
    mb.put_nowait("d1", Lane.DATA)
    mb.put_nowait("s1", Lane.STAGE)
    mb.put_nowait("c1", Lane.CONTROL)
    mb.put_nowait("d2", Lane.DATA)
    mb.put_nowait("c2", Lane.CONTROL)
    got = await drain(mb)
    assert got == [
        (Lane.CONTROL, "c1"),
        (Lane.CONTROL, "c2"),
        (Lane.STAGE, "s1"),
        (Lane.DATA, "d1"),
        (Lane.DATA, "d2"),
    ]
    assert mb.enqueued == 5
    # c1, c2 and s1 each passed d1, which arrived before all of them.
    assert mb.overtaken == 3


async def test_fifo_within_lane() -> None:
    mb: Mailbox[int] = Mailbox()
    for i in range(10):
        mb.put_nowait(i, Lane.DATA)
    assert [item for _, item in await drain(mb)] == list(range(10))
    assert mb.overtaken == 0


async def test_no_overtake_counted_when_data_is_newer() -> None:
    mb: Mailbox[str] = Mailbox()
    mb.put_nowait("c", Lane.CONTROL)
    mb.put_nowait("d", Lane.DATA)
    await drain(mb)
    assert mb.overtaken == 0


async def test_control_behind_100_data_items_is_delivered_first() -> None:
    # "a response.cancel sent behind 100 queued audio appends is applied before them"
    mb: Mailbox[object] = Mailbox()
    for i in range(100):
        mb.put_nowait(AudioAppend(audio=b"\0\0", seq=i), lane_of(AudioAppend(audio=b"")))
    cancel = ResponseCancel(event_id="evt_cancel")
    mb.put_nowait(cancel, lane_of(cancel))
    lane, first = await mb.get()
    assert (lane, first) == (Lane.CONTROL, cancel)
    assert mb.overtaken == 1
    assert mb.qsize(Lane.DATA) == 100
    rest = await drain(mb)
    assert [c.seq for _, c in rest] == list(range(100))


def client_mailbox() -> Mailbox[object]:
    """The session's rule: an urgent command passes only queued media."""
    return Mailbox(passable=lambda item: getattr(item, "media", False))


def deliver(mb: Mailbox[object], command: object) -> None:
    mb.put_nowait(command, lane_of(command), ordered=True)


async def test_a_cancel_never_overtakes_an_earlier_command() -> None:
    # LiveKit's test sends these back to back: the cancel must find the
    # response the create before it started (OpenAI handles a socket's events
    # in order), and the second create comes after the cancel.
    mb = client_mailbox()
    update, create = SessionUpdate(patch=SessionPatch()), ResponseCreate(event_id="c1")
    cancel, again = ResponseCancel(event_id="x"), ResponseCreate(event_id="c2")
    for command in (update, create, cancel, again):
        deliver(mb, command)
    assert [item for _, item in await drain(mb)] == [update, create, cancel, again]
    assert mb.overtaken == 0


async def test_a_cancel_passes_audio_but_waits_for_the_command_before_it() -> None:
    mb = client_mailbox()
    audio = [AudioAppend(audio=b"\0\0", seq=i) for i in range(3)]
    commit, cancel = AudioCommit(), ResponseCancel()
    for command in (audio[0], audio[1], commit, audio[2], cancel):
        deliver(mb, command)
    # audio 0 and 1 go before the commit that holds them, then the cancel
    # passes audio 2 (a cancel never waits behind audio decoding)
    assert [item for _, item in await drain(mb)] == [audio[0], audio[1], commit, cancel,
                                                      audio[2]]


async def test_a_waiting_cancel_lets_internal_control_items_pass() -> None:
    # a timer is not a client command: it never waits for one
    mb = client_mailbox()
    create, cancel = ResponseCreate(), ResponseCancel()
    deliver(mb, create)
    deliver(mb, cancel)
    mb.put_nowait("timer", Lane.CONTROL)
    assert [item for _, item in await drain(mb)] == ["timer", create, cancel]


async def test_a_waiting_cancel_goes_once_a_paused_data_lane_resumes() -> None:
    mb = client_mailbox()
    create, cancel = ResponseCreate(), ResponseCancel()
    mb.pause(Lane.DATA)
    deliver(mb, create)
    deliver(mb, cancel)
    getter = asyncio.ensure_future(mb.get())
    await asyncio.sleep(0)
    assert not getter.done()  # the cancel waits for the create, whose lane is paused
    mb.resume(Lane.DATA)
    assert await getter == (Lane.DATA, create)
    assert await mb.get() == (Lane.CONTROL, cancel)


async def test_data_lane_is_bounded_other_lanes_are_not() -> None:
    mb: Mailbox[int] = Mailbox(data_capacity=2)
    mb.put_nowait(1, Lane.DATA)
    mb.put_nowait(2, Lane.DATA)
    with pytest.raises(MailboxFull) as exc:
        mb.put_nowait(3, Lane.DATA)
    assert exc.value.lane is Lane.DATA and exc.value.capacity == 2
    for i in range(50):
        mb.put_nowait(i, Lane.CONTROL)
        mb.put_nowait(i, Lane.STAGE)
    assert mb.qsize(Lane.DATA) == 2
    assert mb.qsize() == 102


async def test_optional_priority_capacity() -> None:
    mb: Mailbox[int] = Mailbox(data_capacity=1, priority_capacity=1)
    mb.put_nowait(1, Lane.CONTROL)
    with pytest.raises(MailboxFull):
        mb.put_nowait(2, Lane.CONTROL)


async def test_put_waits_for_room_and_resumes() -> None:
    mb: Mailbox[int] = Mailbox(data_capacity=1)
    mb.put_nowait(1, Lane.DATA)
    putter = asyncio.create_task(mb.put(2, Lane.DATA))
    await asyncio.sleep(0)
    assert not putter.done()
    # Non-DATA puts never wait even while DATA is full.
    await asyncio.wait_for(mb.put(9, Lane.CONTROL), timeout=1)
    assert await mb.get() == (Lane.CONTROL, 9)
    assert not putter.done()
    assert await mb.get() == (Lane.DATA, 1)
    await putter
    assert await mb.get() == (Lane.DATA, 2)


def _join_strings(older: object, newer: object) -> object:
    both = isinstance(older, str) and isinstance(newer, str)
    return older + newer if both else None  # type: ignore[operator]


async def test_a_full_stage_lane_merges_into_its_newest_item_or_waits() -> None:
    mb: Mailbox[object] = Mailbox(stage_capacity=2)
    await mb.put("a", Lane.STAGE, _join_strings)
    await mb.put(1, Lane.STAGE, _join_strings)
    await asyncio.wait_for(mb.put(2, Lane.CONTROL), 1)  # other lanes are not held up
    putter = asyncio.create_task(mb.put("b", Lane.STAGE, _join_strings))
    await asyncio.sleep(0)
    assert not putter.done()  # 1 and "b" cannot merge: the producer waits
    assert await mb.get() == (Lane.CONTROL, 2)
    assert await mb.get() == (Lane.STAGE, "a")
    await asyncio.wait_for(putter, 1)  # room again
    await mb.put("c", Lane.STAGE, _join_strings)  # full: merges into "b"
    await mb.put("d", Lane.STAGE, _join_strings)
    assert mb.qsize(Lane.STAGE) == 2 and mb.merged == 2 and mb.peak[Lane.STAGE] == 2
    assert [item for _, item in await drain(mb)] == [1, "bcd"]  # order kept


async def test_a_stage_lane_with_room_never_merges() -> None:
    mb: Mailbox[object] = Mailbox(stage_capacity=3)
    for item in "xyz":
        await mb.put(item, Lane.STAGE, _join_strings)
    assert mb.merged == 0 and [i for _, i in await drain(mb)] == ["x", "y", "z"]


async def test_a_paused_lane_is_skipped_until_resumed() -> None:
    mb: Mailbox[str] = Mailbox(data_capacity=2)
    mb.pause(Lane.DATA)
    mb.put_nowait("d1", Lane.DATA)  # still accepted, up to its bound
    mb.put_nowait("d2", Lane.DATA)
    with pytest.raises(MailboxFull):
        mb.put_nowait("d3", Lane.DATA)
    mb.put_nowait("s", Lane.STAGE)
    assert await mb.get() == (Lane.STAGE, "s")
    getter = asyncio.create_task(mb.get())
    await asyncio.sleep(0)
    assert not getter.done()  # only paused items are left
    mb.resume(Lane.DATA)
    assert await asyncio.wait_for(getter, 1) == (Lane.DATA, "d1")


async def test_get_waits_then_receives() -> None:
    mb: Mailbox[str] = Mailbox()
    getter = asyncio.create_task(mb.get())
    await asyncio.sleep(0)
    assert not getter.done()
    mb.put_nowait("x", Lane.STAGE)
    assert await getter == (Lane.STAGE, "x")


async def test_close_wakes_waiting_get_and_put_and_discards() -> None:
    mb: Mailbox[int] = Mailbox(data_capacity=1)
    getter = asyncio.create_task(mb.get())
    await asyncio.sleep(0)
    mb.put_nowait(1, Lane.DATA)
    assert await getter == (Lane.DATA, 1)
    mb.put_nowait(2, Lane.DATA)
    putter = asyncio.create_task(mb.put(3, Lane.DATA))
    await asyncio.sleep(0)
    assert mb.close() == 1  # the one pending item is discarded
    with pytest.raises(MailboxClosed):
        await putter

    empty: Mailbox[int] = Mailbox()
    waiting = asyncio.create_task(empty.get())
    await asyncio.sleep(0)
    assert empty.close() == 0
    with pytest.raises(MailboxClosed):
        await waiting


async def test_closed_mailbox_rejects_everything() -> None:
    mb: Mailbox[int] = Mailbox()
    mb.put_nowait(1, Lane.CONTROL)
    mb.close()
    assert mb.closed and mb.qsize() == 0
    assert mb.close() == 0  # idempotent
    with pytest.raises(MailboxClosed):
        await mb.get()
    with pytest.raises(MailboxClosed):
        mb.put_nowait(2, Lane.DATA)
    with pytest.raises(MailboxClosed):
        await mb.put(2, Lane.DATA)


async def test_cancelled_getter_passes_wakeup_on() -> None:
    mb: Mailbox[str] = Mailbox()
    g1 = asyncio.create_task(mb.get())
    g2 = asyncio.create_task(mb.get())
    await asyncio.sleep(0)
    mb.put_nowait("x", Lane.DATA)  # wakes g1 ...
    g1.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await g1
    assert await asyncio.wait_for(g2, timeout=1) == (Lane.DATA, "x")


async def test_cancelled_putter_passes_room_on() -> None:
    mb: Mailbox[int] = Mailbox(data_capacity=1)
    mb.put_nowait(0, Lane.DATA)
    p1 = asyncio.create_task(mb.put(1, Lane.DATA))
    p2 = asyncio.create_task(mb.put(2, Lane.DATA))
    await asyncio.sleep(0)
    assert await mb.get() == (Lane.DATA, 0)  # wakes p1 ...
    p1.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await p1
    await asyncio.wait_for(p2, timeout=1)
    assert await mb.get() == (Lane.DATA, 2)


puts = st.lists(st.tuples(st.sampled_from(list(Lane)), st.integers()), max_size=60)


@settings(max_examples=200, deadline=None)
@given(puts)
def test_property_fifo_per_lane_and_nondecreasing_lanes(ops: list[tuple[Lane, int]]) -> None:
    async def run() -> list[tuple[Lane, tuple[int, int]]]:
        mb: Mailbox[tuple[int, int]] = Mailbox(data_capacity=len(ops) + 1)
        for i, (lane, value) in enumerate(ops):
            mb.put_nowait((i, value), lane)
        return await drain(mb)

    got = asyncio.run(run())
    assert len(got) == len(ops)
    lanes = [lane for lane, _ in got]
    assert lanes == sorted(lanes)
    for lane in Lane:
        expected = [(i, v) for i, (ln, v) in enumerate(ops) if ln is lane]
        assert [item for ln, item in got if ln is lane] == expected
