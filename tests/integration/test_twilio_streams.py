"""Twilio Media Streams on the scripted pipeline, driven by a Twilio
stand-in written from Twilio's reference (``support/twilio_phone.py``): the
signed TwiML webhook, the stream's messages both ways, marks and what they
say was heard, barge-in's ``clear`` and the truncation to what the caller
heard, DTMF on the sideband, the hang-up, capacity -- and every malformed
frame's typed error, with the call (and the server) going on, and nothing
left behind (calls, sessions, tasks)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import httpx
import numpy as np
import pytest
import pytest_asyncio
import websockets
from support.audio import silence, tone
from support.realtime_fixtures import LONG_REPLY, no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.twilio_phone import CALL_SID, TwilioPhone, read_twiml, webhook
from vllm_duplex.host.twilio import Twilio

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY, AUTH_TOKEN = "sk-phone", "twilio-auth-token-for-tests"
PROFILES = {"default": {"instructions": "You answer the phone."},
            "sales": {"instructions": "You sell phones."}}
REPLY_WORDS = len(LONG_REPLY.split())
WORD_MS = 120  # the tone TTS: one 120 ms tone a word


def pcm8k(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2")


HELLO = pcm8k(tone(0.8, rate=8000) + silence(1.0, rate=8000))  # one turn for the energy VAD


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    config = scripted_config(reply=LONG_REPLY, api_keys=(KEY,), max_voice_sessions=2)
    config = dataclasses.replace(config, twilio=Twilio(auth_token=AUTH_TOKEN, profiles=PROFILES))
    async with serve(config) as srv:
        yield srv


def calls_of(server):
    return server._server.config.app.state.calls


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def nothing_left(server):
    yield
    for _ in range(300):  # a hang-up finishes on the server's loop: wait for it
        if len(calls_of(server)) == 0 and len(server.runtime.manager) == 0:
            break
        await asyncio.sleep(0.01)
    assert len(calls_of(server)) == 0, "a call outlived its test"
    assert len(server.runtime.manager) == 0, "a session outlived its call"


async def answered(server, *, latency_s: float = 0.0, **kw) -> TwilioPhone:
    """A call as Twilio places it: the signed webhook, then the stream it names."""
    r = await webhook(server.http_url, auth_token=AUTH_TOKEN, **kw)
    assert r.status_code == 200, r.text
    twiml = read_twiml(r.text)
    return TwilioPhone(twiml.stream_url, twiml.parameters, latency_s=latency_s)


async def sideband(server, phone: TwilioPhone):
    """A sideband socket on the phone's call, once its session is open (the
    stream's start opens it); it hears what happens from then on."""
    call_id = phone.parameters["call_id"]
    for _ in range(500):
        if call_id in calls_of(server)._calls:
            break
        await asyncio.sleep(0.01)
    return await websockets.connect(f"{server.ws_url}?call_id={call_id}",
                                    additional_headers={"Authorization": f"Bearer {KEY}"})


async def session_of(side) -> dict:
    """The call's session object, as the sideband sees it."""
    await side.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
    return (await next_event(side, "session.updated"))["session"]


async def next_event(side, kind: str, timeout: float = 10.0) -> dict:
    async def find():
        while True:
            event = json.loads(await side.recv())
            if event["type"] == kind:
                return event
    return await asyncio.wait_for(find(), timeout)


def errors(server) -> dict[str, float]:
    """``duplex_errors_total`` by code, from the /metrics text."""
    found = re.findall(r'^duplex_errors_total\{code="([^"]+)"\} (\S+)$',
                       server.runtime.metrics.render(), re.MULTILINE)
    return {code: float(value) for code, value in found}


# ---- the webhook -----------------------------------------------------------------


async def test_the_webhook_answers_connect_stream_with_its_parameters(server):
    r = await webhook(server.http_url, auth_token=AUTH_TOKEN, query="profile=sales")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/xml")
    twiml = read_twiml(r.text)
    assert twiml.stream_url == server.http_url.replace("http://", "ws://") + "/v1/telephony/twilio/stream"
    params = twiml.parameters
    assert params["call_id"].startswith("tw_") and params["token"]
    assert (params["profile"], params["from"], params["to"]) == ("sales", "+15550100", "+15550199")
    # no profile named: the default one
    assert read_twiml((await webhook(server.http_url, auth_token=AUTH_TOKEN)).text
                      ).parameters["profile"] == "default"


@pytest.mark.parametrize("signature", [None, "bm90IGEgc2lnbmF0dXJl"])
async def test_a_webhook_without_twilios_signature_is_403(server, signature):
    r = await webhook(server.http_url, signature=signature)
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["code"] == "invalid_signature" and error["type"] == "authentication_error"


async def test_a_signature_for_other_fields_or_an_unknown_profile_is_refused(server):
    from twilio.request_validator import RequestValidator

    url = f"{server.http_url}/v1/telephony/twilio/voice"
    forged = RequestValidator(AUTH_TOKEN).compute_signature(url, {"CallSid": "CAother"})
    r = await webhook(server.http_url, signature=forged)
    assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_signature"
    r = await webhook(server.http_url, auth_token=AUTH_TOKEN, query="profile=nope")
    assert r.status_code == 400 and r.json()["error"]["param"] == "profile"


# ---- the call ----------------------------------------------------------------------


async def test_a_spoken_turn_is_answered_with_media_and_marks(server):
    async with await answered(server) as phone:
        side = await sideband(server, phone)
        session = await session_of(side)
        await phone.say(HELLO)
        done = await next_event(side, "response.done", timeout=30)
        assert done["response"]["status"] == "completed"
        await next_event(side, "output_audio_buffer.stopped", timeout=30)  # all of it played
        await side.close()
    media = phone.events("media")
    reply_ms = sum(len(m["media"]["payload"]) * 3 // 4 for m in media) / 8
    assert reply_ms == pytest.approx(REPLY_WORDS * WORD_MS, abs=20)
    # each piece of audio is followed by a mark, and Twilio's echoes name them all, in order
    kinds = [m["event"] for _, m in phone.received]
    assert kinds[kinds.index("media"):].count("mark") == len(media)
    sent_marks = [m["mark"]["name"] for m in phone.events("mark")]
    assert phone.marks_echoed == sent_marks
    heard = phone.heard_pcm()
    assert np.abs(heard.astype(np.int32)).max() > 3000  # the tone reply, not silence
    assert session["audio"]["input"]["format"]["type"] == "audio/pcmu"
    assert session["audio"]["output"]["format"]["type"] == "audio/pcmu"
    assert session["instructions"] == "You answer the phone."


async def test_speech_over_the_reply_clears_twilio_and_keeps_what_was_heard(server):
    """The caller hears the reply 400 ms after it is sent (a carrier's latency,
    which the server cannot see): only the marks tell what was heard."""
    async with await answered(server, latency_s=0.4) as phone:
        side = await sideband(server, phone)
        await phone.say(HELLO)
        await phone.wait_for("media", timeout=30)
        await asyncio.sleep(0.9)  # let some of the reply play (0.5 s of it, at the ear)
        mark = len(phone.received)
        talk_over = asyncio.create_task(phone.say(pcm8k(tone(0.8, rate=8000) + silence(1.0, rate=8000))))
        await phone.wait_for("clear", after=mark, timeout=10)
        played_ms = sum(len(h.audio) for h in phone.heard) / 8
        done = await next_event(side, "response.done")
        item_id = done["response"]["output"][0]["id"]
        # the session cuts the item at its own estimate first; then the call
        # truncates it to what Twilio's mark echoes say was played, if less
        truncations = [await next_event(side, "conversation.item.truncated")]
        while truncations[-1]["audio_end_ms"] > played_ms:
            truncations.append(await next_event(side, "conversation.item.truncated"))
        await talk_over
        await side.close()
    assert done["response"]["status"] == "cancelled"
    assert {t["item_id"] for t in truncations} == {item_id}
    assert 300 <= played_ms < REPLY_WORDS * WORD_MS
    # what was heard, to the mark: a mark follows each piece (at most 100 ms)
    assert played_ms - 120 <= truncations[-1]["audio_end_ms"] <= played_ms
    # after the clear only the next turn's reply plays: nothing of the cut one
    cleared_at = next(t for t, m in phone.received if m["event"] == "clear")
    later = [m for t, m in phone.received if t > cleared_at and m["event"] == "media"]
    assert sum(len(m["media"]["payload"]) * 3 // 4 for m in later) / 8 <= REPLY_WORDS * WORD_MS + 20


async def test_a_reply_in_another_format_still_reaches_twilio_as_mulaw(server):
    """A sideband asks for a reply in 24 kHz PCM: Twilio still gets 8 kHz μ-law."""
    async with await answered(server) as phone:
        side = await sideband(server, phone)
        await side.send(json.dumps({"type": "response.create", "response": {
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}}}}}))
        done = await next_event(side, "response.done", timeout=30)
        await next_event(side, "output_audio_buffer.stopped", timeout=30)
        await side.close()
    assert done["response"]["status"] == "completed"
    reply_ms = sum(len(m["media"]["payload"]) * 3 // 4 for m in phone.events("media")) / 8
    assert reply_ms == pytest.approx(REPLY_WORDS * WORD_MS, abs=40)
    heard = phone.heard_pcm().astype(np.int32)
    assert np.abs(heard).max() > 3000
    # the tone TTS's 440 Hz, clean: PCM16 bytes passed on as μ-law would be noise
    power = np.abs(np.fft.rfft(heard[:8000])) ** 2  # 1 Hz a bin
    assert abs(np.argmax(power[1:]) + 1 - 440) <= 5
    assert power[430:451].sum() > 0.5 * power.sum()


async def test_the_session_closing_ends_the_stream(server):
    async with await answered(server) as phone:
        side = await sideband(server, phone)
        await side.send(json.dumps({"type": "session.close"}))
        closed = await phone.wait_closed()
        assert (closed.rcvd.code, closed.rcvd.reason) == (1000, "client")
        await side.close()


async def test_dtmf_reaches_the_sideband_in_order(server):
    async with await answered(server) as phone:
        side = await sideband(server, phone)
        for digit in "12#":
            await phone.dtmf(digit)
        got = [await next_event(side, "input_audio_buffer.dtmf_event_received") for _ in range(3)]
        await side.close()
    assert [e["event"] for e in got] == ["1", "2", "#"]
    assert all(isinstance(e["received_at"], int) and e["received_at"] > 1.7e9 for e in got)


async def test_stop_ends_the_call_and_its_session(server):
    phone = await answered(server)
    await phone.connect()
    side = await sideband(server, phone)
    session = await session_of(side)
    assert server.runtime.manager.peek(session["id"]) is not None
    await phone.stop()
    closed = await phone.wait_closed()
    assert (closed.rcvd.code, closed.rcvd.reason) == (1000, "hangup")
    with pytest.raises(websockets.ConnectionClosed):  # the sideband ends with the call
        while True:
            await asyncio.wait_for(side.recv(), 10)
    await phone.close()
    # (nothing_left checks that the session and the call are gone)


async def test_the_hangup_route_ends_a_twilio_call_for_its_owner(server):
    async with await answered(server) as phone:
        side = await sideband(server, phone)  # (waits for the call to be up)
        await side.close()
        hangup = f"/v1/realtime/calls/{phone.parameters['call_id']}/hangup"
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            r = await http.post(hangup, headers={"Authorization": "Bearer sk-wrong"})
            assert r.status_code == 401
            r = await http.post(hangup, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200
        closed = await phone.wait_closed()
        assert (closed.rcvd.code, closed.rcvd.reason) == (1000, "hangup")


async def test_the_socket_closing_without_stop_ends_the_session(server):
    phone = await answered(server)
    await phone.connect()
    await phone.say(HELLO[:1600], realtime=False)
    for _ in range(300):
        if len(calls_of(server)):
            break
        await asyncio.sleep(0.01)
    assert len(calls_of(server)) == 1
    await phone.close()


async def test_a_call_past_capacity_is_refused_busy(server):
    """Two voice sessions here (limits.max_voice_sessions): a third call is not taken."""
    async with await answered(server) as phone, await answered(server) as second:
        for _ in range(300):
            if len(server.runtime.manager) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(server.runtime.manager) == 2 and second.closed is None
        r = await webhook(server.http_url, auth_token=AUTH_TOKEN, form={"CallSid": "CAthird"})
        assert r.status_code == 200 and '<Reject reason="busy"' in r.text
        # a stream that got its TwiML before the ceiling was reached: 1013
        other = await answered_anyway(server, phone.parameters)
        closed = await other.wait_closed()
        assert (closed.rcvd.code, closed.rcvd.reason) == (1013, "at_capacity")
        await other.close()


async def answered_anyway(server, params: dict) -> TwilioPhone:
    """Our first call's own parameters, on a second stream (the same call sid)."""
    phone = TwilioPhone(server.http_url.replace("http://", "ws://") + "/v1/telephony/twilio/stream",
                        dict(params))
    await phone.connect()
    return phone


# ---- bad input ------------------------------------------------------------------------


async def test_malformed_frames_are_counted_and_dropped_and_the_calls_go_on(server):
    before = errors(server)
    async with await answered(server) as phone, await answered(server) as other:
        side = await sideband(server, phone)
        other_side = await sideband(server, other)
        talking = asyncio.create_task(other.say(HELLO))  # another call, meanwhile
        await phone.send("not json")
        await phone.send(json.dumps({"event": "hello", "streamSid": phone.stream_sid}))
        await phone.send(json.dumps({"event": "media", "streamSid": phone.stream_sid,
                                     "media": {"payload": "%% not base64 %%"}}))
        await phone.send(json.dumps({"event": "media", "media": {"payload": "A" * 80000}}))
        await phone.send_start()  # a second start
        codes = [(await next_event(side, "error"))["error"]["code"] for _ in range(5)]
        assert codes == ["invalid_json", "unknown_event", "invalid_audio", "event_too_large",
                         "invalid_event"]
        await phone.dtmf("9")  # still listening
        assert (await next_event(side, "input_audio_buffer.dtmf_event_received"))["event"] == "9"
        await talking  # and the other call is answered as ever
        done = await next_event(other_side, "response.done", timeout=30)
        assert done["response"]["status"] == "completed"
        await other.wait_for("media")
        await side.close()
        await other_side.close()
    after = errors(server)
    for code, n in (("invalid_json", 1), ("unknown_event", 1), ("invalid_audio", 1),
                    ("event_too_large", 1), ("invalid_event", 1)):
        assert after.get(code, 0) - before.get(code, 0) == n, code


async def stream_refused(server, phone: TwilioPhone, *, start: bool = True) -> tuple[int, str]:
    await phone.connect(start=start)
    closed = await phone.wait_closed()
    await phone.close()
    return closed.rcvd.code, closed.rcvd.reason


async def test_a_stream_that_breaks_the_protocol_is_closed_with_its_reason(server):
    url = server.http_url.replace("http://", "ws://") + "/v1/telephony/twilio/stream"
    params = (await answered(server)).parameters
    # media before start
    phone = TwilioPhone(url, params)
    await phone.connect(start=False)
    await phone.say(HELLO[:160], realtime=False)
    closed = await phone.wait_closed()
    await phone.close()
    assert (closed.rcvd.code, closed.rcvd.reason) == (1008, "invalid_event")
    # no token, another call's token, a forged one
    for bad in ({}, {**params, "token": "1.00"}):
        assert await stream_refused(server, TwilioPhone(url, bad)) == (1008, "unauthorized")
    assert await stream_refused(server, TwilioPhone(url, params, call_sid="CAother")) \
        == (1008, "unauthorized")
    # another audio format
    l16 = TwilioPhone(url, params, media_format={"encoding": "audio/x-l16", "sampleRate": 16000,
                                                 "channels": 1})
    assert await stream_refused(server, l16) == (1003, "unsupported_audio_format")
    # a stop before any start: a clean close, nothing opened
    phone = TwilioPhone(url, params)
    await phone.connect(start=False)
    await phone.stop()
    closed = await phone.wait_closed()
    await phone.close()
    assert closed.rcvd.code == 1000
    assert len(server.runtime.manager) == 0


async def test_the_twilio_routes_are_off_without_a_twilio_section():
    async with serve(scripted_config()) as plain:
        async with httpx.AsyncClient(base_url=plain.http_url) as http:
            r = await http.post("/v1/telephony/twilio/voice", data={"CallSid": CALL_SID})
        assert r.status_code == 404
