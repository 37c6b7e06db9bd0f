"""LiveKit Agents 1.8.9 (``livekit-plugins-openai`` ``RealtimeModel`` ->
``RealtimeSession``), unmodified and with its defaults, against the scripted
pipeline (tone TTS, a scripted LLM that calls a tool when it may). Only
``base_url`` and the API key point it here. The driver is
``drivers/livekit_driver.py``; gaps are listed in docs/clients.md."""

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

REPLY_MS = 1440.0  # 12 words x 120 ms of tone


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(tmp_path_factory):
    wav = write_wav(tmp_path_factory.mktemp("livekit") / "utterance.wav", utterance())
    async with serve(tools_config()) as server:
        return await run_driver("livekit_driver", server.http_url, "--audio", str(wav))


async def test_defaults_are_accepted_whole(results):
    """``semantic_vad``, voice ``marin``, model ``gpt-realtime``: one session.update, no error."""
    seen = scenario(results, "conversation")
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    session = seen["session"]
    assert session["model"] == "duplex-scripted"
    assert session["audio"]["output"]["voice"] == "marin"
    td = session["audio"]["input"]["turn_detection"]
    assert (td["type"], td["silence_duration_ms"], td["create_response"]) == ("server_vad", 500, True)
    assert session["audio"]["input"]["transcription"] is not None


async def test_audio_in_reply_audio_and_transcript_out(results):
    seen = scenario(results, "conversation")
    order = [t for t in seen["server_events"] if t in (
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed", "response.created", "response.done")]
    assert order == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "response.created", "response.done"]
    [message] = seen["reply"]["messages"]
    assert message["text"] == SCRIPTED_REPLY
    assert message["audio_ms"] == REPLY_MS
    assert seen["chat_ctx_roles"] == ["user", "assistant"]


async def test_generate_reply_resolves_with_its_generation(results):
    seen = scenario(results, "generate_reply")
    assert seen["reply"]["user_initiated"] is True  # matched through metadata.client_event_id
    assert seen["response_metadata"]["client_event_id"].startswith("response_create_")
    assert seen["reply"]["messages"][0]["text"] == SCRIPTED_REPLY


async def test_interrupt_stops_the_reply(results):
    seen = scenario(results, "interrupt")
    assert seen["done"]["status"] == "cancelled"
    assert seen["done"]["status_details"]["reason"] == "client_cancelled"
    [message] = seen["reply"]["messages"]
    assert 0 < message["audio_ms"] < REPLY_MS
    events = seen["server_events"]
    assert "response.output_audio.delta" not in events[events.index("response.done"):]


async def test_function_tool_round_trip(results):
    seen = scenario(results, "tool_round_trip")
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    assert [t["name"] for t in seen["session_tools"]] == ["get_weather"]
    [call] = seen["first"]["calls"]
    assert (call["name"], call["arguments"]) == ("get_weather", '{"city": "Paris"}')
    assert seen["second"]["calls"] == []
    assert seen["second"]["messages"][0]["text"] == SCRIPTED_REPLY


async def test_a_tool_call_response_has_no_message(results):
    assert scenario(results, "tool_round_trip")["first"]["messages"] == []


async def test_generate_reply_tool_choice_none_calls_nothing(results):
    seen = scenario(results, "tool_choice_none")
    assert seen["reply"]["calls"] == []
    assert seen["reply"]["messages"][0]["text"] == SCRIPTED_REPLY


async def test_truncate_of_a_heard_reply(results):
    seen = scenario(results, "truncate")
    truncated = seen["truncated"]
    assert truncated["item_id"] == seen["reply"]["messages"][0]["id"]
    assert (truncated["content_index"], truncated["audio_end_ms"]) == (0, 480)
    assert seen["server_errors"] == []
