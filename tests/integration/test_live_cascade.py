"""GPT-Live on the default CPU pipeline (Silero -> Whisper -> vLLM SmolLM2 ->
Piper), driven by the ``openai`` SDK's own live client, unmodified: a spoken
question answered in speech with no command asking for it (the engine's end
of turn decides), a barge-in the reply yields to, a backchannel it keeps
talking through, and mute honoured at once.

The client streams like a microphone: 20 ms chunks at real time, silence
included, for the whole session (a GPT-Live client never stops sending).
Every raw frame is validated against the SDK's model of its type."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from support.live_kit import Microphone
from support.live_shapes import live_event
from support.speech_fixtures import RATE, cascade_runtime, recognize, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")



@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv




@asynccontextmanager
async def live(server) -> AsyncIterator[Microphone]:
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1") as client:
        async with client.live.connect() as conn:
            await conn.session.start(session={"model": "gpt-live-1"})
            first = live_event((await conn.recv_bytes()).decode())
            assert first.type == "session.started", first
            async with Microphone(conn) as mic:
                yield mic


async def test_a_spoken_question_gets_a_spoken_answer(server):
    async with live(server) as mic:
        mic.say(speak("What is the capital of France?"))
        await mic.until(lambda: "Paris" in mic.text("session.output_transcript.delta"), 120)
        # the answer is spoken too: wait for all of its audio
        await mic.until(lambda: mic.quiet(1.5), 60)
    heard = mic.text("session.input_transcript.delta")
    assert "capital" in heard.lower() and "france" in heard.lower(), heard
    pcm = np.frombuffer(mic.audio(), "<i2")
    assert "paris" in recognize(pcm, RATE).split()


async def test_barge_in_stops_the_voice_the_client_plays(server):
    """A reply the user speaks over stops within the pacer's lead: the client
    plays every frame it gets, so what it gets after the barge-in is what it
    would hear over the user."""
    async with live(server) as mic:
        mic.say(speak("Tell me about the history of the city of Paris."))
        await mic.until(lambda: len(mic.audio()) > 2 * RATE, 120)  # a second of the reply sent
        onset = mic.say(speak("Stop. What is the capital of Italy?", lead_s=0.0))
        await mic.until(lambda: "Rome" in mic.text("session.output_transcript.delta", onset), 120)
        answer_at = next(t for t, e in mic.events if t >= onset
                         and e.type == "session.output_transcript.delta")
    # The reply was still playing when the user spoke (paced, not all sent at once)...
    assert mic.audio(onset - 0.5, onset), "the reply had stopped before the barge-in"
    # ...and speech onset is heard within a few VAD windows; the pacer holds at most
    # 300 ms ahead: well under a second of the old reply after the onset.
    after = len(mic.audio(onset, answer_at)) / 2 / RATE
    assert after < 1.0, f"{after:.2f} s of the interrupted reply after the barge-in"


async def test_a_backchannel_does_not_stop_the_reply(server):
    """"Okay." over the reply is heard and dismissed (adaptive interruptions):
    the voice goes on, and no second reply is made (GPT-Live has no response
    events; each reply's end is its ``session.usage.updated``)."""
    async with live(server) as mic:
        mic.say(speak("Tell me about the history of the city of Paris."))
        await mic.until(lambda: len(mic.audio()) > 2 * RATE, 120)
        onset = mic.say(speak("Okay.", lead_s=0.0, tail_s=0.5))
        await mic.until(lambda: mic.quiet(3.0), 120)
    heard = mic.text("session.input_transcript.delta", onset)
    kept = len(mic.audio(onset + 1.5)) / 2 / RATE
    timeline = "; ".join(f"{t - onset:+.2f} {e.type[8:]} {getattr(e, 'delta', '')[:20]!r}"
                         for t, e in mic.events if e.type != "session.output_audio.delta")
    assert "okay" in heard.lower(), timeline  # it was heard
    assert kept > 1.0, (f"only {kept:.2f} s of the reply after the backchannel "
                        f"(before: {len(mic.audio(0, onset)) / 2 / RATE:.2f} s)", timeline)
    # one reply, not cut and answered anew
    assert len(mic.of("session.usage.updated")) == 1, timeline


async def test_muted_speech_is_not_heard_and_unmuted_speech_is(server):
    async with live(server) as mic:
        await mic.conn.session.input_audio.mute(event_id="m1")
        await mic.until(lambda: mic.of("session.input_audio.muted"), 10)
        mic.say(speak("What is the capital of France?"))
        await asyncio.sleep(6)  # the question and more than a turn's pause
        assert not mic.of("session.input_transcript.delta")
        assert not mic.of("session.output_audio.delta")
        await mic.conn.session.input_audio.unmute(event_id="u1")
        await mic.until(lambda: mic.of("session.input_audio.unmuted"), 10)
        mic.say(speak("What is the capital of France?"))
        await mic.until(lambda: "Paris" in mic.text("session.output_transcript.delta"), 120)
