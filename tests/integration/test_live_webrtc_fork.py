"""A stored GPT-Live session forked onto a new WebRTC connection
(``POST /v1/live/sessions/{id}/fork``, the SDK's ``client.live.sessions.fork``)
on a real server (scripted stages) with a real aiortc peer on loopback
(``support/webrtc.py``) whose offer the SDK posts.

The scripted LLM here recalls (``recall``): its reply ends with the user's
message before the last ("You said before: ..."), so a fork's spoken reply
that quotes the stored conversation shows the fork holds it."""

from __future__ import annotations

import asyncio
import io
import time
import wave

import numpy as np
import openai
import pytest
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI
from support.audio import silence, tone
from support.live_kit import live, started
from support.live_shapes import live_event
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    b64,
    calls_ended,
    chunks,
    module_server,
    no_leaked_tasks,
    recall_config,
    utterance,
)
from support.webrtc import RtcClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "sk-local"
HELLO = tone(0.8, rate=48000) + silence(1.0, rate=48000)  # one turn for the energy VAD
HISTORY = [{"role": "user", "content": [{"text": "My seat is 12A."}]},
           {"role": "user", "content": [{"text": "Is there wifi?"}]}]


server = module_server(recall_config())


@pytest.fixture(autouse=True)
async def nothing_left(server):
    yield
    await calls_ended(server)


def api(server, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=server.http_url + "/v1", max_retries=0)


async def stored_session(server) -> str:
    """A WebSocket session with a history, stored, that heard one turn."""
    async with live(server) as conn:
        events, start = await started(conn, input=HISTORY, store=True)
        for chunk in chunks(utterance() + silence(0.5)):
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.usage.updated")  # saved after the reply
        await conn.session.close()
        await events.until("session.closed")
    return start.session.id


class ForkClient(RtcClient):
    """``RtcClient`` whose offer the SDK's ``live.sessions.fork`` posts; every
    data-channel frame is validated as a GPT-Live server event."""

    def __init__(self, server, stored_id: str, **overrides) -> None:
        super().__init__(server.http_url, key=KEY)
        self.server, self.stored_id, self.overrides = server, stored_id, overrides

    async def connect(self) -> None:
        sdp = await self.offer()
        async with api(self.server) as client:
            forked = await client.live.sessions.fork(
                self.stored_id, transport={"type": "webrtc", "sdp": sdp},
                session=self.overrides)
        self.call_id = forked.session.id
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=forked.transport.sdp,
                                                                 type="answer"))
        await asyncio.wait_for(self._opened.wait(), self.timeout)

    def _on_message(self, message: str | bytes) -> None:
        live_event(message if isinstance(message, str) else message.decode())
        super()._on_message(message)


async def test_a_webrtc_fork_answers_from_the_stored_conversation(server):
    stored_id = await stored_session(server)
    async with ForkClient(server, stored_id) as call:
        begun = await call.event("session.started")
        assert begun["session"]["id"] == call.call_id != stored_id
        assert begun["session"]["model"] == "gpt-live-1" and begun["session"]["store"] is True
        since = time.monotonic()
        call.mic.say(HELLO)
        await call.heard(since)  # the fork's reply on the audio track...
        await call.event("session.usage.updated")  # ...its words whole on the data channel
        said = "".join(e["delta"] for e in call.events
                       if e["type"] == "session.output_transcript.delta")
        assert "You said before: My seat is 12A." in said, said
        call.send({"type": "session.close", "event_id": "bye"})
        await call.event("session.closed")
    # The fork was stored too (inherited), with its WebRTC call's recording.
    async with api(server) as client:
        for _ in range(100):  # its last save follows the call's end
            wav = (await client.live.sessions.download_recording(call.call_id)).read()
            with wave.open(io.BytesIO(wav)) as w:
                frames = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
            if len(frames) / 24000 > 1.5 and np.abs(frames[:, 1]).max() > 1000:
                break
            await asyncio.sleep(0.05)
    assert np.abs(frames[:, 0]).max() > 1000, "the caller's tone, left"
    assert np.abs(frames[:, 1]).max() > 1000, "the fork's voice, right"


async def test_a_fork_may_set_the_frontends_data_channel(server):
    stored_id = await stored_session(server)
    client_config = {"data_channel": {"allowed_server_events": ["session.started", "error"]}}
    async with ForkClient(server, stored_id, client=client_config, store=False) as call:
        begun = await call.event("session.started")
        assert begun["session"]["store"] is False  # the override
        call.mic.say(HELLO)
        await call.heard(0)  # answered, but the frontend gets only what it may
        await asyncio.sleep(0.3)
        assert set(call.types()) <= {"session.started", "error"}
    async with api(server) as client:
        with pytest.raises(openai.NotFoundError):  # not stored: no recording
            await client.live.sessions.download_recording(call.call_id)


async def test_bad_forks_are_typed_errors_and_leave_nothing(server):
    stored_id = await stored_session(server)
    offer = await (probe := RtcClient(server.http_url)).offer()
    await probe.close()
    webrtc = {"type": "webrtc", "sdp": offer}
    cases = [  # (session id, key, overrides, transport) -> (status, code, param)
        ((stored_id, KEY, {"audio": {"format": {"type": "audio/pcm"}}}, webrtc),
         (400, "invalid_value", "session.audio")),
        ((stored_id, KEY, {"model": "gpt-live-1"}, webrtc), (400, "invalid_value", "session.model")),
        ((stored_id, KEY, {"instructions": "x"}, webrtc),
         (400, "invalid_value", "session.instructions")),
        ((stored_id, KEY, {"store": "yes"}, webrtc), (400, "invalid_value", "session.store")),
        ((stored_id, KEY, {"client": {"data_channel": {"allowed_client_events": ["nope"]}}},
          webrtc), (400, "invalid_value", "session.client.data_channel.allowed_client_events")),
        ((stored_id, KEY, {}, {"type": "webrtc", "sdp": "v=0"}), (400, "invalid_sdp", "sdp")),
        ((stored_id, "sk-other", {}, webrtc), (404, "session_not_found", "session_id")),
        (("sess_never", KEY, {}, webrtc), (404, "session_not_found", "session_id")),
    ]
    for (session_id, key, overrides, transport), (status, code, param) in cases:
        async with api(server, key) as client:
            with pytest.raises(openai.APIStatusError) as refused:
                await client.live.sessions.fork(session_id, transport=transport,
                                                session=overrides)
        assert refused.value.status_code == status, (overrides, refused.value.body)
        assert (refused.value.body["code"], refused.value.body["param"]) == (code, param), \
            (overrides, refused.value.body)
    async with api(server) as client:  # no transport: the SDK's type requires one
        with pytest.raises(openai.BadRequestError) as refused:
            await client.post(f"/live/sessions/{stored_id}/fork", body={"session": {}},
                              cast_to=object)
        assert refused.value.body["param"] == "transport"
