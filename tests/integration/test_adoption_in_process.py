"""Adoption and its writer in one process (plugin/durable/), over real
sockets: two servers share one store (a ``MemoryStore`` shared as Redis
would be), so the control plane is tested without Redis or signals (the
real processes: ``test_worker_adoption.py``).

* A session whose owner is known dead is adopted by the other server on
  ``session.resume``: its events after the client's seq, each once, its
  context for the next turn; the old owner, which still holds a copy, is
  fenced at its next lease renewal and drops it (``moved``).
* A store that stops answering: the session goes on (events flow without
  waiting for it), ``/health`` says durability is degraded; when it answers
  again, durability is back; a store that lost the session gets it written
  again from the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import urllib.request

import pytest
from support.realtime_fixtures import no_leaked_tasks, scripted_config  # noqa: F401
from support.router_fixtures import wait_until
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.store import StoreUnavailable
from vllm_duplex.host.deploy import StageSpec
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.host.store_config import StoreConfig
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}


def config():
    base = scripted_config(resume_grace_s=30)
    stages = tuple(StageSpec(s.type, {**s.options, "recall": True, "token_interval_s": 0.005})
                   if s.type == "scripted_llm" else s for s in base.stages)
    return dataclasses.replace(base, stages=stages, durability=StoreConfig(lease_ttl_s=0.6))


class FlakyStore(MemoryStore):
    """A shared in-memory store that can be made unreachable."""

    down = False

    async def apply(self, writes):
        if self.down:
            raise StoreUnavailable("down (test)")
        return await super().apply(writes)

    async def renew(self, leases, ttl_s):
        if self.down:
            raise StoreUnavailable("down (test)")
        return await super().renew(leases, ttl_s)

    async def load(self, session_id):
        if self.down:
            raise StoreUnavailable("down (test)")
        return await super().load(session_id)


async def text_client(url: str) -> RealtimeClient:
    c = await RealtimeClient.connect(url)
    await c.send({"type": "session.update", "session": TEXT})
    await c.wait_for("session.updated")
    return c


async def say(c: RealtimeClient, text: str) -> str:
    await c.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await c.send({"type": "response.create"})
    done = (await c.wait_for("response.done", timeout=20))["response"]
    return " ".join(p.get("text") or "" for i in done["output"] for p in i.get("content", []))


def lossless(*sockets: RealtimeClient) -> bool:
    seqs = [e["seq"] for c in sockets for e in c.events if isinstance(e.get("seq"), int)]
    return len(seqs) == len(set(seqs)) and sorted(seqs) == list(range(1, max(seqs) + 1))


async def test_the_other_server_adopts_and_the_old_owner_is_fenced():
    store = MemoryStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a, \
            BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        c = await text_client(a.ws_url)
        await say(c, "my name is Ada")
        c.ws.transport.abort()  # dropped: the session waits on a for its resume
        await store.mark_dead(a.runtime.durability.holder)  # as a supervisor that saw it die
        c.url = b.ws_url
        resumed = await c.reconnect()
        assert resumed.owner == "b"
        assert (await say(resumed, "my name?")).endswith("You said before: my name is Ada.")
        assert lossless(c, resumed)
        # a still held a copy: its next renewal finds the generation moved on.
        await wait_until(lambda: a.runtime.durability.fenced == 1, timeout=5)
        await wait_until(lambda: a.runtime.manager.peek(c.session_id) is None, timeout=5)
        assert (await store.load(c.session_id)).holder == b.runtime.durability.holder
        await resumed.close()


def health(server: BackgroundServer) -> dict:
    with urllib.request.urlopen(server.http_url + "/health", timeout=5) as resp:
        return json.loads(resp.read())["durability"]


async def test_a_store_that_stops_answering_degrades_durability_not_the_session():
    store = FlakyStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a:
        c = await text_client(a.ws_url)
        await say(c, "my color is green")
        store.down = True
        assert (await say(c, "color?")).endswith("You said before: my color is green.")
        assert (await asyncio.to_thread(health, a))["state"] == "degraded"
        store.down = False
        await wait_until(lambda: a.runtime.durability.degraded_since is None, timeout=5)
        await say(c, "again")
        await wait_until(lambda: a.runtime.durability.health()["backlog_writes"] == 0, timeout=5)
        stored = await store.load(c.session_id)
        assert stored.head_seq == c.last_seq  # what was written while down landed too
        # The store loses the session (a Redis restarted empty): written again, whole.
        store._records.clear()
        await wait_until(lambda: a.runtime.durability.reseeded == 1, timeout=5)
        await wait_until(lambda: store._records.get(c.session_id) is not None, timeout=5)
        assert (await store.load(c.session_id)).head_seq == c.last_seq
        assert (await asyncio.to_thread(health, a))["state"] == "ok"
        await c.close()


async def test_a_resume_that_needs_an_unreachable_store_is_told_to_retry():
    """A session not held here cannot be looked up while the store is away:
    ``store_unavailable`` (503, retryable), not an internal error; our
    client asks again until its open timeout, so a store that answers
    meanwhile (a restart) costs the caller a pause, not its session."""
    store = FlakyStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a, \
            BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        c = await text_client(a.ws_url)
        await say(c, "my color is green")
        c.ws.transport.abort()
        await store.mark_dead(a.runtime.durability.holder)
        store.down = True
        c.url = b.ws_url
        started = time.monotonic()
        with pytest.raises(RealtimeError) as refused:
            await c.reconnect(open_timeout=1.0)
        assert refused.value.code == "store_unavailable"
        assert (refused.value.event.get("error") or {}).get("retryable") is True
        assert time.monotonic() - started > 0.5  # asked again, not given up at the first refusal
        asyncio.get_running_loop().call_later(0.5, setattr, store, "down", False)
        resumed = await c.reconnect()
        assert resumed.owner == "b"
        assert (await say(resumed, "color?")).endswith("You said before: my color is green.")
        await resumed.close()


async def test_a_server_that_stops_leaves_its_sessions_to_be_adopted_at_once():
    """A deploy: the stopping server writes what it had and releases each
    session's lease (not deletes it), so the next resume adopts it."""
    store = MemoryStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a:
            c = await text_client(a.ws_url)
            await say(c, "my dog is Rex")
            c.ws.transport.abort()
        stored = await store.load(c.session_id)
        assert stored.holder is None and stored.head_seq == c.last_seq
        c.url = b.ws_url
        resumed = await c.reconnect()
        assert (await say(resumed, "dog?")).endswith("You said before: my dog is Rex.")
        assert lossless(c, resumed)
        await resumed.close()


CHUNK = b"\x00\x00" * 480  # 20 ms of silence at 24 kHz


async def two_chunks_committed(url: str) -> RealtimeClient:
    """A text session whose numbered input chunks 1 and 2 are committed."""
    c = await text_client(url)
    for seq in (1, 2):
        await c.append_audio(CHUNK, seq=seq)
    await c.commit()
    await c.wait_for("input_audio_buffer.committed")
    return c


async def test_numbered_input_goes_on_from_where_it_was_after_an_adoption():
    """``last_input_seq`` belongs to the session, not to its process: the
    adopter goes on numbering from the one stored with the session's state (a
    resend is a duplicate, a skip a gap naming the expected seq, as on the owner)."""
    store = MemoryStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a, \
            BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        c = await two_chunks_committed(a.ws_url)
        await wait_until(lambda: store._records[c.session_id].state.last_input_seq == 2, timeout=5)
        c.ws.transport.abort()
        await store.mark_dead(a.runtime.durability.holder)
        c.url = b.ws_url
        resumed = await c.reconnect()
        assert resumed.owner == "b" and resumed.events[0]["last_input_seq"] == 2
        await resumed.append_audio(CHUNK, seq=2)  # a resend: acknowledged as a duplicate
        gap = await resumed.append_audio(CHUNK, seq=4)
        err = await resumed.wait_for("error")
        assert err["error"]["code"] == "sequence_gap" and err["error"]["expected_seq"] == 3
        assert err["error"]["event_id"] == gap  # the duplicate raised nothing
        for seq in (3, 4):  # (a fresh resampler's first 20 ms may yield no sample yet)
            await resumed.append_audio(CHUNK, seq=seq)
        await resumed.commit()
        await resumed.wait_for("input_audio_buffer.committed", raise_on_error=True)
        await resumed.close()


async def test_a_question_half_sent_when_its_owner_died_is_asked_for_again():
    """The stored ``last_input_seq`` is where the input was last committed (or
    cleared), not the last chunk the dead worker took: the audio after it was
    only in that worker's buffer, so the adopter has the client send it again
    -- even when the session's state was saved after those chunks came."""
    store = MemoryStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a, \
            BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        c = await two_chunks_committed(a.ws_url)
        for seq in (3, 4):  # the next question, half sent
            await c.append_audio(CHUNK, seq=seq)
        # Something saves the state after them (the config changed).
        await c.send({"type": "session.update", "session": {"instructions": "Be brief."}})
        await c.wait_for("session.updated")
        await wait_until(lambda: store._records[c.session_id].state.config.instructions
                         == "Be brief.", timeout=5)
        c.ws.transport.abort()
        await store.mark_dead(a.runtime.durability.holder)
        c.url = b.ws_url
        resumed = await c.reconnect()
        assert resumed.owner == "b" and resumed.events[0]["last_input_seq"] == 2
        for seq in (3, 4):  # taken as new: the adopter never had them
            await resumed.append_audio(CHUNK, seq=seq)
        await resumed.commit()
        committed = await resumed.wait_for("input_audio_buffer.committed", raise_on_error=True)
        assert committed["item_id"]
        await resumed.close()


async def test_mcp_credentials_are_kept_for_the_adopter_and_reach_no_event_or_log(caplog):
    """An MCP tool's ``headers`` and ``authorization`` are in the stored config
    (the adopter calls the server with them: docs/deploy.md says the store
    must be trusted), never in a journaled event, never in a log line."""
    caplog.set_level(logging.DEBUG)
    secrets = ("hdr-secret-7c1e", "tok-secret-93fa")
    tool = {"type": "mcp", "server_label": "vault", "server_url": "http://127.0.0.1:9/mcp",
            "headers": {"X-Tenant": secrets[0]}, "authorization": secrets[1]}
    store = MemoryStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a, \
            BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        c = await text_client(a.ws_url)
        await c.send({"type": "session.update", "session": {"tools": [tool]}})
        await c.wait_for("mcp_list_tools.failed", timeout=20)  # nothing listens on port 9
        await say(c, "hello")
        c.ws.transport.abort()
        await store.mark_dead(a.runtime.durability.holder)
        c.url = b.ws_url
        resumed = await c.reconnect()
        await say(resumed, "again")
        adopted = b.runtime.manager.peek(c.session_id).core.config.tools[0]
        assert (adopted["headers"], adopted["authorization"]) == ({"X-Tenant": secrets[0]},
                                                                    secrets[1])
        journaled = [repr(e.item) for e in store._records[c.session_id].log]
        wire = [json.dumps(e) for e in c.events + resumed.events]
        logged = [r.getMessage() for r in caplog.records]
        assert len(journaled) > 5 and logged
        for secret in secrets:
            assert not [t for t in journaled + wire + logged if secret in t]
        await resumed.close()


async def test_the_clients_ack_trims_the_stored_journal_and_the_adopter_starts_after_it():
    """``session.event_ack`` trims the journal in the store as it trims the
    worker's: the adopter holds only the events after the ack (a resume from
    before it is a resync), and the conversation is whole all the same."""
    store = MemoryStore(MonotonicClock(), shared=True)
    async with BackgroundServer(Runtime(config(), instance_id="a", store=store)) as a, \
            BackgroundServer(Runtime(config(), instance_id="b", store=store)) as b:
        c = await text_client(a.ws_url)
        await say(c, "my name is Ada")
        acked = c.last_seq
        await c.ack()
        await wait_until(lambda: store._records[c.session_id].log.first_seq == acked + 1,
                         timeout=5)
        await say(c, "my cat is Tom")
        assert store._records[c.session_id].log.first_seq == acked + 1
        c.ws.transport.abort()
        await store.mark_dead(a.runtime.durability.holder)
        c.url = b.ws_url
        resumed = await c.reconnect()
        assert resumed.owner == "b" and lossless(c, resumed)
        adopted = b.runtime.manager.peek(c.session_id)
        assert adopted.journal.first_seq == acked + 1
        assert "my name is Ada" in json.dumps([i.wire() for i in adopted.core.items])
        assert (await say(resumed, "my name?")).endswith("You said before: my cat is Tom.")
        await resumed.close()
