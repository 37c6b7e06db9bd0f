"""Noise never takes the turn, on the real default pipeline (Silero ->
Whisper -> vLLM -> Piper, its default semantic_vad): a room with a fan,
music, typing, a phone line's hiss and a crowd talking is streamed into the
socket at real time, then the user asks a question. The noise gives no
transcript, no committed turn and no reply; the question is heard and
answered as if the room had been quiet.

Babble is the hard one: it is speech to Silero (speech_started may come),
so only Whisper's no-speech gate stands between it and a turn nobody spoke
(stages/listening/no_speech.py; bench/no_speech.py measures every kind at
several levels on both instruction sets).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
import soxr
from support.speech_fixtures import RATE, cascade_runtime, say, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from vllm_duplex.testing import noise

pytestmark = pytest.mark.asyncio(loop_scope="session")

BABBLE = (("slt", "The weather was lovely so we went down to the river for a picnic."),
          ("awb", "I told him the meeting had moved to Thursday afternoon."),
          ("rms", "She bought apples, bread and a newspaper at the corner shop."),
          ("kal16", "Could you pass me the salt and the pepper please."),
          ("slt", "We should leave early tomorrow to avoid the traffic."),
          ("awb", "My cousin is coming to visit us next summer from Canada."))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


def room() -> np.ndarray:
    """Eleven seconds of a noisy room at the socket's rate, every kind at a
    level a microphone picks up from across a room."""
    talkers = [speak(text, rate=noise.RATE, lead_s=0, tail_s=0, voice=v) for v, text in BABBLE]
    parts = [noise.fan(2.0, -30), noise.music(2.0, -30), noise.keyboard(2.0, -25),
             noise.line_hiss(2.0, -35), noise.babble(talkers, 3.0, -30)]
    pcm16k = np.concatenate(parts)
    return soxr.resample(pcm16k, noise.RATE, RATE).astype(np.int16)


def events_of(client: RealtimeClient, kind: str) -> list[dict]:
    return [e for e in client.events if e["type"] == kind]


async def test_a_noisy_room_takes_no_turn_and_the_question_after_it_is_answered(server):
    pcm = np.concatenate([room(), speak("What is the capital of France?")])
    async with await RealtimeClient.connect(server.ws_url) as client:
        speaking = asyncio.create_task(say(client, pcm))
        try:
            reply = await client.collect_response(timeout=120)
        finally:
            await speaking
    finals = events_of(client, "conversation.item.input_audio_transcription.completed")
    assert [e["transcript"] for e in finals if e["transcript"].strip()] == [finals[-1]["transcript"]], finals
    assert "capital of france" in finals[-1]["transcript"].lower()
    assert len(events_of(client, "input_audio_buffer.committed")) == 1
    assert len(events_of(client, "response.created")) == 1
    assert reply.status == "completed" and "Paris" in reply.transcript
    # No transcription delta said words the user did not say.
    heard = " ".join(e.get("delta", "") for e in
                     events_of(client, "conversation.item.input_audio_transcription.delta")).lower()
    for hallucination in ("thank you", "you.", "bye"):
        assert hallucination not in heard, heard
