"""Speech over the assistant's reply on the real default pipeline (Silero,
Whisper, vLLM, Piper), spoken by Flite at real time into the socket: a
backchannel is forgiven and the reply goes on to its end; a new question
cancels the reply and is answered. Adaptive interruptions (the default) of
paced output (asked for, as a call has it by default: the socket's default
sends a reply as fast as it is made, so a short one is done before the user
can speak over it)."""

from __future__ import annotations

import asyncio
import base64

import pytest
import pytest_asyncio
from support.speech_fixtures import cascade_runtime, say, speak
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


async def reply_playing(client: RealtimeClient, question: str) -> str:
    await client.update_session({"max_output_tokens": 96,
                                 "audio": {"output": {"pacing": {"type": "realtime"}}}})
    await say(client, speak(question, tail_s=0.8))
    created = await client.wait_for("response.created", timeout=60)
    await client.wait_for("response.output_audio.delta", timeout=60)
    await asyncio.sleep(0.6)  # the user listens for a moment
    # The reply playing now (a pause inside the question may have started and
    # replaced an earlier one under semantic_vad).
    playing = [e["response_id"] for e in client.events if e["type"] == "response.output_audio.delta"]
    return playing[-1] if playing else created["response"]["id"]


def reason(response) -> str | None:
    return (response.done["response"].get("status_details") or {}).get("reason")


async def next_answer(client: RealtimeClient, after: int, old: str):
    """The first response created after event ``after`` other than ``old``, to
    its ``response.done`` (a response from before -- one a pause in the first
    question started and cancelled -- is not it)."""
    async with asyncio.timeout(120):
        while not (created := [e["response"]["id"] for e in client.events[after:]
                               if e["type"] == "response.created" and e["response"]["id"] != old]):
            await client.recv()
    return await client.collect_response(timeout=120, response_id=created[0])


async def test_a_backchannel_is_forgiven_and_the_reply_goes_on(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        rid = await reply_playing(client, "Tell me a long story about a dragon.")
        mark = len(client.events)
        await say(client, speak("Okay.", lead_s=0.1, tail_s=1.0))
        resumed = await client.wait_for("duplex.output_audio.resumed", timeout=30)
        reply = await client.collect_response(timeout=120, response_id=rid)
    during = [e["type"] for e in client.events[mark:]]
    assert "input_audio_buffer.speech_started" in during  # the pause was announced
    assert (resumed["response_id"], resumed["reason"]) == (rid, "backchannel"), resumed
    assert reply.response_id == rid and reply.status == "completed"
    assert "input_audio_buffer.committed" not in during  # "okay" made no user turn
    assert during.count("response.created") == 0
    # the audio resumed where it was heard: the client's copy (cut back at
    # audio_start_ms, then the resent rest) is the whole reply, once
    sent_ms = sum(len(base64.b64decode(e["delta"])) for e in reply.events
                  if e["type"] == "response.output_audio.delta") / 48
    resent_ms = sent_ms - len(reply.audio) / 48
    assert 0 <= resent_ms <= 300 + 100 + 1, (sent_ms, len(reply.audio) / 48)  # at most the lead


async def test_a_new_question_cancels_the_reply_and_is_answered(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        rid = await reply_playing(client, "Tell me a long story about a dragon.")
        mark = len(client.events)
        await say(client, speak("What is the capital of France?", lead_s=0.1, tail_s=1.0))
        done = await client.wait_for("response.done", timeout=60)
        assert done["response"]["id"] == rid
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        answer = await next_answer(client, mark, rid)
        # A pause inside the question may have been taken for its end (the reply
        # then cancelled when the user went on): the answer is the one after it.
        while answer.status == "cancelled" and reason(answer) == "turn_detected":
            answer = await next_answer(client, client.events.index(answer.done), answer.response_id)
    started = next(i for i, e in enumerate(client.events[mark:], mark)
                   if e["type"] == "input_audio_buffer.speech_started")
    stopped_at = client.events.index(done)
    # nothing of the old reply after its response.done
    assert not any(e.get("response_id") == rid and e["type"].endswith(".delta")
                   for e in client.events[stopped_at + 1:])
    assert started < stopped_at
    assert answer.response_id != rid and answer.status == "completed"
    assert "Paris" in answer.transcript, answer.transcript


async def test_speech_over_a_reply_stops_its_audio_at_speech_started(server):
    """Issue 44: the old audio stops at once. What the client receives of a
    paced reply after ``speech_started``, until it is cut: nothing. (Unpaced,
    the audio TTS makes meanwhile is held: tests/unit/test_output_pacing.py;
    here an unpaced reply is often made whole before the user speaks.)"""
    pacing = "realtime"
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session({"max_output_tokens": 300,
                                     "audio": {"output": {"pacing": {"type": pacing}}}})
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text":
                "Count from one to one hundred in words, one number a line."}]}})
        await client.create_response()
        rid = (await client.wait_for("response.output_audio.delta", timeout=60))["response_id"]
        mark = len(client.events)
        await say(client, speak("Stop, wait a moment please.", lead_s=0.1, tail_s=1.0))
        async with asyncio.timeout(60):
            while not any(e["type"] == "response.done" and e["response"]["id"] == rid
                          for e in client.events):
                await client.recv()
    events = client.events
    started = next(i for i, e in enumerate(events[mark:], mark)
                   if e["type"] == "input_audio_buffer.speech_started")
    done = next(i for i, e in enumerate(events) if e["type"] == "response.done")
    # cut, not finished: still playing when the user spoke
    assert started < done and events[done]["response"]["status"] == "cancelled"
    # none of its audio reached the client after speech_started
    assert not [e for e in events[started + 1:done]
                if e["type"] == "response.output_audio.delta" and e["response_id"] == rid]
