"""semantic_vad on the real default pipeline (Silero -> Whisper -> vLLM ->
Piper; one engine for the test session): Flite speaks into the socket at real
time, a reader takes the events as they come (so arrival times are true).

* a 900 ms thinking pause inside "What is the capital of ... France?" does
  not take the turn: one commit, the whole question answered;
* a complete question is committed after a short silence because the model
  finds it complete (the decision in /metrics), and its reply, started at the
  pause, is the one the client gets.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
import pytest_asyncio
from support.speech_fixtures import RATE, cascade_runtime, say, speak
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

SEMANTIC = {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}}}}
LOW = {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


def voiced(pcm: np.ndarray) -> np.ndarray:
    """``pcm`` cut to its speech."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return pcm[loud[0]:loud[-1] + 1]


def voiced_end_s(pcm: np.ndarray) -> float:
    """Where the speech in ``pcm`` ends (its last loud sample)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return float(loud[-1] + 1) / RATE


async def converse(client: RealtimeClient, pcm: np.ndarray):
    """Speak ``pcm`` while reading the reply; (start time, reply)."""
    speaking = asyncio.create_task(say(client, pcm))
    try:
        reply = await client.collect_response(timeout=120)
    finally:
        start = await speaking
    return start, reply


def timeline(client: RealtimeClient, start: float) -> str:
    """The session's events at their arrival (ms after ``start``), one per
    line, without the reply's audio and text deltas: what a failure shows."""
    lines = []
    for e in client.events:
        if e["type"].startswith("response.") and e["type"].endswith(".delta"):
            continue
        detail = e.get("transcript") or e.get("delta") or (
            (e.get("response") or {}).get("status_details") or "")
        lines.append(f"{(e['_recv_t'] - start) * 1000:7.0f} ms {e['type']} {detail}".rstrip())
    return "\n".join(lines)


def count(client: RealtimeClient, kind: str) -> int:
    return sum(e["type"] == kind for e in client.events)


async def test_a_thinking_pause_does_not_take_the_turn(server):
    # Exactly 900 ms of silence between the words (Flite pads each utterance).
    pcm = np.concatenate([np.zeros(int(0.3 * RATE), np.int16), voiced(speak("What is the capital of")),
                          np.zeros(int(0.9 * RATE), np.int16), voiced(speak("France?")),
                          np.zeros(int(1.2 * RATE), np.int16)])
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session(SEMANTIC)
        _, reply = await converse(client, pcm)
    assert count(client, "input_audio_buffer.committed") == 1
    final = next(e for e in client.events
                 if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert "capital of france" in final["transcript"].lower()
    assert reply.status == "completed" and "Paris" in reply.transcript


async def test_a_complete_question_is_answered_after_a_short_silence(server, caplog):
    """At eagerness low (400 ms for a complete turn, 3 s cap) so that a busy CI
    machine, where the partials and P(end) come late, still shows the words
    ending the turn well before silence alone would."""
    # A failure then shows each decision's inputs (P(end), silence, the words).
    caplog.set_level(logging.INFO, logger="vllm_duplex.session.turn_end")
    pcm = speak("What is the capital of France?")
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session(LOW)  # warm-up: a fresh server's first partials are slow
        await converse(client, speak("Hello there."))
    m = server.runtime.metrics
    before_dec = dict(m.turn_end_decisions.values)
    before_used = m.speculations.get(outcome="used")
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session(LOW)
        start, reply = await converse(client, pcm)
    assert reply.status == "completed" and "Paris" in reply.transcript, timeline(client, start)
    first_audio = next(e for e in reply.events if e["type"] == "response.output_audio.delta")
    gap_ms = (first_audio["_recv_t"] - (start + voiced_end_s(pcm))) * 1000
    decided = {r: m.turn_end_decisions.get(eagerness="low", reason=r)
               - before_dec.get((("eagerness", "low"), ("reason", r)), 0.0)
               for r in ("semantic", "silence")}
    used = m.speculations.get(outcome="used") - before_used
    end = start + voiced_end_s(pcm)
    stopped = next(e for e in client.events if e["type"] == "input_audio_buffer.speech_stopped")
    stopped_ms = (stopped["_recv_t"] - end) * 1000
    print(f"end of speech -> speech_stopped {stopped_ms:.0f} ms, -> first reply audio at the client "
          f"{gap_ms:.0f} ms; decisions {decided}; speculations used: {used:g}")
    assert 'duplex_turn_end_decisions_total{eagerness="low",reason="semantic"}' in m.render()
    assert decided == {"semantic": 1, "silence": 0}  # the words ended it, not the cap
    # Sooner than silence alone would have (the cap at low is 3 s); the
    # figures are bench/turn_end.py's.
    assert stopped_ms < 3000
    # The reply started at the pause is the one the client got -- when P(end)
    # came before the commit; on a loaded machine it may come with it, and the
    # reply is then asked for at the commit (test_turn_end.py pins both paths).
    assert used in (0, 1)


async def test_a_response_with_its_own_tools_replaces_the_reply_held_at_the_pause(server):
    """Issue 30's first defect, through the real runner and vLLM stage: while
    the reply started at the pause is held (invisible), the client asks for a
    response with its own tools. The held reply cannot be that response (it
    ran without them): it is discarded -- its vLLM request aborted, nothing of
    it ever reaches the client -- and the new response runs and completes,
    not queued behind a request nobody will see. Under server_vad with a 2 s
    silence the reply is held from the VAD's pause report (100 ms into the
    silence) until the turn ends, so the request lands while it is held on
    any machine."""
    m = server.runtime.metrics
    discarded = m.speculations.get(outcome="discarded")
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session({"audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duration_ms": 2000}}}})
        session = server.runtime.manager.peek(client.session_id)
        assert session is not None
        speaking = asyncio.create_task(say(client, speak("What is the capital of France?")))
        try:
            deadline = time.monotonic() + 60
            while session.core.floor.held is None:  # the reply started at the pause
                assert time.monotonic() < deadline, "no reply was started at the pause"
                await asyncio.sleep(0.005)
            held = session.core.floor.held.id
            await client.create_response({"tools": tools, "tool_choice": "none",
                                          "instructions": "Say hello."})
            reply = await client.collect_response(timeout=120)
        finally:
            await speaking
        assert reply.status == "completed" and reply.response_id != held
        assert m.speculations.get(outcome="discarded") == discarded + 1
        assert not any(e.get("response_id") == held or (e.get("response") or {}).get("id") == held
                       for e in client.events)
        assert session.core.floor.held is None
