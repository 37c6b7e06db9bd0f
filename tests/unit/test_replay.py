"""The one bounded seq log (``SeqLog`` + ``ByteBudget``) and the realtime journal
and outbox built on it: seqs without gaps, bounds that never drop the newest
event, a shared byte budget, cursors that answer exactly or say "resync"."""

from __future__ import annotations

import asyncio

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import (
    Envelope,
    InputAudioBufferCleared,
    OutputAudioDelta,
    SessionUpdated,
)
from vllm_duplex.domain.fence import Fence
from vllm_duplex.replay.journal import Journal, JournalBudget, wire_size
from vllm_duplex.replay.outbox import Notice, Outbox, OutboxLimits
from vllm_duplex.replay.seqlog import ByteBudget, SeqBounds, SeqLog

FENCE = Fence("s1")


def log_of(max_events: int = 100, max_bytes: int = 1000, max_age_s: float = 60.0,
           budget: ByteBudget | None = None) -> SeqLog[str]:
    return SeqLog(SeqBounds(max_events, max_bytes, max_age_s), budget)


def items(log: SeqLog[str]) -> list[str]:
    return [e.item for e in log]


# ---- SeqLog ----------------------------------------------------------------------


def test_appends_are_numbered_from_one_without_gaps() -> None:
    log = log_of()
    assert (log.head_seq, log.first_seq, len(log), log.oldest) == (0, 1, 0, None)
    entries = [log.append(x, 10, now=0.0) for x in "abc"]
    assert [e.seq for e in entries] == [1, 2, 3]
    assert (log.head_seq, log.first_seq, log.bytes, log.budget.used) == (3, 1, 30, 30)
    assert log.entry(2).item == "b"
    with pytest.raises(IndexError):
        log.entry(4)


@pytest.mark.parametrize("bounds, sizes, kept", [
    ({"max_events": 2}, [10, 10, 10], ["b", "c"]),
    ({"max_bytes": 25}, [10, 10, 10], ["b", "c"]),
    ({"max_bytes": 25}, [10, 10, 100], ["c"]),  # over alone: the newest still stays
])
def test_bounds_trim_the_oldest_never_the_newest(bounds: dict, sizes: list[int], kept: list[str]) -> None:
    log = log_of(**bounds)
    for item, size in zip("abc", sizes):
        log.append(item, size, now=0.0)
    assert items(log) == kept
    assert log.first_seq == 4 - len(kept) and log.head_seq == 3
    assert log.trimmed == log.budget.trimmed_total == 3 - len(kept)
    assert log.bytes == log.budget.used == sum(sizes[3 - len(kept):])


def test_age_bound_expires_old_entries_on_append_and_on_demand() -> None:
    log = log_of(max_age_s=5.0)
    log.append("a", 1, now=0.0)
    log.append("b", 1, now=4.0)
    log.append("c", 1, now=5.5)  # "a" is 5.5 s old
    assert items(log) == ["b", "c"]
    log.expire(now=100.0)
    assert items(log) == ["c"]  # the newest always stays
    assert log.trimmed == 2


def test_cursors_answer_exactly_the_entries_after_them_or_none() -> None:
    log = log_of(max_events=3)
    for x in "abcde":
        log.append(x, 1, now=0.0)
    assert log.first_seq == 3
    assert [e.item for e in log.after(2) or ()] == ["c", "d", "e"]
    assert [e.item for e in log.after(4) or ()] == ["e"]
    assert log.after(5) == ()
    assert log.after(1) is None  # seq 2 is gone: resync, never a gap
    assert log.after(0) is None


def test_release_forgets_acknowledged_entries_without_counting_them_trimmed() -> None:
    log = log_of()
    for x in "abc":
        log.append(x, 10, now=0.0)
    assert log.release_through(2) == 2
    assert log.release_through(2) == 0
    assert (items(log), log.first_seq, log.bytes, log.trimmed) == (["c"], 3, 10, 0)
    log.clear()
    assert (len(log), log.bytes, log.budget.used, log.first_seq, log.head_seq) == (0, 0, 0, 4, 3)


def test_a_shared_budget_counts_every_log_and_orders_their_entries() -> None:
    budget = ByteBudget(50)
    one, two = log_of(budget=budget), log_of(budget=budget)
    a = one.append("a", 20, now=0.0)
    b = two.append("b", 20, now=0.0)
    assert (budget.used, budget.over) == (40, False)
    c = one.append("c", 20, now=0.0)
    assert (budget.used, budget.over) == (60, True)  # the log only counts; its owner decides
    assert a.stamp < b.stamp < c.stamp
    two.trim_oldest()
    assert (budget.used, budget.over, budget.trimmed_total) == (40, False, 1)
    one.clear()
    assert budget.used == 0


# ---- Journal -----------------------------------------------------------------------


def env(seq: int) -> Envelope:
    return Envelope(seq, FENCE, InputAudioBufferCleared())


def journal(budget: JournalBudget | None = None, **kw: float) -> Journal:
    bounds = {"max_events": 100, "max_bytes": 1 << 20, "max_age_s": 60.0, **kw}
    return Journal(budget=budget, **bounds)  # type: ignore[arg-type]


def test_journal_takes_only_the_next_seq() -> None:
    j = journal()
    assert j.append(env(1), 0.0) == wire_size(env(1))
    with pytest.raises(ValueError, match="seq 3 after 1"):
        j.append(env(3), 0.0)
    assert (j.head_seq, len(j)) == (1, 1)


def test_journal_replays_after_a_cursor_or_says_resync() -> None:
    j = journal(max_events=3)
    for seq in range(1, 6):
        j.append(env(seq), 0.0)
    replay = j.replay(3)
    assert ([e.seq for e in replay.events], replay.resync, replay.first_seq, replay.head_seq) == (
        [4, 5], False, 3, 5)
    assert j.replay(5).events == ()
    stale = j.replay(1)
    assert (stale.events, stale.resync, stale.first_seq, stale.head_seq) == ((), True, 3, 5)
    for bad in (6, -1):
        with pytest.raises(DuplexError) as err:
            j.replay(bad)
        assert (err.value.code, err.value.param) == ("invalid_value", "last_seq")


def test_journal_ack_releases_and_refuses_a_seq_beyond_the_head() -> None:
    j = journal()
    for seq in range(1, 4):
        j.append(env(seq), 0.0)
    assert j.ack(2) == 2 and j.acked_seq == 2
    assert (j.first_seq, j.trimmed) == (3, 0)
    with pytest.raises(DuplexError) as err:
        j.ack(4)
    assert (err.value.code, err.value.param) == ("invalid_value", "seq")


def test_a_journal_over_the_shared_budget_trims_its_own_history_not_a_quiet_one() -> None:
    size = wire_size(env(1))
    budget = JournalBudget(size * 3)
    quiet, heavy = journal(budget), journal(budget)
    quiet.append(env(1), 0.0)
    for seq in range(1, 6):
        heavy.append(env(seq), 0.0)
    assert (len(quiet), len(heavy)) == (1, 2)
    assert budget.used == size * 3 and budget.trimmed_total == heavy.trimmed == 3
    quiet.clear()
    heavy.clear()
    assert budget.used == 0


def test_wire_size_counts_audio_as_base64_and_documents_by_their_text() -> None:
    def audio(n: int) -> int:
        return wire_size(Envelope(1, FENCE, OutputAudioDelta("r", "i", 0, 0, b"\0" * n)))

    assert audio(3000) - audio(0) == 4000  # base64: 4 characters per 3 bytes
    small = wire_size(Envelope(1, FENCE, SessionUpdated({"a": 1})))
    big = wire_size(Envelope(1, FENCE, SessionUpdated({"a": "x" * 300})))
    assert big - small == len(repr({"a": "x" * 300})) - len(repr({"a": 1}))


# ---- Outbox --------------------------------------------------------------------


async def test_outbox_cuts_off_a_socket_that_stops_reading_and_journals_on() -> None:
    size = wire_size(env(1))
    box = Outbox(journal(), OutboxLimits(max_events=2, max_bytes=size * 10))
    att, replay = box.attach()
    assert replay is None
    assert box.publish(env(1), 0.0) and box.publish(env(2), 0.0)
    assert att.pending_bytes == 2 * size
    assert not box.publish(env(3), 0.0)  # the third does not fit: cut off
    assert (box.slow_consumers, box.attachment, att.ended) == (1, None, Notice.SLOW_CONSUMER)
    assert await att.get() is Notice.SLOW_CONSUMER  # its backlog was dropped: it resumes instead
    assert box.publish(env(4), 0.0) and box.journal.head_seq == 4

    back, replay = box.attach(last_seq=2)
    assert replay is not None and [e.seq for e in replay.events] == [3, 4]
    assert [(await back.get()).seq for _ in range(2)] == [3, 4]  # type: ignore[union-attr]
    assert back.pending_bytes == 0
    box.close()
    assert await back.get() is None and box.journal.budget.used == 0


async def test_a_second_socket_replaces_the_first_and_a_bad_cursor_replaces_nothing() -> None:
    box = Outbox(journal(), OutboxLimits())
    first, _ = box.attach()
    box.publish(env(1), 0.0)
    with pytest.raises(DuplexError):
        box.attach(last_seq=5)
    assert box.attachment is first
    second, replay = box.attach(last_seq=0)
    assert replay is not None and [e.seq for e in replay.events] == [1]
    assert (await first.get()).seq == 1  # type: ignore[union-attr]
    assert await asyncio.wait_for(first.get(), 1) is Notice.REPLACED
    assert not box.detach(first) and box.detach(second)
    assert await second.get() is not None and await second.get() is None
