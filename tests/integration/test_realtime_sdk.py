"""The official ``openai`` SDK's realtime client against our server on loopback.

Pinned: the SDK updates the session, appends audio, commits, creates a
response and reads typed events without a parse error; server VAD through the
SDK (speech_started -> speech_stopped -> committed -> response, no client
commit); the error event as the SDK types it.

The SDK builds events without validating them (``construct_type_unchecked``), so
"no parse error" is checked strictly here: every raw frame is validated against
the SDK class it was parsed into.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pydantic
import pytest
from openai import AsyncOpenAI
from openai.types.realtime import (
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    InputAudioBufferTimeoutTriggered,
    RealtimeErrorEvent,
    ResponseAudioDeltaEvent,
    ResponseAudioTranscriptDeltaEvent,
    ResponseAudioTranscriptDoneEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
)
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    SCRIPTED_REPLY,
    b64,
    chunks,
    module_server,
    no_leaked_tasks,
    tone,
    utterance,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Duplex extensions the SDK does not know (it falls back to some other class for them).
EXTENSIONS = {"session.closed"}


server = module_server()


@asynccontextmanager
async def sdk_connection(server) -> AsyncIterator:
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1",
                           websocket_base_url=f"ws://127.0.0.1:{server.port}/v1") as client:
        async with client.realtime.connect(model="duplex-scripted") as conn:
            yield conn


class Reader:
    """Reads typed events through the SDK, keeping the raw frames for validation."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.events: list = []
        self.raw: list[bytes] = []

    async def until(self, *types: str) -> object:
        while True:
            raw = await self.conn.recv_bytes()
            event = self.conn.parse_event(raw)
            self.raw.append(raw)
            self.events.append(event)
            assert event.type == json.loads(raw)["type"]
            if event.type in types:
                return event

    def invalid(self, skip: frozenset[str] = frozenset()) -> list[str]:
        """Events whose raw frame does not validate against their SDK class."""
        bad = []
        for raw, event in zip(self.raw, self.events):
            if event.type in EXTENSIONS or event.type in skip:
                continue
            try:
                type(event).model_validate_json(raw)
            except pydantic.ValidationError as exc:
                bad.append(f"{event.type}: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}")
        return bad

    def of(self, cls: type) -> list:
        return [e for e in self.events if isinstance(e, cls)]


async def _manual_turn(server) -> Reader:
    async with sdk_connection(server) as conn:
        events = Reader(conn)
        created = await events.until("session.created")
        assert isinstance(created, SessionCreatedEvent)
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief.",
                                           "audio": {"input": {"turn_detection": None}}})
        updated = await events.until("session.updated")
        assert isinstance(updated, SessionUpdatedEvent)
        assert updated.session.instructions == "Be brief."
        assert updated.session.audio.input.turn_detection is None

        await conn.input_audio_buffer.append(audio=b64(tone(0.5)))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        done = await events.until("response.done")
        assert isinstance(done, ResponseDoneEvent)
        return events


async def test_sdk_manual_turn_reads_typed_events(server):
    events = await _manual_turn(server)
    assert len(events.of(InputAudioBufferCommittedEvent)) == 1
    assert len(events.of(ResponseCreatedEvent)) == 1
    done = events.of(ResponseDoneEvent)
    assert len(done) == 1 and done[0].response.status == "completed"
    assert done[0].response.output[0].content[0].transcript == SCRIPTED_REPLY

    audio = b"".join(base64.b64decode(e.delta) for e in events.of(ResponseAudioDeltaEvent))
    assert len(audio) == 24000 * 2 * 1440 // 1000  # 12 words x 120 ms, PCM16 24 kHz
    transcript = "".join(e.delta for e in events.of(ResponseAudioTranscriptDeltaEvent))
    assert transcript == events.of(ResponseAudioTranscriptDoneEvent)[0].transcript == SCRIPTED_REPLY


async def test_sdk_every_event_validates_against_the_sdk_schema(server):
    events = await _manual_turn(server)
    assert events.invalid() == []


async def test_sdk_server_vad_turn_without_commit(server):
    async with sdk_connection(server) as conn:
        events = Reader(conn)
        await events.until("session.created")
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500,
                               "create_response": True, "interrupt_response": True}}}})
        await events.until("session.updated")
        for chunk in chunks(utterance()):  # 0.8 s of -10 dBFS 220 Hz, 1 s of silence
            await conn.input_audio_buffer.append(audio=b64(chunk))
        done = await events.until("response.done")

    order = [InputAudioBufferSpeechStartedEvent, InputAudioBufferSpeechStoppedEvent,
             InputAudioBufferCommittedEvent, ResponseCreatedEvent, ResponseDoneEvent]
    positions = [next(i for i, e in enumerate(events.events) if isinstance(e, cls)) for cls in order]
    assert positions == sorted(positions)
    started, stopped, committed = (events.of(cls)[0] for cls in order[:3])
    assert started.item_id == stopped.item_id == committed.item_id
    assert started.audio_start_ms == 0 and stopped.audio_end_ms == 800
    assert done.response.status == "completed"
    assert events.of(ResponseAudioDeltaEvent)


async def test_sdk_idle_timeout_prompts_a_silent_user(server):
    """server_vad's idle_timeout_ms: silence that long after the reply played
    out is committed and answered, announced by a typed timeout_triggered."""
    async with sdk_connection(server) as conn:
        events = Reader(conn)
        await events.until("session.created")
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500,
                               "idle_timeout_ms": 1000}}}})
        await events.until("session.updated")
        for chunk in chunks(utterance()):
            await conn.input_audio_buffer.append(audio=b64(chunk))
        first = await events.until("response.done")

        async def microphone() -> None:  # the user stays silent, the microphone open
            while True:
                await conn.input_audio_buffer.append(audio=b64(bytes(2 * 480)))
                await asyncio.sleep(0.02)

        mic = asyncio.create_task(microphone())
        try:
            triggered = await asyncio.wait_for(events.until("input_audio_buffer.timeout_triggered"), 10)
            committed = await events.until("input_audio_buffer.committed")
            prompt = await asyncio.wait_for(events.until("response.done"), 10)
        finally:
            mic.cancel()
    assert isinstance(triggered, InputAudioBufferTimeoutTriggered)
    assert triggered.item_id == committed.item_id
    assert triggered.audio_end_ms - triggered.audio_start_ms == 1000
    assert prompt.response.id != first.response.id and prompt.response.status == "completed"
    assert not events.of(InputAudioBufferSpeechStartedEvent)[1:]  # no speech but the question
    assert events.invalid() == []


async def test_sdk_sees_typed_error_events(server):
    async with sdk_connection(server) as conn:
        events = Reader(conn)
        await events.until("session.created")
        await conn.response.cancel(event_id="evt_cancel_1")
        error = await events.until("error")
        assert isinstance(error, RealtimeErrorEvent)
        assert error.error.code == "response_cancel_not_active"
        assert error.error.type == "invalid_request_error"
        assert error.error.event_id == "evt_cancel_1"
        await conn.session.update(session={"type": "realtime", "instructions": "still here"})
        updated = await events.until("session.updated")
        assert updated.session.instructions == "still here"
    assert events.invalid() == []
