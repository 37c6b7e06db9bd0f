"""The embedded default over the browser transports, with the real
components (Silero, Whisper, vLLM's SmolLM2, Piper; one engine for the test
session): a question spoken into a WebRTC call (Flite, on the microphone
track at real time) is answered on the reply track, and Whisper hears
"Paris" in what the track carried; a transcription session transcribes the
same question and asks vLLM for nothing; with noise reduction on, it hears the
question through steady noise; several transcription sessions at once each
get their own words."""

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
from vllm_duplex.domain.words import spoken_words
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


async def transcribe(url: str, pcm: np.ndarray, session: dict | None = None) -> tuple[str, dict]:
    """One transcription session: ``pcm`` streamed at real time; its final
    transcript and the session as the server last described it."""
    async with await RealtimeClient.connect(f"{url}?intent=transcription") as rt:
        described = await rt.update_session(session) if session else rt.events[0]["session"]
        t0 = time.monotonic()
        for i, chunk in enumerate(chunks(pcm)):
            await rt.append_audio(chunk)
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
        final = await rt.wait_for("conversation.item.input_audio_transcription.completed",
                                  timeout=120)
    return final["transcript"], described


async def test_noise_reduction_hears_a_question_through_steady_noise(server, vllm_stage):
    voice = speak(QUESTION, rate=RATE, lead_s=1.0).astype(np.float64)
    noise = np.random.default_rng(3).normal(0, 900, voice.size)  # ~16 dB under the voice
    noisy = np.clip(voice + noise, -32768, 32767).astype(np.int16)
    before = vllm_requests(vllm_stage)
    transcript, session = await transcribe(
        server.ws_url, noisy,
        {"type": "transcription", "audio": {"input": {"noise_reduction": {"type": "far_field"}}}})
    assert session["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    assert {"capital", "france"} <= set(spoken_words(transcript)), transcript
    assert vllm_requests(vllm_stage) == before


async def test_concurrent_transcription_sessions_each_get_their_own_words(server, vllm_stage):
    # Each question's own word, and none of the others' (Whisper may write a
    # small word differently when three decodes share two cores).
    questions = {"What is the capital of France?": "france", "How many days are in a week?": "week",
                 "What is the largest ocean?": "ocean"}
    before = vllm_requests(vllm_stage)
    heard = await asyncio.gather(*(transcribe(server.ws_url, speak(q, rate=RATE)) for q in questions))
    for (transcript, _), key in zip(heard, questions.values()):
        assert {w for w in questions.values() if w in spoken_words(transcript)} == {key}, heard
    assert vllm_requests(vllm_stage) == before
