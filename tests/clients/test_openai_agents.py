"""The OpenAI Agents SDK 0.24 (``RealtimeAgent`` + ``RealtimeRunner``),
unmodified and with its defaults, against the scripted pipeline. Only the
socket ``url`` and the API key point it here; its model ``gpt-realtime-2.1``,
``semantic_vad`` and voice are its own. The SDK validates every server event
against the ``openai`` types. The driver is ``drivers/agents_driver.py``;
gaps are listed in docs/clients.md."""

from __future__ import annotations

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

REPLY_BYTES = 24000 * 2 * 1440 // 1000  # 12 words x 120 ms of tone, PCM16 24 kHz


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(tmp_path_factory):
    wav = write_wav(tmp_path_factory.mktemp("agents") / "utterance.wav", utterance())
    async with serve(tools_config()) as server:
        return await run_driver("agents_driver", server.http_url, "--audio", str(wav))


async def test_the_agent_configures_the_session(results):
    """Its instructions and voice arrive (semantic_vad no longer drops the update)."""
    seen = scenario(results, "conversation")
    assert seen["server_errors"] == [] and seen["errors"] == []
    session = seen["session"]
    assert session["instructions"] == "You are a helpful voice assistant."
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert scenario(results, "tool_round_trip")["session_tools"][0]["name"] == "get_weather"


async def test_audio_in_reply_audio_out_and_history(results):
    seen = scenario(results, "conversation")
    assert seen["audio_bytes"] == REPLY_BYTES
    assert "audio_end" in seen["kinds"]
    assert [(h["role"], h["status"]) for h in seen["history"]] == [
        ("user", "completed"), ("assistant", "completed")]
    assert seen["history"][1]["text"] == SCRIPTED_REPLY


async def test_tool_round_trip(results):
    seen = scenario(results, "tool_round_trip")
    assert seen["server_errors"] == [] and seen["errors"] == []
    assert seen["tools"] == [{"name": "get_weather", "arguments": '{"city": "Paris"}',
                              "output": "sunny in Paris"}]
    calls = [h for h in seen["history"] if h["type"] == "function_call"]
    assert [(c["name"], c["output"]) for c in calls] == [("get_weather", "sunny in Paris")]
    assert seen["history"][-1]["text"] == SCRIPTED_REPLY
    assert seen["audio_bytes"] == REPLY_BYTES


async def test_history_has_no_empty_message_before_the_call(results):
    kinds = [(h["type"], h["role"]) for h in scenario(results, "tool_round_trip")["history"]]
    assert kinds == [("message", "user"), ("function_call", None), ("message", "assistant")]


async def test_interrupt_sends_a_truncate(results):
    seen = scenario(results, "interrupt")
    assert seen["truncated"] is not None and seen["server_errors"] == []


async def test_interrupt_stops_the_reply_and_history_keeps_what_was_heard(results):
    seen = scenario(results, "interrupt")
    assert seen["truncated"] is not None and seen["audio_deltas_after_truncated"] == 0
    assert seen["done_status"] == "cancelled"
    [heard] = seen["item_done_transcripts"]
    heard = heard or ""  # interrupted in its first word: nothing was heard
    assert heard != SCRIPTED_REPLY and SCRIPTED_REPLY.startswith(heard)
    # The SDK's history keeps the transcript deltas it already had when the
    # item's done transcript is empty (its own merge rule): never the whole reply.
    kept = seen["history"][-1]["text"]
    assert kept == heard if heard else kept != SCRIPTED_REPLY
