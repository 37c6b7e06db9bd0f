"""A delegated tool call on the default CPU pipeline (Silero -> Whisper ->
vLLM SmolLM2 -> Piper), driven by the ``openai`` SDK's own live client: the
user asks by voice, the engine's own LLM -- the session's Responses backend
-- calls the application's function (``session.delegation.created``, then
the run's Responses stream in ``response.event``), the application answers
with ``response.item.create`` and ``response.create``, and the voice speaks
the result. Every frame is validated by the SDK's models
(``test_live_cascade.py``'s microphone reads them)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from support.live_shapes import live_event, responses_event
from support.speech_fixtures import RATE, cascade_runtime, recognize, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from support.live_kit import Microphone
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER = {"type": "function", "name": "get_weather",
           "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
# "required": SmolLM2 is too small to decide well when to call, so the
# backend is told to call on every turn (vLLM's structured outputs write the
# call); the continuation, whose context ends with the result, answers in words.
# The result is terse ("Sunny, 18 degrees."): SmolLM2 says such a result back
# as it is, where a sentence or JSON makes it write the call out again.
DELEGATION = {"type": "responses", "responses": {
    "model": "smollm2", "tools": [WEATHER], "tool_choice": "required",
    "instructions": "Use get_weather for questions about the weather."}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


@asynccontextmanager
async def live(server) -> AsyncIterator[tuple[Microphone, object]]:
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1") as client:
        async with client.live.connect() as conn:
            await conn.session.start(session={"model": "gpt-live-1", "delegation": DELEGATION})
            first = live_event((await conn.recv_bytes()).decode())
            assert first.type == "session.started", first
            async with Microphone(conn) as mic:
                yield mic, conn


def run_events(mic: Microphone, delegation_id: str) -> list[dict]:
    out = []
    for e in mic.of("response.event"):
        responses_event(e.event)
        if e.delegation_id == delegation_id:
            out.append(e.event)
    return out


async def test_a_spoken_question_is_delegated_and_the_result_is_spoken(server):
    async with live(server) as (mic, conn):
        mic.say(speak("What is the weather in Paris?"))
        await mic.until(lambda: any(e["type"] == "response.completed"
                                    for e in (x.event for x in mic.of("response.event"))), 120)
        [created] = mic.of("session.delegation.created")
        assert created.delegation.target == "responses"
        calls = [e["item"] for e in run_events(mic, created.delegation.id)
                 if e["type"] == "response.output_item.done"]
        assert [c["name"] for c in calls] == ["get_weather"]
        city = json.loads(calls[0]["arguments"])["city"]
        assert "paris" in city.lower()  # the function runs with what the user asked
        answered_at = time.monotonic()
        await conn.response.item.create(item={
            "type": "function_call_output", "call_id": calls[0]["call_id"],
            "output": "Sunny, 18 degrees."})
        await conn.response.create()
        await mic.until(lambda: mic.text("session.output_transcript.delta", answered_at), 120)
        await mic.until(lambda: mic.quiet(1.5), 60)
    assert not mic.of("error")
    said = mic.text("session.output_transcript.delta", answered_at)
    assert "18" in said or "sunny" in said.lower(), said
    heard = recognize(np.frombuffer(mic.audio(answered_at), "<i2"), RATE)
    assert "18" in heard or "eighteen" in heard or "sunny" in heard, (heard, said)
    kinds = [e["type"] for e in run_events(mic, created.delegation.id)]
    assert kinds[-4:] == ["response.created", "response.output_item.added",
                          "response.output_item.done", "response.completed"]
