"""Each real client, unmodified and with its defaults, against the real CPU
pipeline (configs/cascade-cpu.yaml: Silero VAD -> Whisper -> vLLM SmolLM2 ->
Piper; one vLLM engine for the test session): Flite asks "What is the capital
of France?" at real time through the client, and the client gets
the user's transcript and a spoken answer. The official ``openai`` SDK's run
also validates every event it read against the SDK's own types."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from support.clients import invalid_events, run_driver, scenario, write_wav
from support.speech_fixtures import RATE, cascade_runtime, chunks, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401  (vllm_stage: tests/conftest.py)
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = "What is the capital of France?"
HEARD = QUESTION  # Whisper, the default ASR, writes it back as asked


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


@pytest.fixture(scope="module")
def question(tmp_path_factory) -> tuple[np.ndarray, str]:
    pcm = speak(QUESTION)
    path = write_wav(tmp_path_factory.mktemp("real") / "question.wav", pcm.astype("<i2").tobytes(), RATE)
    return pcm, str(path)


async def _conversation(driver: str, server, question) -> dict:
    results = await run_driver(driver, server.http_url, "--audio", question[1], "--realtime",
                               "--scenarios", "conversation", "--timeout", "90", timeout=150)
    return scenario(results, "conversation")


async def test_livekit_on_the_real_pipeline(server, question):
    seen = await _conversation("livekit_driver", server, question)
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    assert seen["user_transcripts"] == [HEARD]
    [message] = seen["reply"]["messages"]
    assert "Paris" in message["text"] and message["audio_ms"] > 500


async def test_pipecat_on_the_real_pipeline(server, question):
    seen = await _conversation("pipecat_driver", server, question)
    assert seen["errors"] == []
    assert "Paris" in seen["text"] and seen["audio_ms"] > 500
    # the context aggregators recorded the user's transcript and the answer
    assert seen["context"][1] == {"role": "user", "content": HEARD}, seen["context"]
    assert seen["context"][2]["role"] == "assistant" and "Paris" in seen["context"][2]["content"]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def agents(server, question) -> dict:
    return await _conversation("agents_driver", server, question)


async def test_openai_agents_history_holds_the_user_s_words_on_the_real_pipeline(agents):
    """Transcription completed carries ``usage``, so the SDK keeps it (gap 1 closed)."""
    assert agents["server_errors"] == [] and agents["errors"] == []
    assert agents["audio_bytes"] > 24000
    assert [h["role"] for h in agents["history"]] == ["user", "assistant"]
    assert agents["history"][0]["text"] == HEARD


@pytest.mark.xfail(strict=False, reason="SmolLM2-135M answers the Agents SDK's instructions "
                   "('You are a helpful voice assistant.') with French repetition rather than "
                   "Paris: the model's answer, not the session core (the same question under "
                   "Pipecat's 'You are a helpful assistant.' is answered)")
async def test_openai_agents_answer_on_the_real_pipeline(agents):
    assert "Paris" in agents["history"][-1]["text"], json.dumps(
        {"history": agents["history"], "session": agents["session"]})[:4000]


async def _official_sdk_turn(server, pcm: np.ndarray) -> list[bytes]:
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1",
                           websocket_base_url=f"ws://127.0.0.1:{server.port}/v1") as client:
        async with client.realtime.connect(model="gpt-realtime") as conn:
            frames: list[bytes] = []

            async def read() -> None:
                while True:
                    frames.append(await conn.recv_bytes())
                    if json.loads(frames[-1])["type"] == "response.done":
                        return

            reader = asyncio.create_task(read())
            start = time.monotonic()
            for i, chunk in enumerate(chunks(pcm)):
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
            await asyncio.wait_for(reader, 90)
    return frames


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def official(server, question) -> list[dict]:
    return [json.loads(f) for f in await _official_sdk_turn(server, question[0])]


async def test_the_official_sdk_on_the_real_pipeline(official):
    done = next(e for e in official if e["type"] == "response.done")
    assert "Paris" in done["response"]["output"][0]["content"][0]["transcript"]
    final = [e for e in official if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert [e["transcript"] for e in final] == [HEARD]


async def test_real_pipeline_events_validate_except_transcription_completed(official):
    """Every event of the real turn validates against the SDK's types, the
    transcription events (only the real ASR makes them) included."""
    completed = "conversation.item.input_audio_transcription.completed"
    others = [e for e in official if e["type"] != completed]
    assert "conversation.item.input_audio_transcription.delta" in {e["type"] for e in others}
    assert invalid_events(others) == []


async def test_transcription_completed_validates(official):
    """GA requires ``usage``; for audio-priced transcription it is the input's duration."""
    completed = [e for e in official
                 if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert completed and invalid_events(completed) == []
    assert completed[0]["usage"]["type"] == "duration" and completed[0]["usage"]["seconds"] > 0.5
