"""A GPT-Live delegation whose external Responses backend fails, driven by the
``openai`` SDK's live client on the scripted engine whose voice calls the tool
it is offered: a backend that refuses the connection, answers HTTP 500, or
sends a stream that is not one is a typed ``error`` (``backend_error``, the
backend named, its key nowhere) after the delegation's
``session.delegation.created``; the voice says it could not be done, and the
next turn delegates again. A backend that never answers is stopped at its
``timeout_s`` on the session clock (a virtual one here: the test says when
the time is up), its HTTP request closed. Every frame is validated by the
SDK's model of its type. The real backend: ``test_live_remote_vllm.py``."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.clients import tools_config
from support.live_kit import Reader, live, started
from support.live_kit import codec as live_codec
from support.live_kit import frame as sdk_frame
from support.live_shapes import live_event
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    b64,
    chunks,
    module_server,
    no_leaked_tasks,
    silence,
    utterance,
)
from support.responses_backends import misbehaving_backends
from openai.types.live import SessionStartEvent
from openai.types.live.session_config import SessionConfig
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.conversation import Response, ResponseStatus
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import ToolCall
from vllm_duplex.realtime.server.live.backend import RemoteRunner
from vllm_duplex.session.latency import ResponseTimes
from vllm_duplex.session.responses import ResponseRecord

pytestmark = pytest.mark.asyncio(loop_scope="module")

server = module_server(tools_config())

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def delegation(backend: str) -> dict:
    return {"type": "responses", "responses": {"model": backend, "tools": [WEATHER]}}


async def speak(conn) -> None:
    for chunk in chunks(utterance() + silence(0.5)):
        await conn.session.input_audio.append(audio=b64(chunk))


async def turn_ends(events: Reader) -> None:
    """The voice's reply to the delegation's end (its usage follows each reply)."""
    await events.until("session.output_audio.delta")
    await events.until("session.usage.updated")


@pytest.mark.parametrize("mode, says", [("refused", "could not be reached"),
                                        ("error", "HTTP 500"),
                                        ("malformed", "not JSON")])
async def test_a_failing_backend_is_a_typed_error_and_the_next_turn_delegates_again(
        server, mode, says):
    async with misbehaving_backends() as (state, backends):
        server.runtime.sessions.responses_backends = backends
        try:
            async with live(server) as conn:
                events, _ = await started(conn, delegation=delegation(mode))
                await speak(conn)
                created = await events.until("session.delegation.created")
                assert created.delegation.target == "responses"
                error = await events.until("error")
                assert (error.error.code, error.error.type) == ("backend_error", "server_error")
                assert f"'{mode}'" in error.error.message and says in error.error.message
                assert "sk-backend-secret" not in json.dumps([e.model_dump() for e in
                                                              events.events])
                await turn_ends(events)  # the voice says it could not be done: it goes on

                await speak(conn)  # the next turn is delegated again
                again = await events.until("session.delegation.created")
                assert again.delegation.id != created.delegation.id
                assert (await events.until("error")).error.code == "backend_error"
            if mode != "refused":
                assert state.asked == 2 and state.keys == ["Bearer sk-backend-secret"] * 2
            assert state.open == 0  # no request left open
        finally:
            server.runtime.sessions.responses_backends = {}


async def test_a_backend_that_hangs_is_stopped_at_its_timeout_and_its_request_closed():
    async with misbehaving_backends() as (state, backends):
        c = live_codec()
        c.remote.backends = backends
        c.parse(sdk_frame(SessionStartEvent(type="session.start", session=SessionConfig(
            model="gpt-live-1", delegation=delegation("hang")))))
        c.frames(Envelope(1, Fence("s"), ev.SessionCreated(session={
            "id": "s", "model": "smollm2", "expires_at": 1_800_000_000}, resume_token="r")))
        c.decisions.heard("What is the weather in Paris?", None)
        voice = ResponseRecord(Response(id="resp_1", conversation_id="conv_1",
                                        output_modalities=("audio",), voice="marin",
                                        output_format={"type": "audio/pcm", "rate": 24000}),
                               "item_resp_1",
                               in_conversation=True, previous_item_id=None,
                               encoder_factory=lambda rate: None)
        _, calls = voice.on_tool_call(ToolCall("resp_1", "call_v", "get_weather", "{}"))
        for event in [*voice.start_events(), *calls,
                      *voice.finish(ResponseStatus.COMPLETED, ResponseTimes(0.0, None))]:
            c.frames(Envelope(2, Fence("s"), event))
        [run] = c.remote.take_runs()

        sent: list[str] = []
        delivered: list = []
        time_up = asyncio.Event()

        async def send(text: str) -> bool:
            sent.append(text)
            return True

        async def deadline(seconds: float) -> None:
            assert seconds == backends["hang"].timeout_s
            await time_up.wait()

        runner = RemoteRunner(c, send, delivered.append, deadline)
        try:
            runner.submit(run)
            while state.open == 0:  # the request reached the backend, which hangs
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert sent == [] and delivered == []  # nothing decided before the time is up
            time_up.set()
            while not delivered:
                await asyncio.sleep(0.01)
        finally:
            await runner.close()
        created, error = [live_event(t) for t in sent]
        assert created.type == "session.delegation.created"
        assert error.error.code == "deadline_exceeded" and "'hang'" in error.error.message
        output, reply = delivered
        assert output.item.call_id == "call_v" and "did not answer" in output.item.output
        assert reply.options.tool_choice == "none"
        for _ in range(100):
            if state.open == 0:
                break
            await asyncio.sleep(0.01)
        assert state.open == 0  # the hung request was closed


@pytest.mark.parametrize("mode, says", [("refused", "could not be reached"),
                                        ("error", "HTTP 500"),
                                        ("malformed", "did not answer with a Responses object")])
async def test_a_decision_on_a_failing_backend_is_a_typed_error_and_the_session_goes_on(
        server, mode, says):
    """``decision.create`` under a ``decisions`` delegation whose model names
    a failing backend: its typed error, naming the decision's event, and the
    next ``decision.item.create`` is answered as before."""
    question = {"type": "choice", "name": "city", "instructions": "Which city?",
                "choices": [{"value": "Paris"}, {"value": "Rome"}]}
    async with misbehaving_backends() as (state, backends):
        server.runtime.sessions.responses_backends = backends
        try:
            async with live(server) as conn:
                events, _ = await started(conn, delegation={"type": "decisions", "decisions": {
                    "model": mode, "questions": [question]}})
                await conn.decision.create(event_id="d1")
                error = await events.until("error")
                assert (error.error.code, error.error.client_event_id) == ("backend_error", "d1")
                assert f"'{mode}'" in error.error.message and says in error.error.message
                assert "sk-backend-secret" not in error.error.message
                assert not events.of("decision.event")
                await conn.decision.item.create(event_id="i1", item={
                    "role": "user", "content": "Rome, please."})
                created = await events.until("decision.item.created")
                assert created.client_event_id == "i1"
            assert state.open == 0  # no request left open
        finally:
            server.runtime.sessions.responses_backends = {}
