"""LiveKit Agents 1.8.9's GPT-Live model (``GPTLiveModel``), unmodified, completing
a delegated tool call on the real CPU pipeline (Silero -> Whisper -> vLLM
SmolLM2 -> Piper): Flite asks "What is the weather in Paris?", the engine's own
LLM -- the session's Responses backend -- calls the agent's ``@function_tool``
(``session.delegation.created``, then ``response.event``s), LiveKit runs it and
sends its result back (``response.item.create``, ``response.create``), and the
voice speaks the answer. Its one option set here is its own
``responses_options={"tool_choice": "required"}``: SmolLM2 is too small to
decide well when to call. The driver is ``drivers/livekit_live_driver.py``."""

from __future__ import annotations

import pytest
import pytest_asyncio
from support.clients import run_driver, scenario, write_wav
from support.speech_fixtures import RATE, cascade_runtime, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401  (vllm_stage: tests/conftest.py)
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def seen(vllm_stage, tmp_path_factory):
    pcm = speak("What is the weather in Paris?")
    wav = write_wav(tmp_path_factory.mktemp("livekit_tools") / "question.wav",
                    pcm.astype("<i2").tobytes(), RATE)
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        results = await run_driver("livekit_live_driver", srv.http_url, "--audio", str(wav),
                                   "--scenarios", "tool_call", "--timeout", "180", timeout=240)
    return scenario(results, "tool_call")


async def test_the_function_runs_with_what_the_user_asked(seen):
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    [call] = seen["calls"]
    assert call["name"] == "get_weather" and "paris" in call["arguments"]["city"].lower()
    assert "session.delegation.created" in seen["server_events"]
    assert seen["response_events"][:2] == ["response.created", "response.output_item.added"]
    # the run that called, then its continuation
    assert seen["response_events"].count("response.completed") == 2, (
        seen["response_events"], seen["server_events"][-12:])


async def test_the_voice_speaks_the_functions_result(seen):
    answer = seen["answer"]
    assert "18" in answer or "sunny" in answer.lower(), answer
    assert seen["answer_audio_ms"] > 500
