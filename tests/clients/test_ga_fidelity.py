"""GA fidelity for what real clients send and read, against the scripted pipeline.

1. Every server event the server emits in a broad script of client events
   (turns, text and audio responses, tools, items, truncation, cancel,
   barge-in, errors, video input, resume) validates against the installed
   ``openai`` package's pydantic types (``openai.types.realtime``), as the
   OpenAI Agents SDK validates them; extension events are listed and skipped.
2. What ``response.create`` must honour (tools, tool_choice, instructions, input,
   audio.output ...), and truncation after
   a barge-in, pinned deterministically with our own client.

Gaps are ``xfail(strict=True)`` naming the gap (docs/clients.md): each flips to
a failure the moment the gap closes, so the mark must go with it.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from typing import Any

import httpx
import pytest
import pytest_asyncio
from support.clients import SDK_CLASSES, invalid_events, tools_config
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    LONG_REPLY,
    SCRIPTED_REPLY,
    no_leaked_tasks,
    serve,
    silence,
    stream_audio,
    tone,
    utterance,
)
from support.metrics import metric
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")


# Duplex extensions (docs/usage.md "Realtime protocol"): not in the SDK's union.
EXTENSIONS = frozenset({"session.closed", "session.resumed", "session.replaced",
                        "session.resync_required", "duplex.video.scene",
                        "duplex.output_audio.resumed"})
MANUAL = {"audio": {"input": {"turn_detection": None}}}
TEXT_TURN = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
# A 1x1 PNG: a frame the scripted policy (which takes no video) refuses with a typed error.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode()

# Event types the script below makes the server emit, and the GA fields each lacks.
EXPECTED = {
    "session.created", "session.updated", "error",
    "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed", "input_audio_buffer.cleared",
    "conversation.item.added", "conversation.item.done", "conversation.item.retrieved",
    "conversation.item.truncated", "conversation.item.deleted",
    "response.created", "response.done", "response.output_item.added", "response.output_item.done",
    "response.content_part.added", "response.content_part.done",
    "response.output_audio.delta", "response.output_audio.done",
    "response.output_audio_transcript.delta", "response.output_audio_transcript.done",
    "response.output_text.delta", "response.output_text.done",
    "response.function_call_arguments.delta", "response.function_call_arguments.done",
}
GAPS: dict[str, str] = {}


async def _turns(server) -> list[dict[str, Any]]:
    """One session: VAD turns, text and audio responses, items, truncate, cancel,
    barge-in, errors, video input."""
    async with await RealtimeClient.connect(server.ws_url, model="gpt-realtime") as rt:
        await rt.update_session({"instructions": "Be brief.", "audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": "high"},
            "transcription": {"model": "whisper-1"}}}})
        await stream_audio(rt, utterance())
        heard = await rt.collect_response()  # server VAD turn, spoken reply
        item_id = heard.done["response"]["output"][0]["id"]
        await rt.send({"type": "conversation.item.truncate", "item_id": item_id,
                       "content_index": 0, "audio_end_ms": 600})
        await rt.wait_for("conversation.item.truncated")
        await rt.update_session(MANUAL)
        await rt.send({"type": "conversation.item.create", "item": TEXT_TURN})
        added = await rt.wait_for("conversation.item.added")
        await rt.send({"type": "conversation.item.retrieve", "item_id": added["item"]["id"]})
        await rt.wait_for("conversation.item.retrieved")
        await rt.create_response({"output_modalities": ["text"]})
        await rt.collect_response()
        await rt.create_response()
        await rt.wait_for("response.output_audio.delta")
        await rt.cancel_response()
        await rt.collect_response()  # cancelled
        await rt.send({"type": "conversation.item.delete", "item_id": added["item"]["id"]})
        await rt.wait_for("conversation.item.deleted")
        await rt.append_audio(tone(0.2))
        await rt.clear()
        await rt.wait_for("input_audio_buffer.cleared")
        for bad in ({"type": "nope"}, {"type": "response.cancel"},
                    {"type": "conversation.item.retrieve", "item_id": "item_missing"},
                    {"type": "duplex.video.frame", "image": PNG}):
            await rt.send(bad)
            await rt.wait_for("error")
        await rt.ws.send("{not json")
        await rt.wait_for("error")
        await rt.update_session({"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
        await rt.create_response()  # the user talks over it: barge-in
        await rt.wait_for("response.output_audio.delta")
        await stream_audio(rt, utterance())
        await rt.collect_response()
        await rt.collect_response()
        return list(rt.events)


async def _tools(server) -> list[dict[str, Any]]:
    """A function-call round trip."""
    async with await RealtimeClient.connect(server.ws_url) as rt:
        await rt.update_session({**MANUAL, "tools": [{
            "type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]})
        await rt.send({"type": "conversation.item.create", "item": TEXT_TURN})
        await rt.create_response()
        called = await rt.collect_response()
        call = next(i for i in called.done["response"]["output"] if i["type"] == "function_call")
        await rt.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"], "output": '"sunny"'}})
        await rt.update_session({"tool_choice": "none"})
        await rt.create_response()
        await rt.collect_response()
        return list(rt.events)


async def _resume(server) -> list[dict[str, Any]]:
    """A dropped socket resumed: the replayed events validate like live ones."""
    rt = await RealtimeClient.connect(server.ws_url)
    await rt.update_session({**MANUAL, "output_modalities": ["text"]})
    await rt.send({"type": "conversation.item.create", "item": TEXT_TURN})
    await rt.create_response()
    await rt.collect_response()
    events = list(rt.events)
    await rt.close(end_session=False)
    back = await RealtimeClient.resume(server.ws_url, rt.session_id, rt.resume_token, 2)
    async with back:
        await back.update_session({})
    return events + back.events


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with serve(tools_config(resume_grace_s=5.0)) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def emitted(server) -> dict[str, list[dict[str, Any]]]:
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for script in (_turns, _tools, _resume):
        for event in await script(server):
            by_type[event["type"]].append(event)
    return by_type


async def test_the_script_reaches_every_event_type(emitted):
    assert EXPECTED <= set(SDK_CLASSES)
    assert set(emitted) - EXTENSIONS == EXPECTED
    assert set(emitted) & EXTENSIONS == {"session.resumed"}


@pytest.mark.parametrize("etype", sorted(EXPECTED))
async def test_every_server_event_validates_against_the_sdk_types(emitted, etype, request):
    if etype in GAPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=GAPS[etype]))
    assert invalid_events(emitted[etype]) == []



# ---- what response.create must honour, truncation of the item being generated ---------------

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest_asyncio.fixture(loop_scope="module")
async def rt(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session(MANUAL)
        await client.send({"type": "conversation.item.create", "item": TEXT_TURN})
        yield client


def output_types(result) -> list[str]:
    return [i["type"] for i in result.done["response"]["output"]]


async def test_response_metadata_and_max_output_tokens(rt):
    await rt.create_response({"metadata": {"client_event_id": "c1"}, "max_output_tokens": 3})
    result = await rt.collect_response()
    meta = result.done["response"]["metadata"]  # the client's, beside the latency figures
    assert meta["client_event_id"] == "c1" and int(meta["duplex_llm_ttft_ms"]) >= 0
    assert result.transcript == "Hello from the "
    assert result.status == "incomplete"


async def test_out_of_band_response_stays_out_of_the_conversation(rt):
    await rt.create_response({"conversation": "none", "output_modalities": ["text"]})
    result = await rt.collect_response()
    assert result.done["response"]["conversation_id"] is None
    assert not [e for e in result.events if e["type"] == "conversation.item.added"]


async def test_response_create_tools(rt):
    await rt.create_response({"tools": [WEATHER]})
    assert "function_call" in output_types(await rt.collect_response())


async def test_response_create_tool_choice_none(rt):
    await rt.update_session({"tools": [WEATHER]})
    await rt.create_response({"tool_choice": "none"})
    assert output_types(await rt.collect_response()) == ["message"]


async def test_tool_call_response_holds_only_the_call(rt):
    await rt.update_session({"tools": [WEATHER]})
    await rt.create_response()
    assert output_types(await rt.collect_response()) == ["function_call"]


async def test_response_create_audio_output_format(rt):
    await rt.create_response({"audio": {"output": {"format": {"type": "audio/pcmu"}}}})
    result = await rt.collect_response()
    assert result.done["response"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert len(result.audio) == 8000 * 1440 // 1000  # G.711: one byte a sample at 8 kHz


async def test_response_create_input_items(rt):
    """The scripted LLM calls its tool unless the context ends with a tool's output:
    given as ``input``, that output must be the context, not the conversation."""
    await rt.update_session({"tools": [WEATHER]})
    await rt.create_response({"conversation": "none", "input": [
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": '"sunny"'}]})
    assert output_types(await rt.collect_response()) == ["message"]


async def test_truncating_the_item_being_generated_stops_it(rt):
    await rt.create_response()
    first = await rt.wait_for("response.output_audio.delta")
    await rt.send({"type": "conversation.item.truncate", "item_id": first["item_id"],
                   "content_index": 0, "audio_end_ms": 40})
    result = await rt.collect_response()
    cut = next(i for i, e in enumerate(rt.events) if e["type"] == "conversation.item.truncated")
    after = [e["type"] for e in rt.events[cut:]]
    assert "response.output_audio.delta" not in after
    assert after.index("response.done") > 0 and result.status == "cancelled"
    heard = result.done["response"]["output"][0]["content"][0]["transcript"]
    assert heard != SCRIPTED_REPLY and SCRIPTED_REPLY.startswith(heard)
    done = [e for e in rt.events[cut:] if e["type"] in (
        "response.output_audio_transcript.done", "conversation.item.done")]
    assert [e.get("transcript", e.get("item", {}).get("content", [{}])[0].get("transcript"))
            for e in done] == [heard, heard]
    # the model's next context holds only the heard part
    await rt.send({"type": "conversation.item.retrieve", "item_id": first["item_id"]})
    kept = await rt.wait_for("conversation.item.retrieved")
    assert kept["item"]["content"][0]["transcript"] == heard


async def test_a_client_truncate_after_a_barge_in_is_accepted(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.create_response()
        await client.wait_for("response.output_audio.delta")
        await stream_audio(client, tone(0.8))  # barge-in
        await client.collect_response()
        cut = await client.wait_for("conversation.item.truncated")
        await client.send({"type": "conversation.item.truncate", "item_id": cut["item_id"],
                           "content_index": 0, "audio_end_ms": cut["audio_end_ms"] + 1})
        answer = await client.wait_for("conversation.item.truncated", "error")
        await stream_audio(client, silence(1.0))
        await client.collect_response()
    assert answer["type"] == "conversation.item.truncated", answer


# ---- per-stage latency (issue 14, item 7) ---------------------------------------------------

VAD_TURN_FIGURES = {"duplex_vad_onset_ms", "duplex_end_of_turn_ms", "duplex_llm_ttft_ms",
                    "duplex_tts_first_audio_ms", "duplex_turn_gap_ms"}


async def test_a_spoken_turn_s_response_done_carries_its_latency_figures(emitted, server):
    """The first response answers a server-VAD turn (the scripted pipeline has no
    ASR stage, so no asr_final); its figures are whole ms as strings, and
    /metrics counts each stage."""
    meta = emitted["response.done"][0]["response"]["metadata"]
    path = meta.pop("duplex_critical_path")  # what the turn gap waited on, segment by segment
    tokens = meta.pop("duplex_first_phrase_tokens_ms")
    figures = {k: v for k, v in meta.items() if k.startswith("duplex_")}
    assert set(figures) == VAD_TURN_FIGURES, meta
    segments = dict(part.rsplit(" ", 1) for part in path.split(", "))
    assert list(segments)[0] == "vad" and list(segments)[-1] == "pacing", path
    assert all(ms.isdigit() for ms in segments.values())
    # the path adds up to the server's turn gap (each segment rounded to whole ms)
    assert abs(sum(map(int, segments.values())) - int(figures["duplex_turn_gap_ms"])) <= len(segments)
    assert tokens.split(",")[0] == "0"
    assert all(v.isdigit() for v in figures.values())
    assert int(figures["duplex_turn_gap_ms"]) >= int(figures["duplex_end_of_turn_ms"])
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        text = (await http.get("/metrics")).text
    for stage in ("vad_onset", "end_of_turn", "llm_ttft", "tts_first_audio", "turn_gap"):
        assert metric(text, "duplex_turn_latency_seconds_count", stage=stage) >= 1
    assert metric(text, "duplex_turn_latency_seconds_count", stage="asr_final") == 0
