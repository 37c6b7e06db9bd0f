"""A raw-socket client on a speaker and a microphone (issue 44), on the real
default pipeline (Silero -> Whisper -> vLLM -> Piper): it asks a spoken
question, then keeps its microphone open while it plays the reply, which
the room (120 ms away, -10 dB, a reverberant tail, faint noise) sends back
into the microphone at real time.

Without echo cancellation the reply hears itself and stops
(``speech_started`` during it, ``response.done`` ``cancelled``); with
``audio.input.echo_cancellation: {"type": "server"}`` it plays to its end
and no turn is heard but the user's.
"""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio
import soxr
from support.room_client import talk_in_room
from support.speech_fixtures import RATE, cascade_runtime, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room, impulse_response

pytestmark = pytest.mark.asyncio(loop_scope="session")

LONG = {"instructions": "You are a helpful voice assistant. Answer in two or three sentences.",
        "max_output_tokens": 48}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


def a_room(echo: bool = True) -> Room:
    """The room; ``echo`` False: the reply plays in the user's headphones,
    none of it reaches the microphone, the room's noise does."""
    hum = soxr.resample(noise.fan(10.0, -55), noise.RATE, RATE).astype(np.float64)
    ir = impulse_response(RATE, delay_ms=120, gain_db=-10) if echo else np.zeros(1)
    return Room(ir, RATE, noise=hum)


def replies_done(events: list[dict]) -> bool:
    return any(e["type"] == "response.done" for e in events)


async def a_reply_played_in_the_room(server, session: dict) -> RealtimeClient:
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session(session)
        question = speak("Tell me about the city of Paris.", tail_s=0.5)
        await talk_in_room(client, a_room(), question, done=replies_done, max_s=150)
    return client


def during_replies(client: RealtimeClient) -> list[str]:
    """Event types from the first response.created on."""
    types = [e["type"] for e in client.events]
    return types[types.index("response.created"):] if "response.created" in types else []


async def test_with_echo_cancellation_the_reply_does_not_interrupt_itself(server):
    client = await a_reply_played_in_the_room(
        server, {**LONG, "audio": {"input": {"echo_cancellation": {"type": "server"}}}})
    updated = [e for e in client.events if e["type"] == "session.updated"][-1]
    assert updated["session"]["audio"]["input"]["echo_cancellation"] == {"type": "server"}
    done = [e["response"] for e in client.events if e["type"] == "response.done"]
    # played to its end: completed, or cut by max_output_tokens -- never cancelled
    assert [r["status"] for r in done] in (["completed"], ["incomplete"]), done
    after = during_replies(client)
    assert "input_audio_buffer.speech_started" not in after, after
    assert after.count("response.created") == 1
    finals = [e["transcript"] for e in client.events
              if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(finals) == 1 and "paris" in finals[0].lower(), finals
    audio_s = sum(len(e["delta"]) * 3 // 4 for e in client.events
                  if e["type"] == "response.output_audio.delta") / 2 / RATE
    assert audio_s > 4.0  # a reply long enough to have heard itself


async def test_without_it_the_same_room_interrupts_the_reply(server):
    """The control: the same client and room, echo cancellation off (the
    default), is what issue 44 measured -- the reply hears itself."""
    client = await a_reply_played_in_the_room(server, LONG)
    after = during_replies(client)
    assert "input_audio_buffer.speech_started" in after, after


async def test_an_invalid_echo_cancellation_is_refused_by_name(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.send({"type": "session.update", "event_id": "e1", "session": {
            "audio": {"input": {"echo_cancellation": {"type": "browser"}}}}})
        err = await client.wait_for("error", timeout=30)
    assert err["error"]["code"] == "invalid_value"
    assert err["error"]["param"] == "session.audio.input.echo_cancellation.type"
    assert err["error"]["event_id"] == "e1"


@pytest.mark.parametrize("echo", [True, False], ids=["over the echo", "headphones"])
async def test_the_user_speaking_over_the_reply_is_heard(server, echo):
    """Double talk: two seconds into the reply the user asks another
    question over it (the reply still sounding in the room, or, with
    headphones, in their ears alone): speech is heard, the client stops its
    reply, the question's words are transcribed and a reply to them starts.
    With headphones the code before 2026-12-07 never heard them: the reply
    playing and no echo at the microphone, AEC3 ducked the voice some 40 dB
    and the VAD's gate held it back as echo."""
    # Paced: the reply is under way while it plays. Unpaced, a fast machine (AVX-512)
    # sent the whole reply, and its response.done, before the user spoke 2 s into it.
    session = {**LONG, "audio": {"input": {"echo_cancellation": {"type": "server"}},
                                 "output": {"pacing": {"type": "realtime"}}}}
    over = speak("What is the capital of France?", lead_s=0.0, tail_s=0.0, voice="rms")

    def heard(events: list[dict]) -> bool:
        return sum(e["type"] == "response.created" for e in events) >= 2

    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session(session)
        question = speak("Tell me about the city of Paris.", tail_s=0.5)
        said = await talk_in_room(client, a_room(echo), question, done=heard, max_s=150,
                                  over_reply=(2.0, over), tail_s=0.0)
    assert said is not None
    done = [e["response"] for e in client.events if e["type"] == "response.done"]
    # the reply stopped: the client truncated it at speech_started (a truncate
    # of the reply under way cancels it) or the server took the turn first
    assert done[0]["status"] == "cancelled", done[0]
    assert done[0]["status_details"]["reason"] in ("client_cancelled", "turn_detected"), done[0]
    finals = [e["transcript"].lower() for e in client.events
              if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(finals) >= 2 and "capital of france" in finals[1], finals
