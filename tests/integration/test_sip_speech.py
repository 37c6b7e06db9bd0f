"""A spoken question over SIP, answered by the real default pipeline: baresip
plays Flite's question from a WAV into a call (G.711 μ-law, 8 kHz), Silero,
Whisper, vLLM (the test session's engine) and Piper answer, and Whisper
listens to what the phone recorded. The same question over the WebSocket
gives the turn gap to compare with, both as the server measures them
(printed: ``pytest -s``; the phone's two recordings cannot be aligned
closely enough to time a gap at its ear).
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


def turn_gaps(server) -> tuple[int, float]:
    """How many turn gaps the server measured, and their sum (seconds): from
    the arrival of the audio that ended the caller's words to the first reply
    audio sent (session/latency.py) -- the same measure for a call and a socket."""
    for key, (counts, total) in server.runtime.metrics.stage_latency.series.items():
        if dict(key).get("stage") == "turn_gap":
            return counts[-1], total[0]
    return 0, 0.0


def gap_since(before: tuple[int, float], after: tuple[int, float]) -> float:
    assert after[0] > before[0], "no turn was measured"
    return (after[1] - before[1]) / (after[0] - before[0])


async def ask_on_the_socket(server) -> None:
    """The same question on the socket, the client streaming silence on as a
    phone does, to the completed answer."""
    pcm = speak(QUESTION, tail_s=4.0)
    async with await RealtimeClient.connect(server.ws_url) as client:
        speaking = asyncio.ensure_future(say(client, pcm))
        try:
            while (await client.wait_for("response.done", timeout=120)
                   )["response"]["status"] != "completed":
                pass  # a reply cut off by a pause is not the answer
        finally:
            await speaking


async def test_a_spoken_question_over_sip_is_answered(server):
    agent = server._server.config.app.state.sip
    before = turn_gaps(server)
    words = speak(QUESTION, rate=RATE, lead_s=0.5, tail_s=0.5)
    async with Baresip(np.concatenate([words, silence8k(25.0)])) as phone:
        await phone.dial(f"sip:agent@127.0.0.1:{agent.port}")
        await phone.event("CALL_ESTABLISHED")
        (call_id,) = server._server.config.app.state.calls._calls
        async with websockets.connect(f"{server.ws_url}?call_id={call_id}") as side:
            while True:  # the reply to the question, to its end (one cut off by a pause is not it)
                event = json.loads(await asyncio.wait_for(side.recv(), 120))
                if event["type"] == "response.done" and event["response"]["status"] == "completed":
                    break
        await asyncio.sleep(0.5)  # the reply's last packets reach the phone
        await phone.hangup()
        await phone.event("CALL_CLOSED")
        heard = phone.heard()
    heard_words = recognize(heard, RATE)
    assert "paris" in heard_words.split(), heard_words
    after_sip = turn_gaps(server)
    await ask_on_the_socket(server)
    print(f"\nturn gap (server-side, mean of each path's turns): SIP {gap_since(before, after_sip) * 1000:.0f} ms, "
          f"WebSocket {gap_since(after_sip, turn_gaps(server)) * 1000:.0f} ms")
