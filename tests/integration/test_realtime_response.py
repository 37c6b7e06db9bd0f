"""Turns and responses over a real socket: server VAD, event order, cancel, barge-in.

Pinned: a server VAD turn without a client commit; the response event order
(transcript deltas == .done); a second response.create while one is active;
response.cancel and response_cancel_not_active; barge-in (cancelled /
turn_detected, epoch +1, no old-epoch delta afterwards); fences.

Assertions are about order, never wall-clock timing. The module server speaks a
long scripted reply so a response is still streaming when the test reacts to
its first delta.
"""

from __future__ import annotations

import httpx
import pytest
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    LONG_REPLY,
    assert_alive,
    expect_error,
    module_server,
    no_leaked_tasks,
    of_response,
    realtime_client,
    scripted_config,
    sentinel,
    serve,
    silence,
    stream_audio,
    tone,
    types,
    utterance,
)
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta",
          "response.output_text.delta"}


server = module_server(scripted_config(reply=LONG_REPLY))


rt = realtime_client()


def _epoch(event: dict) -> int:
    return event["metadata"]["fence"]["epoch"]


def _assert_fences_grow(events: list[dict]) -> None:
    fences = [(e["metadata"]["fence"]["incarnation"], e["metadata"]["fence"]["epoch"])
              for e in events]
    assert fences == sorted(fences)


def _no_deltas_after_done(events: list[dict], response_id: str) -> None:
    mine = of_response(events, response_id)
    done_at = events.index(next(e for e in mine if e["type"] == "response.done"))
    late = [e["type"] for e in events[done_at + 1:]
            if e.get("response_id") == response_id and e["type"] in DELTAS]
    assert late == [], f"deltas of {response_id} after its response.done: {late}"
    assert types(mine).count("response.done") == 1


# ---- 10: server VAD ----------------------------------------------------------------------


async def test_server_vad_commits_and_answers_without_a_client_commit(rt):
    assert rt.session["audio"]["input"]["turn_detection"]["create_response"] is True
    await stream_audio(rt, utterance())
    result = await rt.collect_response()
    assert result.status == "completed"
    seen = types(rt.events)
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "input_audio_buffer.committed", "response.created", "response.done"]
    assert [seen.index(t) for t in order] == sorted(seen.index(t) for t in order)
    started, stopped, committed = (next(e for e in rt.events if e["type"] == t) for t in order[:3])
    assert started["audio_start_ms"] == 0 and stopped["audio_end_ms"] == 800
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    user_item = next(e for e in rt.events if e["type"] == "conversation.item.added")
    assert user_item["item"]["id"] == committed["item_id"]
    assert result.transcript == LONG_REPLY


# ---- 12: event order -----------------------------------------------------------------------


async def test_audio_response_event_order(rt):
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.create_response()
    result = await rt.collect_response()
    mine = result.events
    seen = types(mine)
    head = ["response.created", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_audio.done", "response.output_audio_transcript.done",
            "response.content_part.done", "response.output_item.done", "response.done"]
    assert seen[:3] == head
    assert seen[-5:] == tail
    middle = seen[3:-5]
    assert set(middle) == {"response.output_audio.delta", "response.output_audio_transcript.delta"}

    deltas = "".join(e["delta"] for e in mine
                     if e["type"] == "response.output_audio_transcript.delta")
    done = next(e for e in mine if e["type"] == "response.output_audio_transcript.done")
    assert deltas == done["transcript"] == LONG_REPLY
    assert len(result.audio) == 24000 * 2 * 24 * 120 // 1000  # 24 words x 120 ms of PCM16

    item_id = mine[1]["item"]["id"]
    assert all(e["item_id"] == item_id for e in mine[2:-2])
    response = result.done["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["id"] == item_id
    assert response["output"][0]["content"][0]["transcript"] == LONG_REPLY
    # conversation.item.added for the assistant item comes between output_item.added and
    # content_part.added; nothing after response.done belongs to the response.
    added = next(e for e in rt.events if e["type"] == "conversation.item.added"
                 and e["item"]["id"] == item_id)
    assert rt.events.index(mine[1]) < rt.events.index(added) < rt.events.index(mine[2])
    await sentinel(rt, item_id)
    _no_deltas_after_done(rt.events, result.response_id)


async def test_text_only_response_event_order(rt):
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.create_response({"output_modalities": ["text"]})
    result = await rt.collect_response()
    seen = types(result.events)
    assert seen[:3] == ["response.created", "response.output_item.added",
                        "response.content_part.added"]
    assert seen[-4:] == ["response.output_text.done", "response.content_part.done",
                         "response.output_item.done", "response.done"]
    assert set(seen[3:-4]) == {"response.output_text.delta"}
    assert not any("audio" in t for t in seen)
    text = "".join(e["delta"] for e in result.events if e["type"] == "response.output_text.delta")
    assert text == result.events[-4]["text"] == LONG_REPLY
    assert result.done["response"]["output_modalities"] == ["text"]
    assert result.audio == b""


# ---- 14: one active response -----------------------------------------------------------


async def test_second_create_while_active_is_refused(rt):
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.create_response()
    await rt.wait_for("response.created")
    eid = await rt.create_response()
    await expect_error(rt, "conversation_already_has_active_response", event_id=eid, param=None)
    first = await rt.collect_response()
    assert first.status == "completed"  # the refusal did not disturb it
    await rt.create_response({"output_modalities": ["text"]})
    assert (await rt.collect_response()).status == "completed"
    assert types(rt.events).count("response.created") == 2


# ---- 15: cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize("by_id", [False, True], ids=["active", "by-id"])
async def test_cancel_mid_response(rt, by_id):
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.create_response()
    created = await rt.wait_for("response.created")
    first = await rt.wait_for("response.output_audio.delta")
    await rt.cancel_response(created["response"]["id"] if by_id else None)
    result = await rt.collect_response()
    assert result.status == "cancelled"
    assert result.done["response"]["status_details"] == {"type": "cancelled",
                                                         "reason": "client_cancelled"}
    assert _epoch(result.done) == _epoch(first) + 1
    item_id = created["response"]["output"][0]["id"] if created["response"]["output"] else \
        next(e for e in result.events if e["type"] == "response.output_item.added")["item"]["id"]
    retrieved = await sentinel(rt, item_id)
    assert retrieved["item"]["status"] == "incomplete"
    assert _epoch(retrieved) == _epoch(first) + 1
    _no_deltas_after_done(rt.events, result.response_id)
    _assert_fences_grow(rt.events)
    # Cancelled means cancelled: nothing of the old response keeps flowing, and a new one works.
    await rt.create_response({"output_modalities": ["text"]})
    assert (await rt.collect_response()).status == "completed"


async def test_cancel_with_nothing_active(rt):
    eid = await rt.cancel_response()
    await expect_error(rt, "response_cancel_not_active", event_id=eid)
    await assert_alive(rt)


async def test_cancel_of_another_response_id_is_not_active(rt):
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.create_response({"output_modalities": ["text"]})
    await rt.wait_for("response.created")
    eid = await rt.cancel_response("resp_not_this_one")
    await expect_error(rt, "response_cancel_not_active", event_id=eid)
    assert (await rt.collect_response()).status == "completed"


async def test_a_sockets_reply_audio_comes_faster_than_it_plays(rt):
    # OpenAI's socket is unpaced: the client plays and truncates what it did
    # not play; a client waiting for response.done (LiveKit's test: 15 s) is
    # not held for the reply's playing time
    assert rt.session["audio"]["output"]["pacing"]["type"] == "none"
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.create_response()
    created = await rt.wait_for("response.created")
    result = await rt.collect_response()
    took = result.done["_recv_t"] - created["_recv_t"]
    played = len(result.audio) / 48000  # PCM16 at 24 kHz
    # at response.done the client holds more than a second it has not played
    # yet (paced output: at most its 300 ms lead)
    assert result.status == "completed" and played - took > 1.0, (played, took)


async def test_commands_sent_back_to_back_take_effect_in_order(rt):
    # LiveKit's realtime test sends these four at once after connecting: a
    # cancel must find the response the create before it started, never
    # overtake the create (response_cancel_not_active) and leave the second
    # create refused (conversation_already_has_active_response).
    sent = [{"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}},
            {"type": "response.create"}, {"type": "response.cancel"},
            {"type": "response.create", "response": {"output_modalities": ["text"]}}]
    for event in sent:
        await rt.send(event)
    first = await rt.collect_response()
    second = await rt.collect_response()
    assert "error" not in types(rt.events)
    order = [t for t in types(rt.events) if t in ("session.updated", "response.created",
                                                   "response.done")]
    assert order == ["session.updated", "response.created", "response.done",
                     "response.created", "response.done"]
    assert first.status == "cancelled"
    assert first.done["response"]["status_details"]["reason"] == "client_cancelled"
    assert second.status == "completed"


# ---- 16: barge-in ----------------------------------------------------------------------------


async def test_barge_in_cancels_the_response_and_bumps_the_epoch(server, rt):
    await rt.create_response()  # server VAD stays on (interrupt_response: true)
    created = await rt.wait_for("response.created")
    first = await rt.wait_for("response.output_audio.delta")
    epoch = _epoch(first)
    await stream_audio(rt, tone(0.8))  # the user starts talking over the reply
    old = await rt.collect_response()
    assert old.response_id == created["response"]["id"]
    assert old.status == "cancelled"
    assert old.done["response"]["status_details"] == {"type": "cancelled",
                                                      "reason": "turn_detected"}
    seen = types(rt.events)
    assert seen.index("input_audio_buffer.speech_started") < seen.index("response.done")
    assert _epoch(old.done) == epoch + 1

    await stream_audio(rt, silence(1.0))  # end of the user's turn: a new answer
    new = await rt.collect_response()
    assert new.status == "completed" and new.transcript == LONG_REPLY
    done_at = rt.events.index(old.done)
    assert {_epoch(e) for e in rt.events[done_at:]} == {epoch + 1}
    _no_deltas_after_done(rt.events, old.response_id)
    _assert_fences_grow(rt.events)
    order = ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert all(done_at < rt.events.index(next(e for e in rt.events if e["type"] == t))
               < rt.events.index(new.done) for t in order)

    async with httpx.AsyncClient(base_url=server.http_url) as http:
        metrics = (await http.get("/metrics")).text
    assert any(line.startswith("duplex_interrupts_total{") and 'reason="turn_detected"' in line
               and float(line.rsplit(" ", 1)[1]) >= 1 for line in metrics.splitlines())


async def test_barge_in_with_audio_streamed_faster_than_real_time(rt):
    """The whole utterance arrives at once: VAD observations made before the epoch bump
    (speech_stopped) must survive it, so the turn is still committed and answered."""
    await rt.create_response()
    await rt.wait_for("response.output_audio.delta")
    await stream_audio(rt, utterance())
    old = await rt.collect_response()
    assert old.done["response"]["status_details"]["reason"] == "turn_detected"
    new = await rt.collect_response()
    assert new.status == "completed"
    _no_deltas_after_done(rt.events, old.response_id)


async def test_no_barge_in_when_interrupt_response_is_false(rt):
    await rt.update_session({"audio": {"input": {"turn_detection": {
        "type": "server_vad", "interrupt_response": False, "create_response": False}}}})
    await rt.create_response()
    await rt.wait_for("response.output_audio.delta")
    await stream_audio(rt, tone(0.8))
    await rt.wait_for("input_audio_buffer.speech_started")
    result = await rt.collect_response()
    assert result.status == "completed"  # the user's speech did not interrupt it
    assert result.transcript == LONG_REPLY


async def test_a_response_may_ask_for_other_modalities_than_the_session():
    """``response.create {output_modalities}`` decides what that reply speaks:
    audio for a text session, text only for an audio one."""
    async with serve() as srv, await RealtimeClient.connect(srv.ws_url) as rt:
        await rt.update_session({"output_modalities": ["text"],
                                 "audio": {"input": {"turn_detection": None}}})
        await rt.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await rt.create_response({"output_modalities": ["audio"]})
        spoken = await rt.collect_response(timeout=30)
        await rt.update_session({"output_modalities": ["audio"]})
        await rt.create_response({"output_modalities": ["text"]})
        written = await rt.collect_response(timeout=30)
    assert spoken.status == "completed" and spoken.audio and spoken.transcript
    assert written.status == "completed" and written.text and not written.audio
