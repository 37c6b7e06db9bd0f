"""WebRTC calls (``POST /v1/realtime/calls``) on the scripted pipeline, with a
real aiortc client on loopback: offer and answer, the ``oai-events`` data
channel (exactly the socket's events), audio on the tracks both ways, the
WebRTC-only ``output_audio_buffer`` events, barge-in, the client's clear,
sideband sockets, hang-up -- and every bad input's typed error, with nothing
left behind (sessions, calls, peer connections, UDP ports, tasks).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import httpx
import psutil
import pytest
import pytest_asyncio
import websockets
from support.audio import silence, tone
from support.realtime_fixtures import LONG_REPLY, no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.webrtc import CallRefused, RtcClient
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY, OTHER_KEY = "sk-call-owner", "sk-someone-else"
HELLO = tone(0.8, rate=48000) + silence(1.0, rate=48000)  # one turn for the energy VAD


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with serve(scripted_config(reply=LONG_REPLY, api_keys=(KEY, OTHER_KEY))) as srv:
        yield srv


def calls_of(server):
    return server._server.config.app.state.calls


def udp_ports() -> int:
    return sum(1 for c in psutil.Process().net_connections(kind="udp"))


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def nothing_left(server):
    """After each test: no call, no session, no UDP socket of a call."""
    before = udp_ports()
    yield
    for _ in range(200):  # a hang-up finishes on the server's loop: wait for it
        if len(calls_of(server)) == 0 and len(server.runtime.manager) == 0 and udp_ports() <= before:
            break
        await asyncio.sleep(0.01)
    assert len(calls_of(server)) == 0, "a call outlived its test"
    assert len(server.runtime.manager) == 0, "a session outlived its call"
    assert udp_ports() <= before, "a call's UDP socket stayed open"


async def post_offer(server, body, *, key=KEY, content_type="application/sdp", **kw):
    headers = {"Authorization": f"Bearer {key}", "Content-Type": content_type}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        return await http.post("/v1/realtime/calls", content=body, headers=headers, **kw)


# ---- the call ---------------------------------------------------------------------


async def test_an_offer_gets_an_answer_on_loopback_and_the_session_starts(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        created = await call.event("session.created")
        answer = call.pc.remoteDescription.sdp
        assert call.call_id.startswith("rtc_")
        assert "opus/48000" in answer.lower() and "a=sendrecv" in answer
        candidates = [line for line in answer.splitlines() if line.startswith("a=candidate")]
        assert candidates and all(" 127.0.0.1 " in c for c in candidates), candidates
        assert created["session"]["type"] == "realtime" and created["seq"] == 1
        # the server plays the call's audio: paced, where a socket's is not
        assert created["session"]["audio"]["output"]["pacing"]["type"] == "realtime"


async def test_a_spoken_turn_is_answered_on_the_audio_track(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        await call.event("session.created")
        start = time.monotonic()
        call.mic.say(HELLO)
        done = await call.event("response.done")
        assert done["response"]["status"] == "completed"
        await call.heard(start)
        stopped = await call.event("output_audio_buffer.stopped")
        started = await call.event("output_audio_buffer.started")
        seen = call.types()
        assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
        assert seen.index("response.created") < seen.index("output_audio_buffer.started") \
            < seen.index("response.done") < seen.index("output_audio_buffer.stopped")
        # The audio goes on the track, never as base64 on the data channel.
        assert "response.output_audio.delta" not in seen
        assert "response.output_audio_transcript.delta" in seen
        assert call.sound_seconds(start) > 0.5  # the reply was heard, not a click


async def test_the_data_channel_carries_exactly_the_sockets_events(server):
    """The same turn over a WebSocket and over a call: the same events, in the
    same order, but for the audio (deltas on the socket, the track's
    output_audio_buffer events on the call)."""
    async with await RealtimeClient.connect(server.ws_url, api_key=KEY) as ws:
        pcm = tone(0.8) + silence(1.0)
        for i in range(0, len(pcm), 960):
            await ws.append_audio(pcm[i:i + 960])
        await ws.collect_response(timeout=30)
        socket_types = [e["type"] for e in ws.events]
    async with RtcClient(server.http_url, key=KEY) as call:
        call.mic.say(HELLO)
        await call.event("output_audio_buffer.stopped")
        call_types = call.types()

    def core(types):
        return [t for t in types if not t.startswith("output_audio_buffer.")
                and t != "response.output_audio.delta"
                and t != "response.output_audio_transcript.delta"]  # chunking may differ
    assert core(call_types) == core(socket_types)


async def test_speech_over_the_reply_interrupts_it_and_clears_the_track(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        call.mic.say(HELLO)
        started = await call.event("output_audio_buffer.started")
        await call.heard(0)
        mark = len(call.events)
        call.mic.say(tone(0.6, rate=48000) + silence(1.0, rate=48000))
        await call.event("input_audio_buffer.speech_started", after=mark)
        cleared = await call.event("output_audio_buffer.cleared", after=mark)
        done = await call.event("response.done", after=mark)
        assert cleared["response_id"] == started["response_id"] == done["response"]["id"]
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        # the next turn is answered as usual
        await call.event("response.done", after=call.events.index(done) + 1)


async def test_the_clients_clear_cuts_the_reply_where_it_was_heard(server):
    """What @openai/agents-realtime's interrupt() sends: response.cancel, then
    output_audio_buffer.clear. The item keeps what the call played of it."""
    async with RtcClient(server.http_url, key=KEY) as call:
        call.mic.say(HELLO)
        await call.event("output_audio_buffer.started")
        first = await call.heard(0)
        while time.monotonic() - first < 0.5:  # let half a second of it play
            await call.event("response.output_audio_transcript.delta", after=len(call.events) - 1)
        mark = len(call.events)
        call.send({"type": "response.cancel"})
        call.send({"type": "output_audio_buffer.clear", "event_id": "clear_1"})
        await call.event("output_audio_buffer.cleared", after=mark)
        done = await call.event("response.done", after=mark)
        truncated = await call.event("conversation.item.truncated", after=mark)
        assert done["response"]["status"] == "cancelled"
        assert truncated["item_id"] == done["response"]["output"][0]["id"]
        assert 300 <= truncated["audio_end_ms"] <= 3000
        # nothing more of it plays: the next half second of the track (after
        # what was in flight when it was cleared) is silence
        quiet_from = await call.frames(15)
        await call.frames(25)
        assert call.loud_since(quiet_from) is None


async def test_a_clear_with_nothing_playing_does_nothing(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        await call.event("session.created")
        call.send({"type": "output_audio_buffer.clear"})
        call.send({"type": "input_audio_buffer.clear", "event_id": "after"})
        await call.event("input_audio_buffer.cleared")
        assert "output_audio_buffer.cleared" not in call.types()
        assert "error" not in call.types()


async def test_the_client_hanging_up_ends_the_session(server):
    call = RtcClient(server.http_url, key=KEY)
    await call.connect()
    await call.event("session.created")
    session_id = call.events[0]["session"]["id"]
    assert server.runtime.manager.peek(session_id) is not None
    await call.close()
    # the nothing_left fixture waits for the session, the call and its ports to go


async def test_the_hangup_route_ends_the_call_for_its_owner_only(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        await call.event("session.created")
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            r = await http.post(f"/v1/realtime/calls/{call.call_id}/hangup",
                                headers={"Authorization": f"Bearer {OTHER_KEY}"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"
            r = await http.post("/v1/realtime/calls/rtc_nope/hangup",
                                headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"
            r = await http.post(f"/v1/realtime/calls/{call.call_id}/hangup",
                                headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200
        assert server.runtime.manager.peek(call.events[0]["session"]["id"]) is None
        # (the nothing_left fixture checks the call and its ports are gone too)


# ---- sideband -------------------------------------------------------------------------


async def test_a_sideband_socket_follows_and_drives_the_call(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        await call.event("session.created")
        url = f"{server.ws_url}?call_id={call.call_id}"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as side:
            await side.send(json.dumps({"type": "session.update",
                                        "session": {"type": "realtime", "instructions": "sideband"}}))
            updated = json.loads(await asyncio.wait_for(side.recv(), 10))
            assert updated["type"] == "session.updated"
            assert updated["session"]["instructions"] == "sideband"
            on_call = await call.event("session.updated")
            assert on_call["seq"] == updated["seq"]
            await side.send(json.dumps({"type": "output_audio_buffer.clear"}))
            await side.send(json.dumps({"type": "response.cancel", "event_id": "c1"}))
            err = json.loads(await asyncio.wait_for(side.recv(), 10))
            assert err["error"]["code"] == "response_cancel_not_active"
        # the sideband going away leaves the call up
        call.send({"type": "input_audio_buffer.clear"})
        await call.event("input_audio_buffer.cleared")
        # and the call's end closes a sideband socket
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as side:
            call.send({"type": "session.close"})
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(side.recv(), 10)
            assert closed.value.rcvd.code == 1000


async def test_a_sideband_for_another_keys_or_no_call_is_refused(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        await call.event("session.created")
        for key, call_id in ((OTHER_KEY, call.call_id), (KEY, "rtc_unknown")):
            async with websockets.connect(f"{server.ws_url}?call_id={call_id}",
                                          additional_headers={"Authorization": f"Bearer {key}"}) as ws:
                err = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert err["error"]["code"] == "call_not_found"
                with pytest.raises(websockets.ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)


async def test_output_audio_buffer_clear_on_a_plain_socket_is_a_typed_error(server):
    async with await RealtimeClient.connect(server.ws_url, api_key=KEY) as ws:
        await ws.send({"type": "output_audio_buffer.clear", "event_id": "x1"})
        err = await ws.wait_for("error")
        assert err["error"]["code"] == "capability_unsupported" and err["error"]["event_id"] == "x1"


# ---- bad input ---------------------------------------------------------------------------


async def offer_of(**kw) -> str:
    client = RtcClient("http://unused", **kw)
    try:
        return await client.offer()
    finally:
        await client.close()


@pytest.mark.parametrize("body, code", [
    ("", "invalid_sdp"),
    ("hello, not sdp", "invalid_sdp"),
    ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "invalid_sdp"),
])
async def test_a_malformed_offer_is_invalid_sdp(server, body, code):
    r = await post_offer(server, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == code
    assert r.json()["error"]["param"] == "sdp"


async def test_an_offer_with_no_audio_or_without_opus_is_refused(server):
    from aiortc import RTCConfiguration, RTCPeerConnection

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    no_audio = pc.localDescription.sdp
    await pc.close()
    r = await post_offer(server, no_audio)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp"
    assert "no audio" in r.json()["error"]["message"]

    sdp = await offer_of()
    lines = [ln for ln in sdp.splitlines() if "opus" not in ln.lower()]
    r = await post_offer(server, "\r\n".join(lines) + "\r\n")
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_codec"


async def test_the_wrong_content_type_and_a_bad_key_are_typed_errors(server):
    sdp = await offer_of()
    r = await post_offer(server, sdp, content_type="text/plain")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp"
    r = await post_offer(server, sdp, key="sk-wrong")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


async def test_a_model_not_served_is_refused_as_on_the_socket(server):
    """One admission for every route (``RealtimeSessions.admit``): the same
    ``model_not_found``, naming what is served, before the offer is read."""
    r = await post_offer(server, "not an offer", params={"model": "gpt-9"})
    error = r.json()["error"]
    assert r.status_code == 404 and (error["code"], error["param"]) == ("model_not_found", "model")
    assert error["message"] == ("model 'gpt-9' is not served here; this server serves "
                                + ", ".join(map(repr, server.runtime.config.model_names)))


async def test_a_data_channel_message_that_is_not_an_event_gets_an_error_event(server):
    async with RtcClient(server.http_url, key=KEY) as call:
        await call.event("session.created")
        call.channel.send("not json")
        call.channel.send(json.dumps([1, 2]))
        call.channel.send(json.dumps({"type": "session.resume", "event_id": "r1",
                                      "session_id": "s", "resume_token": "t", "last_seq": 0}))
        call.channel.send(json.dumps({"type": "no.such.event", "event_id": "u1"}))
        await call.event("error", where=lambda e: e["error"].get("event_id") == "u1")
        codes = [e["error"]["code"] for e in call.events if e["type"] == "error"]
        assert codes == ["invalid_json", "invalid_event", "invalid_event", "unknown_event"]
        # the call goes on
        call.send({"type": "input_audio_buffer.clear"})
        await call.event("input_audio_buffer.cleared")


async def test_a_multipart_offer_carries_the_session_config(server):
    session = {"type": "realtime", "instructions": "from the call", "output_modalities": ["audio"]}
    async with RtcClient(server.http_url, key=KEY, session=session) as call:
        created = await call.event("session.created")
        assert created["session"]["instructions"] == "from the call"
    with pytest.raises(CallRefused) as refused:
        async with RtcClient(server.http_url, key=KEY, session={"type": "realtime", "voice": 7}):
            pass
    assert refused.value.status == 400 and refused.value.code == "invalid_value"


async def test_a_peer_that_never_connects_is_hung_up():
    """An answer nobody applies: the call ends at connect_timeout_s."""
    config = scripted_config()
    config = dataclasses.replace(config, webrtc=dataclasses.replace(config.webrtc,
                                                                    connect_timeout_s=0.5))
    async with serve(config) as other:
        sdp = await offer_of()
        r = await post_offer(other, sdp, key="any")
        assert r.status_code == 201
        for _ in range(500):  # the timeout, then the hang-up on the server's loop
            if len(calls_of(other)) == 0 and len(other.runtime.manager) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(calls_of(other)) == 0 and len(other.runtime.manager) == 0
