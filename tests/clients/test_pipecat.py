"""Pipecat 1.14 (``OpenAIRealtimeLLMService`` in a real ``Pipeline`` with the
universal context aggregators), unmodified and with its defaults, against the
scripted pipeline. Only ``base_url`` -- the server's ``ws://HOST:PORT/v1``, as
one gives any OpenAI-compatible client a base URL -- and the API key point it
here; its model is its own ``gpt-realtime-2.1``. The driver is
``drivers/pipecat_driver.py``; gaps are listed in docs/clients.md."""

from __future__ import annotations

import json
import pytest
import pytest_asyncio
from support.clients import run_driver, scenario, tools_config, write_wav
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    SCRIPTED_REPLY,
    no_leaked_tasks,
    serve,
    utterance,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPLY_MS = 1440.0  # 12 words x 120 ms of tone


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(tmp_path_factory):
    wav = write_wav(tmp_path_factory.mktemp("pipecat") / "utterance.wav", utterance())
    async with serve(tools_config()) as server:
        return await run_driver("pipecat_driver", server.http_url, "--audio", str(wav))


async def test_audio_in_reply_audio_and_text_out(results):
    seen = scenario(results, "conversation")
    assert seen["errors"] == []
    assert seen["audio_ms"] == REPLY_MS
    assert seen["text"] == SCRIPTED_REPLY
    assert seen["context"][-1] == {"role": "assistant", "content": SCRIPTED_REPLY}


async def test_the_bot_speaks_first_from_its_context(results):
    seen = scenario(results, "greeting")
    assert seen["errors"] == []
    assert (seen["responses"], seen["audio_ms"], seen["text"]) == (1, REPLY_MS, SCRIPTED_REPLY)


async def test_barge_in_stops_playback_and_keeps_the_heard_part(results):
    seen = scenario(results, "barge_in")
    assert seen["interruptions"] >= 1
    assert 0 < seen["audio_before_interruption_ms"] < REPLY_MS
    heard = seen["context"][1]
    assert heard["role"] == "assistant"
    assert SCRIPTED_REPLY.startswith(heard["content"]) and heard["content"] != SCRIPTED_REPLY


async def test_barge_in_then_the_answer(results):
    """Pipecat's truncate (its played ms, which can exceed the server's barge-in
    estimate) is checked against the audio sent: no error, which Pipecat treats as fatal."""
    seen = scenario(results, "barge_in")
    assert seen["errors"] == []
    assert seen["answered"] and seen["answer_audio_ms"] == REPLY_MS, json.dumps(seen)


async def test_function_call_round_trip(results):
    seen = scenario(results, "tool_round_trip")
    assert seen["errors"] == []
    assert seen["calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    roles = [m["role"] for m in seen["context"]]
    assert roles == ["system", "assistant", "tool", "assistant"]
    assert seen["context"][2]["content"] == '{"conditions": "sunny"}'
    assert seen["context"][3]["content"] == SCRIPTED_REPLY
