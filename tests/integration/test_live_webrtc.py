"""GPT-Live WebRTC sessions (``POST /v1/live/sessions``, the SDK's
``client.live.create``) on the scripted pipeline: a real aiortc peer on
loopback (``support/webrtc.py``) whose offer the SDK posts; the data channel
speaks GPT-Live (every frame validated by the SDK's model of its type), the
audio is on the tracks; a sideband (``client.live.sideband.connect``)
follows; ``client.live.sessions.hangup`` ends it. Nothing is left behind."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import openai
import pytest
import pytest_asyncio
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI
from support.audio import silence, tone
from support.live_shapes import live_event
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    LONG_REPLY,
    calls_ended,
    no_leaked_tasks,
    scripted_config,
    serve,
)
from support.webrtc import RtcClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "sk-live-caller"
HELLO = tone(0.8, rate=48000) + silence(1.0, rate=48000)  # one turn for the energy VAD


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with serve(scripted_config(reply=LONG_REPLY, api_keys=(KEY,))) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def nothing_left(server):
    yield
    await calls_ended(server)


def api(server) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=KEY, base_url=server.http_url + "/v1", max_retries=0)


class LiveRtcClient(RtcClient):
    """``RtcClient`` whose offer the SDK's ``live.create`` posts; every
    data-channel frame is validated as a GPT-Live server event."""

    def __init__(self, server, **session) -> None:
        super().__init__(server.http_url, key=KEY)
        self.server = server
        self.live_session = {"model": "gpt-live-1", **session}

    async def connect(self) -> None:
        sdp = await self.offer()
        async with api(self.server) as client:
            created = await client.live.create(session=self.live_session,
                                               transport={"type": "webrtc", "sdp": sdp})
        self.call_id = created.session.id
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=created.transport.sdp,
                                                                 type="answer"))
        await asyncio.wait_for(self._opened.wait(), self.timeout)

    def _on_message(self, message: str | bytes) -> None:
        live_event(message if isinstance(message, str) else message.decode())
        super()._on_message(message)


async def side_until(side, kind: str, seen: list, timeout: float = 20.0):
    async def read():
        while True:
            event = live_event((await side.recv_bytes()).decode())
            seen.append(event)
            if event.type == kind:
                return event
    return await asyncio.wait_for(read(), timeout)


async def test_a_live_webrtc_session_talks_on_the_tracks_and_a_sideband_follows(server):
    async with LiveRtcClient(server, instructions="Be brief.") as call, api(server) as client:
        started = await call.event("session.started")
        assert call.types()[0] == "session.started"  # first, before anything else
        assert started["session"]["id"] == call.call_id and call.call_id.startswith("rtc_")
        assert started["session"]["instructions"] == "Be brief."
        seen: list = []
        async with client.live.sideband.connect(session_id=call.call_id) as side:
            await side_until(side, "session.started", seen)
            since = time.monotonic()
            call.mic.say(HELLO)
            said = await call.event("session.output_transcript.delta")
            await call.heard(since)  # the reply on the audio track
            await side_until(side, "session.usage.updated", seen)
            assert said["event_id"] in {e.event_id for e in seen
                                        if e.type == "session.output_transcript.delta"}
            replies = [e for e in seen if e.type == "session.output_audio.delta"]
            assert replies and all(e.start_ms is not None and e.end_ms > e.start_ms
                                   for e in replies)  # reflected with its timeline range
            reflected = b"".join(base64.b64decode(e.audio) for e in seen
                                 if e.type == "session.input_audio.append")
            assert len(reflected) > 24000 * 2  # over a second of the microphone, 24 kHz PCM16
            await client.live.sessions.hangup(call.call_id)
            closed = await side_until(side, "session.closed", seen)
            assert closed.reason == "close_requested"
        assert "session.output_audio.delta" not in call.types()  # audio is the track's
        assert not [t for t in call.types() if t.startswith("output_audio_buffer")]


async def test_the_data_channel_mutes_and_refuses_what_is_not_its_own(server):
    async with LiveRtcClient(server) as call:
        await call.event("session.started")
        call.send({"type": "session.input_audio.append", "audio": "AAAA", "event_id": "a"})
        err = await call.event("error")
        assert (err["error"]["code"], err["error"]["client_event_id"]) == ("invalid_event", "a")
        call.send({"type": "transport.dtmf.send", "event": "1", "event_id": "d"})
        assert (await call.event("error", where=lambda e: e["client_event_id"] == "d")
                )["error"]["code"] == "capability_unsupported"
        call.send({"type": "session.input_audio.mute", "event_id": "m"})
        assert (await call.event("session.input_audio.muted"))["client_event_id"] == "m"
        call.mic.say(HELLO)
        await asyncio.wait_for(call.mic.spoken.wait(), 10)
        await asyncio.sleep(0.5)
        call.send({"type": "session.update", "session": {}, "event_id": "sync"})
        await call.event("session.updated")
        assert "session.input_transcript.delta" not in call.types()
        assert "session.output_transcript.delta" not in call.types()


async def test_client_config_limits_what_the_frontend_sends_and_gets(server):
    policy = {"data_channel": {"allowed_client_events": ["session.close"],
                               "allowed_server_events": ["session.started", "error",
                                                         "session.closed"]}}
    async with LiveRtcClient(server, client=policy) as call:
        await call.event("session.started")
        call.send({"type": "session.input_audio.mute", "event_id": "m"})
        err = await call.event("error")
        assert (err["error"]["code"], err["error"]["param"]) == ("invalid_event", "type")
        call.mic.say(HELLO)  # heard (not muted: the mute was refused) and answered...
        await call.heard(0)
        await asyncio.sleep(0.5)
        # ... but only the allowed events reach this frontend.
        assert set(call.types()) <= {"session.started", "error"}
        call.send({"type": "session.close", "event_id": "bye"})
        await call.event("session.closed")


async def test_bad_creates_are_typed_errors(server):
    offer = await (probe := RtcClient(server.http_url)).offer()
    await probe.close()
    async with api(server) as client:
        cases = [
            (dict(session={"model": "gpt-live-1"}, transport={"type": "webrtc", "sdp": "v=0"}),
             "invalid_sdp"),
            (dict(session={"model": "gpt-live-1", "wake_policy": {"type": "speech"}},
                  transport={"type": "webrtc", "sdp": offer}), "unsupported_option"),
            (dict(session={"model": "gpt-live-1", "idle_timeout_s": 30},
                  transport={"type": "webrtc", "sdp": offer}), "unsupported_option"),
            (dict(session={"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm"}}},
                  transport={"type": "webrtc", "sdp": offer}), "invalid_value"),
            (dict(session={"model": "gpt-live-1", "client": {"data_channel": {
                "allowed_client_events": ["nope"]}}}, transport={"type": "webrtc", "sdp": offer}),
             "invalid_value"),
            (dict(session={"model": "gpt-99"}, transport={"type": "webrtc", "sdp": offer}),
             "model_not_found"),
        ]
        for params, code in cases:
            with pytest.raises(openai.APIStatusError) as refused:
                await client.live.create(**params)
            assert refused.value.status_code in (400, 404), params
            assert refused.value.body["code"] == code, (params, refused.value.body)
    async with AsyncOpenAI(api_key="sk-wrong", base_url=server.http_url + "/v1",
                           max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.live.create(session={"model": "gpt-live-1"},
                                       transport={"type": "webrtc", "sdp": offer})
    raw = json.dumps({"session": {"model": "gpt-live-1"}})  # no transport
    async with api(server) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.post("/live/sessions", body=json.loads(raw), cast_to=object)
        assert refused.value.body["param"] == "transport"
