"""A spoken question over SIP, answered by the real default pipeline: baresip
plays Flite's question from a WAV into a call (G.711 μ-law, 8 kHz), Silero,
Whisper, vLLM (the test session's engine) and Piper answer, and Whisper
listens to what the phone recorded. The same question over the WebSocket
gives the turn gap to compare with (printed: ``pytest -s``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import shutil
import time

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


def server_side(server) -> dict[str, float]:
    """The server's own sums of its turn measures (``stage`` and critical-path
    ``segment``, seconds): their difference over a call is that call's turn."""
    metrics = server.runtime.metrics
    return {"/".join(v for _, v in key): total[0]
            for hist in (metrics.stage_latency, metrics.critical_path)
            for key, (_, total) in hist.series.items()}


def spent(before: dict[str, float], after: dict[str, float]) -> str:
    return ", ".join(f"{name}={(after[name] - before.get(name, 0.0)) * 1000:.0f}"
                     for name in sorted(after) if after[name] > before.get(name, 0.0))


def last_loud(pcm: np.ndarray, level: int = 1000) -> int:
    return int(np.nonzero(np.abs(pcm.astype(np.int32)) > level)[0][-1])


def first_loud(pcm: np.ndarray, start: int, level: int = 1000) -> int:
    return start + int(np.argmax(np.abs(pcm[start:].astype(np.int32)) > level))


async def websocket_gap(server) -> float:
    """The same question on the socket: end of the words sent -> the first
    audible reply sample, as a client playing from the first audio delta on
    would sound it (the phone's measure too). The client goes on sending
    silence, as a phone does, and reads while it speaks (an event's
    ``_recv_t`` is when it was read)."""
    pcm = speak(QUESTION, tail_s=4.0)
    async with await RealtimeClient.connect(server.ws_url) as client:
        began = time.monotonic()
        speaking = asyncio.ensure_future(say(client, pcm))
        try:
            while (done := await client.wait_for("response.done", timeout=120)
                   )["response"]["status"] != "completed":
                pass  # a reply cut off by a pause is not the answer
        finally:
            await speaking
    deltas = [e for e in client.events if e["type"] == "response.output_audio.delta"
              and e["response_id"] == done["response"]["id"]]
    reply = np.frombuffer(b"".join(base64.b64decode(e["delta"]) for e in deltas), "<i2")
    audible = first_loud(reply, 0, level=300) / 24000
    return deltas[0]["_recv_t"] + audible - (began + last_loud(pcm) / 24000)


async def test_a_spoken_question_over_sip_is_answered(server):
    agent = server._server.config.app.state.sip
    before = server_side(server)
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
        sent, heard = phone.said(), phone.heard()
    heard_words = recognize(heard, RATE)
    assert "paris" in heard_words.split(), heard_words
    # Both recordings run at real time to the hang-up: aligned by their ends.
    shift = sent.size - heard.size
    spoken_end = last_loud(sent)
    reply_start = first_loud(heard, max(0, spoken_end - shift), level=300) + shift
    sip_gap = (reply_start - spoken_end) / RATE
    after_sip = server_side(server)
    ws_gap = await websocket_gap(server)
    after_ws = server_side(server)
    print(f"\nserver-side (ms) SIP: {spent(before, after_sip)}\n"
          f"server-side (ms) WebSocket: {spent(after_sip, after_ws)}")
    print(f"\nturn gap: SIP {sip_gap * 1000:.0f} ms (at the phone's ear), "
          f"WebSocket {ws_gap * 1000:.0f} ms (heard from the first delta on)")
    assert sip_gap > 0
