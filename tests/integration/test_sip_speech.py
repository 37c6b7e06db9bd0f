"""A spoken question over SIP, answered by the real default pipeline: baresip
plays Flite's question from a WAV into a call (G.711 μ-law, 8 kHz), Silero,
Whisper, vLLM (the test session's engine) and Piper answer, and Whisper
listens to what the phone recorded. The same question over the WebSocket
gives the turn gap to compare with (printed: ``pytest -s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil

import numpy as np
import pytest
import pytest_asyncio
import websockets
from support.baresip import RATE, Baresip
from support.sip_fixtures import silence8k
from support.speech_fixtures import recognize, say, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.host.sip import Sip
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = [pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.skipif(shutil.which("baresip") is None, reason="needs baresip")]

QUESTION = "What is the capital of France?"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, sip=Sip(port=0, accept={}),
                                 limits=dataclasses.replace(config.limits, resume_grace_s=0))
    async with BackgroundServer(Runtime(config, shared_stages={"vllm": vllm_stage})) as srv:
        yield srv


def last_loud(pcm: np.ndarray, level: int = 1000) -> int:
    return int(np.nonzero(np.abs(pcm.astype(np.int32)) > level)[0][-1])


def first_loud(pcm: np.ndarray, start: int, level: int = 1000) -> int:
    return start + int(np.argmax(np.abs(pcm[start:].astype(np.int32)) > level))


async def websocket_gap(server) -> float:
    """The same question on the socket: end of the words sent -> first reply audio in."""
    pcm = speak(QUESTION)
    async with await RealtimeClient.connect(server.ws_url) as client:
        start = await say(client, pcm)
        await client.collect_response(timeout=120)
    spoken_end = start + last_loud(pcm) / 24000
    first = next(e for e in client.events if e["type"] == "response.output_audio.delta")
    return first["_recv_t"] - spoken_end


async def test_a_spoken_question_over_sip_is_answered(server):
    agent = server._server.config.app.state.sip
    words = speak(QUESTION, rate=RATE, lead_s=0.5, tail_s=0.5)
    async with Baresip(np.concatenate([words, silence8k(25.0)])) as phone:
        await phone.dial(f"sip:agent@127.0.0.1:{agent.port}")
        await phone.event("CALL_ESTABLISHED")
        (call_id,) = server._server.config.app.state.calls._calls
        async with websockets.connect(f"{server.ws_url}?call_id={call_id}") as side:
            while json.loads(await asyncio.wait_for(side.recv(), 120))["type"] != "response.done":
                pass  # the first reply, to its end
        await asyncio.sleep(0.5)  # the reply's last packets reach the phone
        await phone.hangup()
        await phone.event("CALL_CLOSED")
        sent, heard = phone.said(), phone.heard()
    heard_words = recognize(heard, RATE)
    assert "paris" in heard_words.split(), heard_words
    # Both recordings run at real time to the hang-up: aligned by their ends.
    shift = sent.size - heard.size
    spoken_end = last_loud(sent)
    reply_start = first_loud(heard, max(0, spoken_end - shift), level=300) + shift
    sip_gap = (reply_start - spoken_end) / RATE
    ws_gap = await websocket_gap(server)
    print(f"\nturn gap: SIP {sip_gap * 1000:.0f} ms (at the phone's ear), "
          f"WebSocket {ws_gap * 1000:.0f} ms (first audio delta in)")
    assert sip_gap > 0
