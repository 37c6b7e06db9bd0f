"""The embedded default over the browser transports, with the real
components (Silero, Whisper, vLLM's SmolLM2, Piper; one engine for the test
session): a question spoken into a WebRTC call (Flite, on the microphone
track at real time) is answered on the reply track, and Whisper hears
"Paris" in what the track carried; a transcription session transcribes the
same question and asks vLLM for nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest
import pytest_asyncio
import soxr
from support.speech_fixtures import RATE, chunks, recognize, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from support.webrtc import RtcClient
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = "What is the capital of France?"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, resume_grace_s=0))
    async with BackgroundServer(Runtime(config, shared_stages={"vllm": vllm_stage})) as srv:
        yield srv


def vllm_requests(stage) -> int:
    """Every request the engine was ever asked for (live, done, aborted, failed)."""
    return (stage.active_requests + stage.completed_requests + stage.aborted_requests
            + stage.failed_requests)


async def test_a_spoken_question_over_webrtc_gets_a_spoken_answer(server):
    question = speak(QUESTION, rate=48000)
    async with RtcClient(server.http_url, timeout=120) as call:
        await call.event("session.created")
        start = time.monotonic()
        call.mic.say(question.astype("<i2").tobytes())
        final = await call.event("conversation.item.input_audio_transcription.completed")
        done = await call.event("response.done")
        await call.event("output_audio_buffer.stopped")
    assert final["transcript"] == QUESTION
    assert done["response"]["status"] == "completed"
    heard = np.concatenate([pcm for at, pcm in call.audio if at >= start])
    words = recognize(soxr.resample(heard, 48000, 16000).astype(np.int16), 16000)
    assert "paris" in words.split(), words


async def test_a_transcription_session_transcribes_and_asks_the_llm_nothing(server, vllm_stage):
    before = vllm_requests(vllm_stage)
    async with await RealtimeClient.connect(f"{server.ws_url}?intent=transcription") as rt:
        assert rt.events[0]["session"]["type"] == "transcription"
        t0 = time.monotonic()
        for i, chunk in enumerate(chunks(speak(QUESTION, rate=RATE))):
            await rt.append_audio(chunk)  # at real time: the partials are budgeted on it
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
        final = await rt.wait_for("conversation.item.input_audio_transcription.completed",
                                  timeout=120)
        await rt.send({"type": "input_audio_buffer.clear"})
        await rt.wait_for("input_audio_buffer.cleared")
    seen = [e["type"] for e in rt.events]
    assert final["transcript"] == QUESTION
    assert "conversation.item.input_audio_transcription.delta" in seen
    assert not [t for t in seen if t.startswith("response.")]
    assert vllm_requests(vllm_stage) == before
