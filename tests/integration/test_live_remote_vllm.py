"""A GPT-Live delegation on a real external Responses backend: vLLM's own
OpenAI-compatible server (the app ``vllm serve`` builds: ``/v1/responses``, tool
calls parsed by its ``hermes`` parser) over SmolLM2 on the CPU, on loopback,
named in the deployment's ``responses_backends`` (``support.vllm_responses``:
vLLM's app on the suite's shared engine, no second engine). The ``openai``
SDK's live client speaks to the scripted voice, whose reply calls the
delegation's tool: the turn runs on vLLM's ``/v1/responses``, its stream comes
back as ``session.delegation.created`` + ``response.event`` (every frame and
every nested Responses event validated by the SDK's models), the backend's
function call goes to the client, whose output and ``response.create``
continue the run on the same backend with the full input, and the voice
speaks when the backend has answered in words.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from support.clients import tools_config
from support.live_kit import live, started
from support.live_shapes import responses_event
from support.realtime_fixtures import b64, chunks, silence, utterance
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from support.vllm_responses import vllm_responses_backend
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER = {"type": "function", "name": "get_weather",
           "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vllm_backend(vllm_stage) -> AsyncIterator[ResponsesBackend]:
    async with vllm_responses_backend(vllm_stage.host.engine) as backend:
        yield backend


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server() -> AsyncIterator[BackgroundServer]:
    async with BackgroundServer(Runtime(tools_config())) as srv:
        yield srv


async def speak(conn) -> None:
    for chunk in chunks(utterance() + silence(0.5)):
        await conn.session.input_audio.append(audio=b64(chunk))


async def run_of(events, delegation_id: str) -> list[dict]:
    """The ``response.event``s of one run, each validated, to its end."""
    out = []
    while True:
        frame = await events.until("response.event", timeout=120)
        assert frame.delegation_id == delegation_id
        responses_event(frame.event)
        out.append(frame.event)
        if frame.event["type"] in ("response.completed", "response.incomplete",
                                   "response.failed"):
            return out


async def test_a_spoken_turn_runs_on_vllms_responses_endpoint_with_a_tool_call(
        server, vllm_backend):
    server.runtime.sessions.responses_backends = {"vllm": vllm_backend}
    try:
        async with live(server) as conn:
            events, _ = await started(conn, delegation={"type": "responses", "responses": {
                "model": "vllm", "tools": [WEATHER], "tool_choice": "required",
                "instructions": "You answer weather questions with get_weather.",
                "max_output_tokens": 48}})
            await speak(conn)
            created = await events.until("session.delegation.created", timeout=60)
            assert created.delegation.target == "responses"
            assert created.delegation.response_id.startswith("resp_")  # the remote's own id
            first = await run_of(events, created.delegation.id)
            assert first[0]["type"] == "response.created"
            assert first[0]["response"]["id"] == created.delegation.response_id
            assert first[-1]["type"] == "response.completed"
            [call] = [e["item"] for e in first if e["type"] == "response.output_item.done"]
            assert call["type"] == "function_call" and call["name"] == "get_weather"
            assert not events.of("session.output_audio.delta")  # the voice waits for the answer

            await conn.response.item.create(item={
                "type": "function_call_output", "call_id": call["call_id"],
                "output": json.dumps({"city": "Paris", "celsius": 18, "sky": "sunny"})})
            await conn.response.create(event_id="go_1")
            second = await run_of(events, created.delegation.id)
            assert second[0]["type"] == "response.created"
            assert second[0]["response"]["id"] != created.delegation.response_id  # a new run
            assert second[-1]["type"] in ("response.completed", "response.incomplete")
            words = "".join(e["delta"] for e in second
                            if e["type"] == "response.output_text.delta")
            assert words.strip()  # the backend answered in words, which the voice now speaks
            await events.until("session.output_audio.delta", timeout=60)
            await events.until("session.usage.updated", timeout=60)
        assert not events.of("error")
    finally:
        server.runtime.sessions.responses_backends = {}


CITY = {"type": "choice", "name": "city", "instructions": "Which city did the user ask about?",
        "choices": [{"value": "Tokyo"}, {"value": "Paris"}, {"value": "London"}]}


async def test_a_decision_runs_on_vllms_responses_endpoint(server, vllm_backend):
    """``decision.create`` under a ``decisions`` delegation whose model names
    the backend: asked of vLLM's ``/v1/responses`` (the answer held to the
    options by its JSON schema, probabilities from its logprobs), answered as
    the SDK's ``decision.event``."""
    server.runtime.sessions.responses_backends = {"vllm": vllm_backend}
    try:
        async with live(server) as conn:
            events, _ = await started(conn, delegation={"type": "decisions", "decisions": {
                "model": "vllm", "questions": [CITY]}})
            await conn.decision.item.create(event_id="i1", item={
                "role": "user", "content": "What is the weather like in Paris today?"})
            await events.until("decision.item.created", timeout=30)
            await conn.decision.create(event_id="d1")
            decided = await events.until("decision.event", timeout=120)
            decision = decided.event.decision
            assert decision.model == "smollm2"  # the backend's model answered
            (city,) = decision.answers
            assert city.choice in ("Tokyo", "Paris", "London")
            probabilities = {p.value: p.probability for p in city.probabilities}
            assert sum(probabilities.values()) == pytest.approx(1)
            assert probabilities[city.choice] == max(probabilities.values())
            assert decision.usage.input_tokens > 0
        assert not events.of("error")
    finally:
        server.runtime.sessions.responses_backends = {}
