"""Delegation on ``/v1/live/sessions``, driven by the ``openai`` SDK's own live
client on the scripted engine whose LLM calls the tool it is offered
(``support.clients.tools_config``): the protocol's rules without the models'
time. Every raw frame is validated against the SDK's model of its type, and
every Responses event inside a ``response.event`` against the SDK's model of
that. The same on the real CPU pipeline: ``test_live_cascade_tools.py``."""

from __future__ import annotations

import json

import pytest
from support.clients import TOOL_ARGUMENTS, tools_config
from support.live_shapes import responses_event
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    SCRIPTED_REPLY,
    b64,
    chunks,
    module_server,
    no_leaked_tasks,
    silence,
    utterance,
)
from support.live_kit import Reader, live, started

pytestmark = pytest.mark.asyncio(loop_scope="module")

server = module_server(tools_config())

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
RESPONSES = {"type": "responses", "responses": {"model": "gpt-5.5", "tools": [WEATHER]}}


async def speak(conn) -> None:
    for chunk in chunks(utterance() + silence(0.5)):
        await conn.session.input_audio.append(audio=b64(chunk))


def stream(events: Reader, delegation_id: str | None = None) -> list[dict]:
    out = []
    for e in events.of("response.event"):
        responses_event(e.event)
        if delegation_id is None or e.delegation_id == delegation_id:
            out.append(e.event)
    return out


async def test_a_spoken_turn_delegates_a_tool_call_and_the_voice_speaks_its_result(server):
    async with live(server) as conn:
        events, _ = await started(conn, delegation=RESPONSES)
        await speak(conn)
        created = await events.until("session.delegation.created")
        assert created.delegation.target == "responses" and created.delegation.response_id
        done = await events.until("response.event")
        while done.event["type"] != "response.completed":
            done = await events.until("response.event")
        calls = [e["item"] for e in stream(events, created.delegation.id)
                 if e["type"] == "response.output_item.done"]
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", TOOL_ARGUMENTS)]
        assert not events.of("session.output_transcript.delta")  # nothing said yet
        await conn.response.item.create(item={"type": "function_call_output",
                                              "call_id": calls[0]["call_id"],
                                              "output": json.dumps({"celsius": 18})},
                                        event_id="out_1")
        await conn.response.create(event_id="go_1")
        await events.until("session.output_audio.delta")
        said = await events.until("session.usage.updated")
    assert said and not events.of("error")
    assert "".join(e.delta for e in events.of("session.output_transcript.delta")) == SCRIPTED_REPLY
    kinds = [e["type"] for e in stream(events, created.delegation.id)]
    assert kinds == ["response.created", "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed",  # the run that called, then its continuation:
                     "response.created", "response.output_item.added",
                     "response.output_item.done", "response.completed"]
    answer = stream(events, created.delegation.id)[-2]["item"]
    assert answer["content"][0]["text"] == SCRIPTED_REPLY


async def test_bad_answers_are_typed_errors_and_the_session_goes_on(server):
    async with live(server) as conn:
        events, _ = await started(conn, delegation=RESPONSES)
        await conn.response.item.create(item={"type": "function_call_output", "call_id": "nope",
                                              "output": "x"}, event_id="o1")
        err = await events.until("error")
        assert (err.error.code, err.error.param, err.client_event_id) == (
            "invalid_value", "item.call_id", "o1")
        await conn.send_raw(json.dumps({"type": "response.item.create", "event_id": "o2",
                                        "item": {"type": "web_search_call"}}))
        err = await events.until("error")
        assert (err.error.code, err.client_event_id) == ("unsupported_option", "o2")
        await speak(conn)  # the conversation goes on
        await events.until("session.delegation.created")
    async with live(server) as conn:
        events, _ = await started(conn)  # no delegation
        await conn.response.create(event_id="r1")
        err = await events.until("error")
        assert (err.error.code, err.client_event_id) == ("invalid_value", "r1")


async def test_commentary_is_spoken_and_acknowledged(server):
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.session.commentary.append(content="Your table is booked for 8 pm.",
                                             delegation_id=None, event_id="k1")
        ack = await events.until("session.commentary.appended")
        assert ack.client_event_id == "k1" and ack.start_ms == ack.end_ms
        await events.until("session.usage.updated")  # the voice said something about it
    assert "".join(e.delta for e in events.of("session.output_transcript.delta")) == SCRIPTED_REPLY
    assert not events.of("error")


async def test_client_delegation_is_answered_by_commentary(server):
    async with live(server) as conn:
        events, _ = await started(conn, delegation={"type": "client"})
        await speak(conn)
        created = await events.until("session.delegation.created")
        assert created.delegation.target == "client" and created.delegation.response_id is None
        await events.until("session.usage.updated")  # the turn that handed it over ended
        assert not events.of("session.output_transcript.delta")
        await conn.session.commentary.append(content="x", delegation_id="deleg_nope",
                                             event_id="k0")
        err = await events.until("error")
        assert (err.error.param, err.client_event_id) == ("delegation_id", "k0")
        await conn.session.commentary.append(content="The table is booked for 8 pm.",
                                             delegation_id=created.delegation.id, event_id="k1")
        assert (await events.until("session.commentary.appended")).client_event_id == "k1"
        await events.until("session.output_audio.delta")
        await events.until("session.usage.updated")
    assert "".join(e.delta for e in events.of("session.output_transcript.delta")) == SCRIPTED_REPLY
    assert not events.of("response.event")
