"""A phone call through Twilio Media Streams to the embedded default, with
the real components (Silero, Whisper, vLLM's SmolLM2 -- one engine for the
test session --, Piper): a question spoken by Flite, as Twilio carries it
(μ-law at 8 kHz, 20 ms a message, at real time), is answered in the
stream's ``media``, and Whisper hears "Paris" in what the phone played. The
same question over the realtime WebSocket gives the turn gap to compare
(printed: run with ``-s`` to see it)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest
import pytest_asyncio
from support.speech_fixtures import RATE, recognize, say, speak
from support.twilio_phone import TwilioPhone, read_twiml, webhook
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.host.twilio import Twilio
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = "What is the capital of France?"
TAIL_S = 1.2  # speak()'s silence after the words


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, twilio=Twilio(),
                                 limits=dataclasses.replace(config.limits, resume_grace_s=0))
    async with BackgroundServer(Runtime(config, shared_stages={"vllm": vllm_stage})) as srv:
        yield srv


async def test_a_question_over_a_twilio_call_is_answered_in_words_the_caller_hears(server):
    question = speak(QUESTION, rate=8000, tail_s=TAIL_S)
    r = await webhook(server.http_url)
    twiml = read_twiml(r.text)
    async with TwilioPhone(twiml.stream_url, twiml.parameters) as phone:
        start = await phone.say(question)
        spoken_end = start + len(question) / 8000 - TAIL_S
        first = await phone.wait_for("media", timeout=120)
        first_at = next(t for t, m in phone.received if m is first)
        # the reply plays out: no new audio for a second after the last
        while not phone.heard or time.monotonic() - max(
                t for t, m in phone.received if m["event"] == "media") < 1.0:
            await asyncio.sleep(0.1)
        await phone.stop()
        await phone.wait_closed()
    heard = phone.heard_pcm(since=first_at)
    assert len(heard) / 8000 > 0.5  # a spoken answer, not a click
    words = recognize(heard, 8000)
    assert "paris" in words.split(), words
    for _ in range(300):
        if len(server.runtime.manager) == 0:
            break
        await asyncio.sleep(0.01)
    assert len(server.runtime.manager) == 0, "the call's session outlived its stop"

    # The same question over the realtime socket, for the turn gap beside it.
    async with await RealtimeClient.connect(server.ws_url) as client:
        pcm = speak(QUESTION, rate=RATE, tail_s=TAIL_S)
        collector = asyncio.create_task(client.collect_response(timeout=120))
        ws_start = await say(client, pcm)
        reply = await collector
    assert reply.status == "completed"
    ws_first = next(e["_recv_t"] for e in client.events
                    if e["type"] == "response.output_audio.delta")
    twilio_gap = (first_at - spoken_end) * 1000
    ws_gap = (ws_first - (ws_start + len(pcm) / RATE - TAIL_S)) * 1000
    print(f"\nturn gap, end of speech -> first reply audio: Twilio stream {twilio_gap:.0f} ms, "
          f"realtime WebSocket {ws_gap:.0f} ms ({server.runtime.machine_line()})")
    assert np.isfinite(twilio_gap) and twilio_gap > 0
