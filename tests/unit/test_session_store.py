"""The session store's contract (plugin/durable/), on the in-memory store and
a virtual clock: leases are compare-and-set with generations, a stale
generation is fenced from every write, a journal is bounded like the
in-memory one and never answers with a gap, bytes from a store never name
arbitrary code, and a reply cut off by a crash ends ``incomplete`` as far as
it was sent. (The same contract on a real redis-server:
tests/integration/test_redis_store.py.)"""

from __future__ import annotations

import pickle

import pytest
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.durable.adopt import cut_reply
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.store import (
    Append,
    Bounds,
    Drop,
    Fenced,
    LeaseHeld,
    Lost,
    Save,
    SessionState,
    Trim,
    check_state,
    decode,
    encode,
    sha,
)
from vllm_duplex.durable.writer import Durability
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.host.store_config import STORE_URL_ENV, StoreConfig
from vllm_duplex.testing.clock import VirtualClock

pytestmark = pytest.mark.asyncio

S = "sess_aaaaaaaaaaaaaaaaaaaaaaaa.w1"
STATE = SessionState(config=None, items=(), token_sha=sha("tok") or "", key_sha=sha("key"))


def env(seq: int) -> Envelope:
    return Envelope(seq, Fence(S), ev.ResponseDone(response={"id": f"r{seq}"}))


def appends(gen: int, seqs, size: int = 10) -> list[Append]:
    return [Append(S, gen, s, size, 0.0, env(s)) for s in seqs]


async def created(clock, bounds=Bounds()) -> MemoryStore:
    store = MemoryStore(clock, bounds, shared=True)
    assert await store.apply([Save(S, 1, STATE, "w1#10", 5.0)]) == {S: 0}
    return store


async def test_a_live_lease_is_never_taken_a_lapsed_or_dead_one_is_with_the_next_generation():
    clock = VirtualClock()
    store = await created(clock)
    with pytest.raises(LeaseHeld) as held:
        await store.acquire(S, "w2#20", 5.0)
    assert held.value.owner == "w1" and held.value.generation == 1
    await clock.advance(5.1)
    assert await store.acquire(S, "w2#20", 5.0) == 2  # lapsed
    await store.mark_dead("w2#20")
    assert await store.acquire(S, "w1#11", 5.0) == 3  # its holder is known dead


async def test_the_stale_generation_is_fenced_from_every_write_and_renewal():
    clock = VirtualClock()
    store = await created(clock)
    assert await store.apply(appends(1, [1, 2])) == {S: 2}
    await clock.advance(6)
    assert await store.acquire(S, "w2#20", 5.0) == 2
    out = await store.apply(appends(1, [3]) + [Save(S, 1, STATE)])
    assert isinstance(out[S], Fenced)
    assert isinstance((await store.renew({S: ("w1#10", 1)}, 5.0))[S], Fenced)
    assert (await store.load(S)).head_seq == 2  # nothing of the stale owner landed
    assert await store.apply(appends(2, [3])) == {S: 3}


async def test_a_session_the_store_lost_is_lost_not_fenced_and_a_save_with_a_holder_writes_it_again():
    store = MemoryStore(VirtualClock(), shared=True)
    assert isinstance((await store.renew({S: ("w1#10", 4)}, 5.0))[S], Lost)
    assert isinstance((await store.apply(appends(4, [7])))[S], Lost)
    assert await store.apply([Save(S, 4, STATE, "w1#10", 5.0)] + appends(4, [7, 8])) == {S: 8}
    stored = await store.load(S)
    assert (stored.generation, stored.first_seq, stored.head_seq) == (4, 7, 8)


async def test_the_journal_is_bounded_and_answers_exactly_after_a_cursor_or_a_resync():
    clock = VirtualClock()
    store = await created(clock, Bounds(max_events=3, max_bytes=1000, max_age_s=60))
    await store.apply(appends(1, range(1, 6)))
    assert [e.seq for e in await store.events_after(S, 3)] == [4, 5]
    assert await store.events_after(S, 5) == []
    assert await store.events_after(S, 1) is None  # seq 2 fell out: resync, never a gap
    await clock.advance(61)
    await store.apply(appends(1, [6]))
    assert [e.seq for e in await store.events_after(S, 5)] == [6]
    assert await store.events_after(S, 4) is None  # too old


async def test_an_ack_trims_the_journal_up_to_its_seq_fenced_like_every_write():
    """``Trim`` (the client's ``session.event_ack``): the acked events go,
    their bytes with them, not counted as trimmed by a bound; a cursor before
    them is a resync; the head stays and the journal goes on after it."""
    clock = VirtualClock()
    store = await created(clock)
    await store.apply(appends(1, range(1, 6)))
    assert await store.apply([Trim(S, 1, 3)]) == {S: 5}
    stored = await store.load(S)
    assert (stored.first_seq, stored.head_seq) == (4, 5)
    assert [e.seq for e in await store.events_after(S, 3)] == [4, 5]
    assert await store.events_after(S, 2) is None  # acked, gone: a resync, never a gap
    log = store._records[S].log
    assert (log.bytes, log.trimmed) == (20, 0)
    assert await store.apply([Trim(S, 1, 2), Trim(S, 1, 9)]) == {S: 5}  # an old ack; past all
    stored = await store.load(S)
    assert (stored.first_seq, stored.head_seq, log.bytes) == (6, 5, 0)
    assert await store.events_after(S, 5) == []
    await store.apply(appends(1, [6]))
    assert [e.seq for e in await store.events_after(S, 5)] == [6]
    await clock.advance(6)
    assert await store.acquire(S, "w2#20", 5.0) == 2
    assert isinstance((await store.apply([Trim(S, 1, 6)]))[S], Fenced)
    assert [e.seq for e in await store.events_after(S, 5)] == [6]  # the stale ack landed not
    assert isinstance((await store.apply([Trim("sess_gone.w1", 1, 1)]))["sess_gone.w1"], Lost)


class _Copy:
    """A ``Mirrored`` with nothing but a state."""

    kind = "realtime"
    session_id = S

    def durable_state(self):
        return STATE

    def durable_journal(self):
        return ()

    async def drop_moved(self):
        return None


async def test_the_writer_queues_acks_as_one_trim_behind_the_appends():
    clock = VirtualClock()
    store = MemoryStore(clock, shared=True)
    durability = Durability(store, "w1#10", clock=clock)
    durability.follow(_Copy(), 1)
    for seq in (1, 2, 3):
        durability.append(S, seq, 10, env(seq))
    durability.acked(S, 1)
    durability.acked(S, 2)  # a burst of acks: one trim, the highest
    durability.acked("sess_not_here.w1", 3)  # not mirrored: nothing
    queued = list(durability._queue)
    assert [type(w).__name__ for w in queued] == ["Save", "Append", "Append", "Append", "Trim"]
    assert queued[-1] == Trim(S, 1, 2)
    await durability.start()
    await durability.stop()
    stored = await store.load(S)
    assert (stored.first_seq, stored.head_seq) == (3, 3)


async def test_an_adoption_of_nothing_and_a_duplicate_new_session_are_typed_errors():
    store = await created(VirtualClock())
    with pytest.raises(DuplexError) as err:
        await store.acquire("sess_bbbbbbbbbbbbbbbbbbbbbbbb.w1", "w2#1", 5.0)
    assert err.value.code == "session_not_found"
    with pytest.raises(DuplexError) as err:
        await store.acquire(S, "w2#1", 5.0, new=True)
    assert err.value.code == "duplicate_id"


async def test_a_drop_forgets_the_session_a_release_keeps_it_for_adoption_at_once():
    clock = VirtualClock()
    store = await created(clock)
    await store.apply([Drop(S, 1, release_only=True)])
    assert (await store.load(S)).holder is None
    assert await store.acquire(S, "w2#20", 5.0) == 2
    await store.apply([Drop(S, 2)])
    assert await store.load(S) is None
    # The first owner wakes up: fenced by the generation the drop kept, never
    # "lost" (it would write its stale copy back), until the store forgets it.
    assert isinstance((await store.renew({S: ("w1#10", 1)}, 5.0))[S], Fenced)
    assert isinstance((await store.apply([Save(S, 1, STATE)]))[S], Fenced)
    with pytest.raises(DuplexError) as err:  # nor is the id anyone's again
        await store.acquire(S, "w3#1", 5.0, new=True)
    assert err.value.code == "duplicate_id"


async def test_an_id_claimed_but_never_used_is_forgotten_whole():
    """A chosen id claimed for a session that could not be opened (a full
    worker): dropped with ``forget``, it may be claimed again at once."""
    store = MemoryStore(VirtualClock(), shared=True)
    assert await store.acquire("app:mine", "w1#10", 5.0, new=True) == 1
    await store.apply([Drop("app:mine", 1, forget=True)])
    assert await store.acquire("app:mine", "w2#20", 5.0, new=True) == 1


async def test_only_the_sessions_key_with_its_token_may_resume_it():
    store = await created(VirtualClock())
    stored = await store.load(S)
    check_state(stored, "key", "tok")
    for key, token, code in (("other", "tok", "session_not_found"),
                             (None, "tok", "session_not_found"),
                             ("key", "nope", "invalid_resume_token")):
        with pytest.raises(DuplexError) as err:
            check_state(stored, key, token)
        assert err.value.code == code


async def test_decoding_refuses_what_is_not_our_value_types():
    assert decode(encode(env(3))) == env(3)
    assert decode(encode(STATE)) == STATE
    with pytest.raises(pickle.UnpicklingError):
        decode(pickle.dumps(print))  # a builtin function: never ours to load
    with pytest.raises(pickle.UnpicklingError):
        decode(b"cos\nsystem\n(S'true'\ntR.")  # os.system, as an attacker would write it


async def test_a_reply_cut_off_by_the_crash_ends_incomplete_as_far_as_it_was_sent():
    item = ConversationItem("item_1", ItemType.MESSAGE, Role.ASSISTANT, status="in_progress",
                            content=[ContentPart("output_audio", transcript="")])
    user = ConversationItem("item_0", ItemType.MESSAGE, Role.USER,
                            content=[ContentPart("input_text", text="hi")])
    delta = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
    events = [Envelope(1, Fence(S), ev.ResponseCreated(response={"id": "resp_1",
                                                                 "status": "in_progress"})),
              Envelope(2, Fence(S), ev.OutputAudioTranscriptDelta(**delta, delta="Hello ")),
              Envelope(3, Fence(S), ev.OutputAudioTranscriptDelta(**delta, delta="there"))]
    closing = cut_reply([user, item], events)
    assert len(closing) == 1 and isinstance(closing[0], ev.ResponseDone)
    done = closing[0].response
    assert done["status"] == "incomplete"
    assert done["status_details"] == {"type": "incomplete", "reason": "owner_lost"}
    assert done["output"][0]["content"][0]["transcript"] == "Hello there"
    assert item.status == "incomplete" and item.content[0].transcript == "Hello there"
    finished = events + [Envelope(4, Fence(S), ev.ResponseDone(response={"id": "resp_1"}))]
    assert cut_reply([user], finished) == []  # a reply that ended: nothing to end


@pytest.mark.parametrize("raw,message", [
    ({"store": "disk"}, "memory or redis"),
    ({"store": "memory", "url": "redis://x:1/0"}, "needs durability.store: redis"),
    ({"store": "redis", "url": "http://x"}, "redis://"),
    ({"store": "redis", "lease_ttl_s": 0.1}, "lease_ttl_s"),
    ({"store": "redis", "ttl": 5}, "unknown durability keys"),
])
async def test_a_bad_durability_config_fails_loudly(raw, message):
    with pytest.raises(ValueError, match=message):
        StoreConfig.from_raw(raw)


async def test_redis_without_a_url_is_refused_where_no_supervisor_gives_one(monkeypatch):
    monkeypatch.delenv(STORE_URL_ENV, raising=False)
    raw = {"name": "x", "model": "m", "policy": "scripted", "stages": [],
           "durability": {"store": "redis"}}
    config = DeployConfig.from_dict(raw)
    assert config.durability.durable and config.durability.resolved_url() is None
    monkeypatch.setenv(STORE_URL_ENV, "redis://127.0.0.1:6400/0")
    assert config.durability.resolved_url() == "redis://127.0.0.1:6400/0"
    assert DeployConfig.from_dict({**raw, "durability": None}).durability.store == "memory"
