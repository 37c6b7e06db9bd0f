"""``/v1/live/sessions`` on the scripted engine, driven by the ``openai`` SDK's
own live client (``client.live.connect()``): the protocol's rules without the
models' time. Every raw frame is validated against the SDK's model of its
type (``support/live_shapes.py``). The spoken turn on the real CPU pipeline
is ``test_live_cascade.py``."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.live_kit import Reader, live, started
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    b64,
    chunks,
    module_server,
    no_leaked_tasks,
    silence,
    utterance,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

server = module_server()




async def test_session_start_answers_session_started(server):
    async with live(server) as conn:
        events, ev = await started(conn, instructions="Be brief.")
    assert ev.client_event_id == "start_1"
    assert ev.session.model == "gpt-live-1" and ev.session.status == "active"
    assert ev.session.id and ev.session.instructions == "Be brief."
    assert ev.session.audio.format.type == "audio/pcm" and ev.session.audio.format.rate == 24000


async def test_the_engine_decides_when_to_speak(server):
    """No response.create: the session's own end of turn answers."""
    async with live(server) as conn:
        events, _ = await started(conn)
        for chunk in chunks(utterance() + silence(0.5)):
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.output_transcript.delta")
        await events.until("session.output_audio.delta")
        usage = await events.until("session.usage.updated")  # after the reply
    assert usage.usage.seconds >= 0
    assert events.of("session.output_audio.delta")
    said = events.of("session.output_transcript.delta")
    assert said[0].start_ms <= said[0].end_ms


async def test_refused_and_unknown_events_are_typed_and_the_socket_stays_open(server):
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.decision.create(event_id="d1")  # no LLM stage here: refused by name
        err = await events.until("error")
        assert (err.error.code, err.error.client_event_id) == ("capability_unsupported", "d1")
        assert "decision.create" in err.error.message
        await conn.send_raw(json.dumps({"type": "response.cancel", "event_id": "x1"}))
        err = await events.until("error")
        assert (err.error.code, err.error.param) == ("unknown_event", "type")
        await conn.session.start(session={"model": "gpt-live-1"}, event_id="again")
        err = await events.until("error")
        assert (err.error.code, err.client_event_id) == ("invalid_event", "again")
        await conn.session.input_audio.mute(event_id="m1")  # still served
        assert (await events.until("session.input_audio.muted")).client_event_id == "m1"


async def test_a_bad_start_is_refused_and_the_client_may_start_again(server):
    async with live(server) as conn:
        events = Reader(conn)
        await conn.session.input_audio.append(audio=b64(silence(0.02)))
        err = await events.until("error")
        assert "session.start" in err.error.message
        await conn.session.start(session={"model": "gpt-live-1", "audio": {"format": {
            "type": "audio/pcm", "rate": 44100}}}, event_id="s")
        err = await events.until("error")
        assert (err.error.code, err.error.param) == ("unsupported_audio_format",
                                                     "session.audio.format.rate")
        await conn.session.start(session={"model": "gpt-live-1"})
        await events.until("session.started")


async def test_muted_audio_is_not_heard(server):
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.session.input_audio.mute(event_id="m1")
        for chunk in chunks(utterance() + silence(0.5)):
            await conn.session.input_audio.append(audio=b64(chunk))
        await conn.session.input_audio.unmute(event_id="u1")
        await events.until("session.input_audio.unmuted")
        await asyncio.sleep(0.5)
        await conn.session.update(session={}, event_id="sync")  # a round trip past all of it
        await events.until("session.updated")
    assert not events.of("session.output_audio.delta")
    assert not events.of("session.input_transcript.delta")


async def test_appended_instructions_and_thinking_join_the_context(server):
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.session.instructions.append(content="Answer in one sentence.",
                                               delegation_id=None, event_id="i1")
        ack = await events.until("session.instructions.appended")
        assert ack.client_event_id == "i1" and ack.start_ms == ack.end_ms
        await conn.session.thinking.append(content="The caller is Ana.", delegation_id=None,
                                           event_id="t1")
        assert (await events.until("session.thinking.appended")).client_event_id == "t1"
        await conn.session.thinking.append(content="x", delegation_id="del_9", event_id="t2")
        err = await events.until("error")
        assert (err.error.param, err.client_event_id) == ("delegation_id", "t2")


async def test_close_answers_session_closed(server):
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.session.close(event_id="bye")
        closed = await events.until("session.closed")
    assert closed.reason == "close_requested" and closed.session.id


async def test_rest_calls_on_a_session_never_stored_are_typed_404s(server):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        r = await http.post("/v1/live/sessions/sess_x/fork",
                            json={"transport": {"type": "webrtc", "sdp": "v=0"}})
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        r = await http.get("/v1/live/sessions/sess_x/content")
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
