"""The engine's own backchannels on the real default pipeline (Silero ->
Whisper -> vLLM SmolLM2 -> Piper; one engine for the test session), asked
for with ``session.audio.output.backchannels`` on ``/v1/realtime``. Flite
speaks into the socket at real time; a reader takes the events as they come.

* a long statement with pauses inside it gets a "Mm-hmm." in a pause: the
  clip is Piper's, the user's turn stays one item with all its words, and
  the reply comes once, after the end;
* a long question gets none at its end (the engine answers instead), even
  with the backchannel due sooner than the turn's commit.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
import pytest_asyncio
from support.speech_fixtures import RATE, cascade_runtime, say, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

BACKCHANNEL = "duplex.output_audio.backchannel"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


def voiced(pcm: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return pcm[loud[0]:loud[-1] + 1]


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.int16)


def session(eagerness: str, **backchannels) -> dict:
    return {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": eagerness}},
                      "output": {"backchannels": backchannels}}}


async def talk(client: RealtimeClient, pcm: np.ndarray):
    speaking = asyncio.create_task(say(client, pcm))
    try:
        reply = await client.collect_response(timeout=180)
    finally:
        start = await speaking
    return start, reply


def timeline(client: RealtimeClient, start: float) -> str:
    lines = []
    for e in client.events:
        if e["type"].startswith("response.") and e["type"].endswith(".delta"):
            continue
        detail = e.get("transcript") or e.get("delta") or ""
        lines.append(f"{(e['_recv_t'] - start) * 1000:7.0f} ms {e['type']} {detail}".rstrip())
    return "\n".join(lines)


async def test_a_long_statement_gets_a_backchannel_in_a_pause_and_stays_one_turn(server):
    # Each piece ends unfinished ("... and then"): P(end) < 0.001, so the
    # turn's judge waits its cap (3 s at low) and the pauses do not end it.
    parts = [voiced(speak("So yesterday I went down to the harbour with my brother and then")),
             voiced(speak("we looked at all of the old boats because he wants to buy one and then")),
             voiced(speak("in the end he chose a small red one."))]
    # Pauses inside the turn: long enough for a loaded 2-core machine to judge
    # the words before the user goes on (the pause's ASR answer and P(end) came
    # 1-2 s late at load 16-19), short of the cap.
    gap = 2.6
    # One long thinking pause, then a short one (250 ms: under any commit at low).
    pcm = np.concatenate([silence(0.3), parts[0], silence(gap), parts[1], silence(0.25), parts[2],
                          silence(1.5)])
    # Where the long pause is in the input audio (ms).
    ends = [0.3 + len(parts[0]) / RATE]
    pauses = [(end * 1000, (end + gap) * 1000) for end in ends]
    async with await RealtimeClient.connect(server.ws_url) as client:
        # Said 2 s into a pause, or up to 2.6 s if judged late (backchannel.LATE_MS).
        await client.update_session(session("low", after_speech_ms=2000, pause_ms=2000))
        start, reply = await talk(client, pcm)
    said = [e for e in client.events if e["type"] == BACKCHANNEL]
    outcomes = {dict(k)["outcome"]: v for k, v in server.runtime.metrics.backchannels.values.items()}
    assert said, f"pauses by outcome {outcomes}\n" + timeline(client, start)
    for e in said:
        # In a pause of the speech (where the VAD heard it end), and Piper's voice.
        assert any(a - 300 <= e["audio_start_ms"] <= b for a, b in pauses), (e["audio_start_ms"],
                                                                            pauses)
        assert e["transcript"] in ("Mm-hmm.", "Right.", "I see.")
        clip = np.frombuffer(base64.b64decode(e["audio"]), "<i2")
        assert abs(len(clip) / RATE * 1000 - e["duration_ms"]) < 30 and np.abs(clip).max() > 1000
    # Said before the user went on, so never under the words.
    resumed_at = start + ends[0] + gap
    assert said[0]["_recv_t"] < resumed_at + 0.5, timeline(client, start)
    # One turn, with all its words; one reply, after its end.
    assert sum(e["type"] == "input_audio_buffer.committed" for e in client.events) == 1, \
        timeline(client, start)
    [final] = [e for e in client.events
               if e["type"] == "conversation.item.input_audio_transcription.completed"]
    words = final["transcript"].lower()
    assert "harbour" in words or "harbor" in words, words
    assert "boats" in words and "red" in words, words
    created = [e for e in client.events if e["type"] == "response.created"]
    assert len(created) == 1 and reply.status == "completed"
    assert created[0]["_recv_t"] > said[-1]["_recv_t"]
    assert created[0]["_recv_t"] > start + len(pcm) / RATE - 1.5  # after the last words
    # No item of it in the conversation: the reply's is the only assistant item.
    added = [e["item"] for e in client.events if e["type"] == "conversation.item.added"]
    assert [i["role"] for i in added] == ["user", "assistant"]


async def test_a_long_questions_end_gets_none_and_an_answer(server):
    pcm = np.concatenate([silence(0.3), voiced(speak(
        "I have been reading about the history of Europe all week and now I wonder "
        "what is the capital of France?")), silence(2.0)])
    async with await RealtimeClient.connect(server.ws_url) as client:
        # Due 200 ms into the silence: sooner than the turn's commit at low
        # (400 ms for a complete turn), so only the judgement keeps it out.
        await client.update_session(session("low", after_speech_ms=2000, pause_ms=200))
        start, reply = await talk(client, pcm)
    assert [e for e in client.events if e["type"] == BACKCHANNEL] == [], timeline(client, start)
    assert reply.status == "completed" and reply.transcript, timeline(client, start)
