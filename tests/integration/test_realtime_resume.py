"""Lossless resume over a real socket: disconnect,
reconnect with ``session.resume``, and get exactly the events after
``last_seq``; token rotation, takeover, grace expiry, retention and resync,
event acks, lease compare-and-swap, slow consumers, and the chaos test (a
disconnect at every event boundary loses and duplicates nothing)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
import websockets
from support.realtime_fixtures import module_server, no_leaked_tasks, scripted_config, serve  # noqa: F401
from vllm_duplex.host.deploy import StageSpec
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}
KEYS = ("key-a", "key-b")


def resumable(**limits: Any):
    config = scripted_config(api_keys=KEYS, reply="One two three four five six seven eight.",
                             **{"resume_grace_s": 5.0, **limits})
    fast = tuple(StageSpec(s.type, {**s.options, "token_interval_s": 0.002})
                 if s.type == "scripted_llm" else s for s in config.stages)
    return dataclasses.replace(config, stages=fast)


server = module_server(resumable())


async def open_client(server, key: str = KEYS[0]) -> RealtimeClient:
    return await RealtimeClient.connect(server.ws_url, api_key=key)


async def ask(rt: RealtimeClient, text: str = "hi") -> None:
    """A whole text turn, sent at once (the session works it in order)."""
    await rt.send({"type": "session.update", "session": TEXT})
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await rt.send({"type": "response.create"})


async def until(rt: RealtimeClient, event_type: str, timeout: float = 10) -> list[dict]:
    got = []
    async with asyncio.timeout(timeout):
        while True:
            event = await rt.recv()
            got.append(event)
            if event["type"] == event_type:
                return got


def journaled(events: list[dict]) -> list[dict]:
    return [e for e in events if isinstance(e.get("seq"), int)]


def shape(event: dict) -> tuple:
    """An event without what differs between runs (event ids, timestamps, minted ids)."""
    keep = {k: v for k, v in event.items() if k in ("seq", "type", "delta", "text", "transcript")}
    return tuple(sorted(keep.items()))


async def drop(rt: RealtimeClient) -> None:
    await rt.close(end_session=False)  # gone without a goodbye: the session waits


async def test_resume_replays_exactly_what_came_after_the_cursor(server):
    rt = await open_client(server)
    await ask(rt)
    await until(rt, "response.output_item.added")
    head = rt.events  # session.created included
    cursor = rt.last_seq
    await drop(rt)
    await asyncio.sleep(0.1)  # the reply goes on while nobody listens
    back = await rt.reconnect()
    try:
        resumed = back.events[0]
        assert resumed["type"] == "session.resumed" and "seq" not in resumed
        assert resumed["session_id"] == rt.session_id and resumed["last_seq"] == cursor
        assert resumed["resume_token"] != rt.resume_token  # rotated
        rest = journaled(await until(back, "response.done"))
        seqs = [e["seq"] for e in journaled(head) + rest]
        assert seqs == list(range(1, len(seqs) + 1))  # no gap, no duplicate
        assert rest[0]["seq"] == cursor + 1
        # the old token is spent
        with pytest.raises(RealtimeError) as info:
            await RealtimeClient.resume(server.ws_url, rt.session_id, rt.resume_token, 0,
                                        api_key=KEYS[0])
        assert info.value.code == "invalid_resume_token"
        # and the session still works live
        await back.send({"type": "response.create"})
        live = await until(back, "response.done")
        assert journaled(live)[0]["seq"] == seqs[-1] + 1
    finally:
        await back.close()


async def test_refusals_are_typed_and_distinct(server):
    rt = await open_client(server)
    await rt.update_session(TEXT)
    sid, token, head = rt.session_id, rt.resume_token, rt.last_seq
    await drop(rt)
    cases = [({"session_id": "sess_nope"}, KEYS[0], "session_not_found"),
             ({}, KEYS[1], "session_not_found"),  # another key: the session does not exist
             ({"last_seq": head + 5}, KEYS[0], "invalid_value"),
             ({"generation": 99}, KEYS[0], "lease_conflict")]
    for change, key, code in cases:
        args = {"session_id": sid, "resume_token": token, "last_seq": head, **change}
        with pytest.raises(RealtimeError) as info:
            await RealtimeClient.resume(server.ws_url, args["session_id"], args["resume_token"],
                                        args["last_seq"], api_key=key,
                                        generation=change.get("generation"))
        assert info.value.code == code, (change, info.value.event)
    # none of the refusals spent the token
    back = await RealtimeClient.resume(server.ws_url, sid, token, head, api_key=KEYS[0])
    assert back.events[0]["generation"] >= 1
    await back.close()


async def test_a_second_socket_takes_the_session_over(server):
    first = await open_client(server)
    await first.update_session(TEXT)
    second = await RealtimeClient.resume(server.ws_url, first.session_id, first.resume_token,
                                         first.last_seq, api_key=KEYS[0])
    replaced = await first.wait_for("session.replaced", timeout=5)
    assert replaced["session_id"] == first.session_id
    with pytest.raises(websockets.ConnectionClosed):
        await first.recv(timeout=5)
    assert first.ws.close_code == 4002
    await ask(second)
    assert (await second.wait_for("response.done"))["response"]["status"] == "completed"
    await second.close()


async def test_a_cursor_out_of_retention_gets_a_resync_then_live_events(server):
    async with serve(resumable(journal_events=4)) as small:
        rt = await RealtimeClient.connect(small.ws_url, api_key=KEYS[0])
        await ask(rt)
        await until(rt, "response.done")
        await drop(rt)
        back = await RealtimeClient.resume(small.ws_url, rt.session_id, rt.resume_token, 1,
                                           api_key=KEYS[0])
        resync = await back.wait_for("session.resync_required")
        assert resync["reason"] == "retention_exceeded" and resync["first_seq"] > 2
        assert resync["head_seq"] == rt.last_seq and "seq" not in resync
        roles = [i["role"] for i in resync["items"] if i["type"] == "message"]
        assert roles == ["user", "assistant"]  # the state to start again from
        assert resync["session"]["id"] == rt.session_id
        # journaling went on: the next events follow the head, and resume works again
        await back.send({"type": "response.create"})
        live = journaled(await until(back, "response.done"))
        assert live[0]["seq"] == rt.last_seq + 1
        again = await back.reconnect()
        assert again.events[0]["type"] == "session.resumed"
        await again.close()


async def test_event_ack_releases_what_the_client_has(server):
    rt = await open_client(server)
    await ask(rt)
    await until(rt, "response.done")
    await rt.ack()
    await rt.send({"type": "conversation.item.retrieve", "item_id": "nope"})  # a marker behind the ack
    await rt.wait_for("error")
    session, _ = server.runtime.manager.get(rt.session_id, KEYS[0])
    assert session.journal.first_seq == rt.last_seq  # only the marker's error is kept
    await rt.send({"type": "session.event_ack", "seq": 10_000})
    err = await rt.wait_for("error")
    assert err["error"]["code"] == "invalid_value" and err["error"]["param"] == "seq"
    await drop(rt)
    back = await RealtimeClient.resume(server.ws_url, rt.session_id, rt.resume_token, 2,
                                       api_key=KEYS[0])
    assert (await back.wait_for("session.resync_required"))["first_seq"] > 3
    await back.close()


async def test_no_resume_within_grace_expires_the_session(server):
    async with serve(resumable(resume_grace_s=0.3)) as short:
        rt = await RealtimeClient.connect(short.ws_url, api_key=KEYS[0])
        await drop(rt)
        await asyncio.sleep(1.5)  # grace, then the reaper's 1 s pass
        with pytest.raises(RealtimeError) as info:
            await rt.reconnect()
        assert info.value.code == "session_expired"  # not session_not_found
        assert len(short.runtime.manager) == 0


async def test_a_slow_consumer_loses_its_socket_but_nothing_else(server):
    async with serve(resumable(outbound_capacity=6)) as tight:
        rt = await RealtimeClient.connect(tight.ws_url, api_key=KEYS[0])
        await rt.update_session(TEXT)
        session, _ = tight.runtime.manager.get(rt.session_id, KEYS[0])
        cursor = rt.last_seq
        # Stop reading: many tiny events overflow the socket's queue of 6.
        for _ in range(40):
            await rt.send({"type": "conversation.item.retrieve", "item_id": "nope"})
        async with asyncio.timeout(10):
            while tight.runtime.metrics.slow_consumers.get() == 0:
                await asyncio.sleep(0.01)
        assert session.close_reason is None  # the session lives on
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await rt.recv(timeout=5)
        assert rt.ws.close_code == 4008
        back = await RealtimeClient.resume(tight.ws_url, rt.session_id, rt.resume_token, cursor,
                                           api_key=KEYS[0])
        errors = []
        async with asyncio.timeout(10):
            while len(errors) < 40:
                event = await back.recv()
                errors += [event] if event["type"] == "error" else []
        assert [e["seq"] for e in errors] == list(range(cursor + 1, cursor + 41))  # none lost
        await back.close()


async def uninterrupted(server) -> list[tuple]:
    rt = await open_client(server)
    await ask(rt)
    events = journaled(await until(rt, "response.done"))
    await rt.close()
    return [shape(e) for e in events]


async def test_chaos_a_disconnect_at_every_event_boundary_loses_nothing(server):
    """The same scripted conversation, cut after event k and resumed, for every k:
    the events seen before the cut plus those after the resume are the
    uninterrupted stream (ids and timestamps aside): zero lost, zero duplicated."""
    reference = await uninterrupted(server)
    assert len(reference) > 15
    for k in range(1, len(reference)):
        rt = await open_client(server)
        await ask(rt)
        before = []
        while len(before) < k:
            event = await rt.recv(timeout=10)
            before += [event] if isinstance(event.get("seq"), int) else []
        await drop(rt)
        back = await RealtimeClient.resume(server.ws_url, rt.session_id, rt.resume_token,
                                           before[-1]["seq"], api_key=KEYS[0])
        after = journaled(await until(back, "response.done"))
        await back.close()
        assert [shape(e) for e in before + after] == reference, f"cut after event {k}"


async def test_resume_needs_the_resume_socket(server):
    rt = await open_client(server)
    await rt.send({"type": "session.resume", "session_id": rt.session_id,
                   "resume_token": rt.resume_token, "last_seq": 0})
    err = await rt.wait_for("error")
    assert err["error"]["code"] == "invalid_event"
    await rt.close()
    url = server.ws_url + "?resume=1"
    async with websockets.connect(url, additional_headers={"authorization": f"Bearer {KEYS[0]}"}) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {}}))
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_event"
        await ws.send("{not json")
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_json"


async def test_numbered_input_chunks_survive_a_resume(server):
    """Numbered input on the realtime socket: numbered appends; a duplicate is
    ignored, a gap refused with the expected seq; a resume says what arrived."""
    rt = await open_client(server)
    await rt.update_session(TEXT)
    chunk = b"\x00\x00" * 480
    for seq in (1, 2, 2):
        await rt.append_audio(chunk, seq=seq)
    gap = await rt.append_audio(chunk, seq=5)
    err = await rt.wait_for("error")
    assert err["error"]["code"] == "sequence_gap" and err["error"]["expected_seq"] == 3
    assert err["error"]["event_id"] == gap
    await drop(rt)
    back = await rt.reconnect()
    assert back.events[0]["last_input_seq"] == 2
    await back.append_audio(chunk, seq=3)
    await back.commit()
    committed = await back.wait_for("input_audio_buffer.committed")
    assert committed["item_id"]
    await back.close()
