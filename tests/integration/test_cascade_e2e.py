"""The embedded default end to end, with the real components: Flite speaks a
question into the realtime socket at real time; Silero VAD, Whisper (tiny.en
partials, base finals), vLLM (SmolLM2, one engine for the test session) and
Piper answer; Whisper listens to the answer. The light pipeline
(PocketSphinx, Flite) answers the same question too.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import pytest_asyncio
from support.speech_fixtures import RATE, cascade_runtime, recognize, say, speak
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.payloads import (
    StageOutput,
    TranscriptFinal,
    TranscriptPartial,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionPatch, TurnDetection
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


def types(client: RealtimeClient) -> list[str]:
    return [e["type"] for e in client.events]


async def test_a_spoken_question_gets_a_spoken_answer(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        await say(client, speak("What is the capital of France?"))
        reply = await client.collect_response(timeout=120)
    seen = types(client)
    # Early output: partial transcripts while the user speaks.
    assert "conversation.item.input_audio_transcription.delta" in seen
    assert seen.index("conversation.item.input_audio_transcription.delta") < \
        seen.index("input_audio_buffer.speech_stopped")
    final = next(e for e in client.events
                 if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert final["transcript"] == "What is the capital of France?"
    assert reply.status == "completed" and "Paris" in reply.transcript
    heard = recognize(np.frombuffer(reply.audio, "<i2"), RATE)
    assert "paris" in heard.split(), heard


async def test_the_transcription_prompt_spells_a_name_as_the_client_wrote_it(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session({"audio": {"input": {"transcription": {"prompt": "Siobhan"}}}})
        await say(client, speak("Send a message to Siobhan saying I will be late."))
        final = await client.wait_for("conversation.item.input_audio_transcription.completed",
                                      timeout=60)
    assert "Siobhan" in final["transcript"], final["transcript"]


async def test_the_transcription_language_is_checked_against_what_the_asr_hears(server):
    """The default deployment's Whisper (tiny.en) hears English: "en" is in
    force, "fr" is refused by name and the session keeps its config."""
    async with await RealtimeClient.connect(server.ws_url) as client:
        session = await client.update_session({"audio": {"input": {"transcription": {
            "model": "gpt-4o-mini-transcribe", "language": "en"}}}})
        assert session["audio"]["input"]["transcription"]["language"] == "en"
        with pytest.raises(RealtimeError) as refused:
            await client.update_session({"audio": {"input": {"transcription": {
                "model": "gpt-4o-mini-transcribe", "language": "fr"}}}})
        error = refused.value.event["error"]
        assert (error["code"], error["param"]) == (
            "unsupported_option", "session.audio.input.transcription.language")
        await say(client, speak("What is the capital of France?"))
        final = await client.wait_for("conversation.item.input_audio_transcription.completed",
                                      timeout=60)
    assert final["transcript"] == "What is the capital of France?"


async def test_the_light_pipeline_answers_too(vllm_stage):  # noqa: F811
    """configs/cascade-cpu-light.yaml: PocketSphinx and Flite, for the smallest machines."""
    async with BackgroundServer(cascade_runtime(vllm_stage, "cascade-cpu-light")) as light:
        async with await RealtimeClient.connect(light.ws_url) as client:
            await say(client, speak("What is the capital of France?"))
            reply = await client.collect_response(timeout=120)
    final = next(e for e in client.events
                 if e["type"] == "conversation.item.input_audio_transcription.completed")
    assert final["transcript"] == "what is the capital of france"
    assert reply.status == "completed" and "Paris" in reply.transcript
    assert "paris" in recognize(np.frombuffer(reply.audio, "<i2"), RATE).split()


async def test_first_audio_comes_before_the_reply_text_is_complete(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session({"max_output_tokens": 64})
        await say(client, speak("Tell me about the city of Paris."))
        reply = await client.collect_response(timeout=120)
    seen = [e["type"] for e in reply.events]
    first_audio = seen.index("response.output_audio.delta")
    last_text = len(seen) - 1 - seen[::-1].index("response.output_audio_transcript.delta")
    assert first_audio < last_text, "audio waited for the whole reply"


async def test_barge_in_stops_the_reply_and_keeps_only_heard_words(server):
    async with await RealtimeClient.connect(server.ws_url) as client:
        # Paced output (a call's default; the socket's is unpaced, as OpenAI's):
        # the server knows what was heard, and the reply is still playing when
        # the user speaks over it.
        await client.update_session({"max_output_tokens": 96,
                                     "audio": {"output": {"pacing": {"type": "realtime"}}}})
        await say(client, speak("Tell me a long story about a dragon.", tail_s=0.8))
        await client.wait_for("response.created", timeout=60)
        delta = await client.wait_for("response.output_audio.delta", timeout=60)
        response_id = delta["response_id"]  # the reply playing (semantic_vad may have replaced one)
        before = client.events[-1]["metadata"]["fence"]["epoch"]
        mark = len(client.events)
        await say(client, speak("Stop, please.", lead_s=0.1, tail_s=1.0))
        done = await client.wait_for("response.done", timeout=60)
        assert done["response"]["id"] == response_id
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        truncated = await client.wait_for("conversation.item.truncated", timeout=10)
        # Read on until the user's interruption itself is answered or fails
        # (its end of speech may already be in: adaptive interruptions cancel
        # when the final transcript says they were words, after it).
        if not any(e["type"] == "input_audio_buffer.speech_stopped"
                   for e in client.events[mark:]):
            await client.wait_for("input_audio_buffer.speech_stopped", timeout=60)
        after = [e for e in client.events[client.events.index(done) + 1:]]
        assert not any(e.get("response_id") == response_id and e["type"].endswith(".delta")
                       for e in after), "audio of the cancelled reply after response.done"
        assert done["metadata"]["fence"]["epoch"] == before + 1
        item_id = truncated["item_id"]
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.wait_for("conversation.item.retrieved", timeout=10))["item"]
    generated = "".join(e["delta"] for e in client.events
                        if e["type"] == "response.output_audio_transcript.delta"
                        and e["response_id"] == response_id)
    heard = item["content"][0]["transcript"]
    assert len(heard.split()) < len(generated.split()), (heard, generated)
    assert generated.startswith(heard)


async def test_an_asr_revision_rolls_back_and_the_answer_is_still_right(vllm_stage):  # noqa: F811
    """Drive the session with the ASR's partials directly: 'capitol' and then
    'was' revise words already pushed into the live vLLM request."""
    runtime = cascade_runtime(vllm_stage)
    await runtime.start()
    session = await runtime.sessions.open(None)
    try:
        # Server VAD: the scripted VadSpeechStopped below is the end of the turn
        # (under the default semantic_vad it would be a pause to judge).
        session.deliver(cmd.SessionUpdate(patch=SessionPatch(turn_detection=TurnDetection())))
        session.deliver(cmd.AudioAppend(audio=bytes(9600)))  # 200 ms of silence to commit
        fence = session.fence
        rid = fence.request_id("in")
        for payload in (VadSpeechStarted(0), TranscriptPartial("what is the"),
                        TranscriptPartial("what is the capitol"),
                        TranscriptPartial("what is the capitol of")):
            await session._enqueue_output(StageOutput(fence, rid, "asr", payload))
        while vllm_stage.active_requests == 0:  # the stable words reached the LLM
            await asyncio.sleep(0.01)
        for payload in (TranscriptPartial("what was the capital of"),
                        TranscriptPartial("what was the capital of france"),
                        VadSpeechStopped(1500), TranscriptFinal("what is the capital of france")):
            await session._enqueue_output(StageOutput(fence, rid, "asr", payload))
        text = ""
        async with asyncio.timeout(120):
            while True:
                env = await session.attachment.get()
                if env.event.type == "response.output_audio_transcript.delta":
                    text += env.event.delta
                if env.event.type == "response.done":
                    break
        assert session.fence.incarnation >= 1
        assert runtime.metrics.incarnation_bumps.get() >= 1
        assert "Paris" in text
    finally:
        await runtime.sessions.end(session, CloseReason.CLIENT)
        await runtime.stop()


async def test_session_tools_become_function_calls_and_the_result_is_used(server):
    """Session tools with the real model: tool_choice "required" makes vLLM's
    structured outputs write a schema-valid call; the client's function_call_output
    then feeds the next response."""
    weather = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}
    async with await RealtimeClient.connect(server.ws_url) as client:
        await client.update_session({"output_modalities": ["text"], "tools": [weather],
                                     "tool_choice": "required",
                                     "audio": {"input": {"turn_detection": None}}})
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}})
        await client.create_response()
        call = await client.wait_for("response.function_call_arguments.done", timeout=120)
        first = await client.wait_for("response.done", timeout=60)
        assert first["response"]["status"] == "completed"
        assert call["name"] == "get_weather"
        arguments = json.loads(call["arguments"])
        assert isinstance(arguments.get("city"), str) and arguments["city"]
        await client.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"],
            "output": json.dumps({"city": arguments["city"], "sky": "sunny", "celsius": 18})}})
        # "required" would demand another call; "none" asks for words about the result.
        await client.update_session({"tool_choice": "none"})
        await client.create_response()
        created = await client.wait_for("response.created", timeout=60)
        done = await client.wait_for("response.done", timeout=120)
    rid = created["response"]["id"]
    text = "".join(e["delta"] for e in client.events
                   if e["type"] == "response.output_text.delta" and e["response_id"] == rid)
    assert done["response"]["id"] == rid and done["response"]["status"] == "completed"
    assert text.strip() and [i["type"] for i in done["response"]["output"]] == ["message"]


async def test_the_model_calls_an_mcp_tool_and_answers_with_its_result(server):
    """A remote MCP server (the SDK's, tests/support/mcp_servers.py) on the default
    pipeline: SmolLM2 is offered the listed ``add``, "required" makes it call it
    with schema-valid arguments, the engine runs the call, and the follow-up
    response answers in words."""
    from support.mcp_servers import McpServers

    servers = McpServers().start()
    try:
        async with await RealtimeClient.connect(server.ws_url) as client:
            await client.update_session({
                "output_modalities": ["text"], "tool_choice": "required",
                "audio": {"input": {"turn_detection": None}},
                "tools": [{"type": "mcp", "server_label": "calc", "server_url": servers.url(0),
                           "allowed_tools": ["add"], "require_approval": "never"}]})
            listing = await client.wait_for("conversation.item.done", timeout=60)
            assert [t["name"] for t in listing["item"]["tools"]] == ["add"]
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "What is 2 plus 3?"}]}})
            await client.create_response()
            first = await client.wait_for("response.done", timeout=120)
            [call] = first["response"]["output"]
            arguments = json.loads(call["arguments"])
            assert (call["type"], call["name"], call["error"]) == ("mcp_call", "add", None)
            assert call["output"] == str(arguments["a"] + arguments["b"])  # the server's answer
            # The follow-ups (the model may call again, MAX_ROUNDS at most) end in words.
            for _ in range(4):
                done = await client.wait_for("response.done", timeout=120)
                if [i["type"] for i in done["response"]["output"]] == ["message"]:
                    break
            assert done["response"]["status"] == "completed"
            assert [i["type"] for i in done["response"]["output"]] == ["message"]
            assert done["response"]["output"][0]["content"][0]["text"].strip()
    finally:
        servers.stop()
