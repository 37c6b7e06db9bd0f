"""Delegation on the GPT-Live codec, without sockets: the session's own
events for a reply that calls a tool (made by the product's ``ResponseRecord``)
become ``session.delegation.created`` and the backend run's Responses stream
in ``response.event``; the client's answers become the session's items and
replies. Every frame is validated by the SDK's model of its type, and every
nested Responses event by the SDK's ``ResponseStreamEvent`` union."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pydantic
import pytest
from openai.types.live import (
    CommentaryAppendEvent,
    ResponseCreateEvent,
    ResponseItemCreateEvent,
    SessionStartEvent,
)
from openai.types.live.session_config import SessionConfig
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import ItemCreate, ResponseCreate, SessionUpdate
from vllm_duplex.domain.conversation import ItemType, Response, ResponseStatus
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import AudioOut, ToolCall
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveStart
from vllm_duplex.realtime.wire.live.delegated import LiveCommands
from vllm_duplex.realtime.wire.live.delegation import DELEGATE_TOOL
from vllm_duplex.session.latency import ResponseTimes
from vllm_duplex.session.responses import ResponseRecord

from support.live_shapes import live_event, responses_event

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
RESPONSES = {"type": "responses", "responses": {
    "model": "gpt-5.5", "tools": [WEATHER], "tool_choice": "required",
    "instructions": "Call get_weather for weather questions."}}
SESSION_DOC = {"id": "sess_1", "model": "smollm2", "expires_at": 1_800_000_000,
               "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                    "voice": "marin"}}}


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def started(clock: Clock | None = None, default: str = "", **session) -> tuple[LiveCodec, LiveStart]:
    c = LiveCodec(max_event_bytes=1 << 20, model_aliases={"smollm2": "smollm2"},
                  clock=clock or Clock(), default_instructions=default)
    raw = {"type": "session.start", "session": {"model": "gpt-live-1", **session}}
    with contextlib.suppress(pydantic.ValidationError):  # a valid one is as the SDK sends it
        raw = json.loads(SessionStartEvent(type="session.start", session=SessionConfig(
            model="gpt-live-1", **session)).to_json())
    cmd = c.parse(json.dumps(raw))
    assert isinstance(cmd, LiveStart)
    render(c, ev.SessionCreated(session=SESSION_DOC, resume_token="r"))
    return c, cmd


_seq = iter(range(1, 10_000))


def render(c: LiveCodec, event: ev.ServerEvent) -> list:
    """Every frame the codec sends for one session event, as the SDK's models."""
    return [live_event(f) for f in c.frames(Envelope(next(_seq), Fence("sess_1"), event))]


def reply(rid: str, metadata: dict | None = None) -> ResponseRecord:
    response = Response(id=rid, conversation_id="conv_1", output_modalities=("audio",),
                        output_format={"type": "audio/pcm", "rate": 24000}, voice="marin",
                        metadata=metadata)
    pcm = AudioFormat()  # PCM16 at 24 kHz
    return ResponseRecord(response, f"item_{rid}", in_conversation=True, previous_item_id=None,
                          encoder_factory=lambda rate: AudioEncoder(pcm, in_rate=rate))


def finish(record: ResponseRecord) -> list[ev.ServerEvent]:
    return record.finish(ResponseStatus.COMPLETED, ResponseTimes(created_at=0.0, turn_end_at=None))


def nested(frames: list) -> list[dict]:
    """The Responses events inside ``response.event``s, each validated."""
    out = []
    for f in frames:
        if f.type == "response.event":
            responses_event(f.event)
            out.append(f.event)
    return out


def test_responses_tools_and_backend_prompt_become_the_sessions():
    c, cmd = started(instructions="Be brief.", delegation=RESPONSES)
    assert cmd.patch.tools == (WEATHER,) and cmd.patch.tool_choice == "required"
    assert cmd.patch.instructions == "Be brief.\n\nCall get_weather for weather questions."
    [resource] = render(c, ev.SessionUpdated(session={**SESSION_DOC,
                                                      "instructions": cmd.patch.instructions}))
    assert resource.session.instructions == "Be brief."  # the Live instructions
    assert resource.session.delegation.responses.tools[0].name == "get_weather"
    update = c.parse(json.dumps({"type": "session.update", "session": {"delegation": {
        "type": "responses", "responses": {"tools": [], "tool_choice": "auto"}}}}))
    assert isinstance(update, SessionUpdate) and update.patch.tools == ()


def test_the_backend_prompt_follows_the_servers_instructions_when_the_client_sent_none():
    _, cmd = started(default="You are a helpful voice assistant.", delegation=RESPONSES)
    assert cmd.patch.instructions == ("You are a helpful voice assistant.\n\n"
                                      "Call get_weather for weather questions.")
    _, cmd = started(default="You are a helpful voice assistant.")
    assert cmd.patch.get("instructions") in (None, "You are a helpful voice assistant.")


@pytest.mark.parametrize("responses, param", [
    ({"model": "m", "tools": [{"type": "web_search"}]}, "session.delegation.responses.tools[0].type"),
    ({"model": "m", "tools": [{"type": "function"}]}, "session.delegation.responses.tools[0].name"),
    ({"model": "m", "tool_choice": {"type": "file_search"}},
     "session.delegation.responses.tool_choice"),
])
def test_what_the_backend_cannot_run_is_refused_by_name(responses, param):
    with pytest.raises(DuplexError) as err:
        started(delegation={"type": "responses", "responses": responses})
    assert err.value.param == param


def test_a_tool_call_is_a_delegation_and_its_continuation_is_spoken():
    clock = Clock()
    c, _ = started(clock, delegation=RESPONSES)
    clock.t += 3.0
    voice = reply("resp_1")
    frames = render(c, voice.start_events()[0])
    assert frames == []  # the voice's reply: nothing delegated yet
    _, call_events = voice.on_tool_call(ToolCall("resp_1", "call_1", "get_weather",
                                                 '{"city": "Paris"}'))
    for event in [*call_events, *finish(voice)]:
        frames += render(c, event)
    created = frames[0]
    assert created.type == "session.delegation.created"
    assert created.delegation.target == "responses" and created.delegation.response_id == "resp_1"
    assert created.offset_ms == 3000
    stream = nested(frames)
    assert [e["type"] for e in stream] == [
        "response.created", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in stream] == list(range(6))
    assert {f.delegation_id for f in frames[1:] if f.type == "response.event"} == {
        created.delegation.id}
    call = stream[4]["item"]
    assert (call["call_id"], call["name"], json.loads(call["arguments"])) == (
        "call_1", "get_weather", {"city": "Paris"})
    assert stream[0]["response"]["output"] == [] and stream[0]["response"]["tools"] == []
    assert stream[-1]["response"]["status"] == "completed"

    # the client answers: the call's output, then response.create
    with pytest.raises(DuplexError) as err:
        c.parse(ResponseItemCreateEvent(type="response.item.create", event_id="o0", item={
            "type": "function_call_output", "call_id": "call_9", "output": "x"}).to_json())
    assert (err.value.code, err.value.param, err.value.event_id) == (
        "invalid_value", "item.call_id", "o0")
    with pytest.raises(DuplexError):  # a continuation with the call unanswered
        c.parse(ResponseCreateEvent(type="response.create").to_json())
    output = c.parse(ResponseItemCreateEvent(type="response.item.create", event_id="o1", item={
        "type": "function_call_output", "call_id": "call_1",
        "output": '{"celsius": 18}'}).to_json())
    assert isinstance(output, ItemCreate) and output.event_id == "o1"
    assert output.item.type is ItemType.FUNCTION_CALL_OUTPUT
    assert (output.item.call_id, output.item.output) == ("call_1", '{"celsius": 18}')
    go = c.parse(ResponseCreateEvent(type="response.create", event_id="c1").to_json())
    assert isinstance(go, LiveCommands)
    [ask] = go.commands
    assert isinstance(ask, ResponseCreate)
    assert ask.options.tool_choice == "none"  # "required" was the delegating turn's

    # the continuation: the engine's reply tagged with the delegation, spoken
    answer = reply("resp_2", metadata=ask.options.metadata)
    frames = render(c, answer.start_events()[0])
    said = AudioOut("resp_2", np.ones(4800, np.int16), 24000, "It is 18 degrees in Paris.")
    for event in [*answer.on_text("It is 18 degrees in Paris."), *answer.on_audio(said),
                  *finish(answer)]:
        frames += render(c, event)
    stream = nested(frames)
    assert [e["type"] for e in stream] == ["response.created", "response.output_item.added",
                                           "response.output_item.done", "response.completed"]
    assert stream[2]["item"]["content"][0]["text"] == "It is 18 degrees in Paris."
    assert {f.delegation_id for f in frames if f.type == "response.event"} == {
        created.delegation.id}
    assert [f.delta for f in frames if f.type == "session.output_transcript.delta"] == [
        "It is 18 degrees in Paris."]  # the voice speaks it
    assert frames[-1].type == "session.usage.updated"


def test_a_continuation_asked_while_the_voice_speaks_waits_for_it():
    c, _ = started(delegation=RESPONSES)
    voice = reply("resp_1")
    for event in [voice.start_events()[0],
                  *voice.on_tool_call(ToolCall("resp_1", "call_1", "get_weather", "{}"))[1],
                  *finish(voice)]:
        render(c, event)
    c.parse(ResponseItemCreateEvent(type="response.item.create", item={
        "type": "function_call_output", "call_id": "call_1", "output": "ok"}).to_json())
    other = reply("resp_2")  # the user spoke meanwhile: the engine answers them
    render(c, other.start_events()[0])
    go = c.parse(ResponseCreateEvent(type="response.create", event_id="c1").to_json())
    assert go.commands == () and c.due() == []
    render(c, finish(other)[-1])
    [ask] = c.due()
    assert isinstance(ask, ResponseCreate) and ask.options.metadata
    # refused because yet another reply started first: it waits again, unseen
    assert render(c, ev.ResponseCreated(response={"id": "resp_3"})) == []
    assert render(c, ev.ErrorEvent(error=DuplexError(
        "conversation_already_has_active_response", "busy", event_id=ask.event_id))) == []
    render(c, ev.ResponseDone(response={"id": "resp_3", "status": "completed"}))
    assert c.due() == [ask]


def test_response_events_need_responses_delegation():
    c, _ = started()
    for event in (ResponseCreateEvent(type="response.create", event_id="x"),
                  ResponseItemCreateEvent(type="response.item.create", event_id="x", item={
                      "type": "function_call_output", "call_id": "c", "output": "o"})):
        with pytest.raises(DuplexError) as err:
            c.parse(event.to_json())
        assert (err.value.code, err.value.event_id) == ("invalid_value", "x")


def test_commentary_is_context_the_voice_speaks_now():
    clock = Clock()
    c, _ = started(clock)
    cmds = c.parse(CommentaryAppendEvent(type="session.commentary.append", event_id="k1",
                                         content="Your table is booked for 8 pm.",
                                         delegation_id=None).to_json())
    item, ask = cmds.commands
    assert isinstance(item, ItemCreate) and item.item.role.value == "system"
    assert "Your table is booked for 8 pm." in item.item.content[0].text
    assert isinstance(ask, ResponseCreate)
    clock.t += 1.5
    [ack] = render(c, ev.ConversationItemAdded(item=item.item.wire(), previous_item_id=None))
    assert (ack.type, ack.client_event_id, ack.start_ms) == (
        "session.commentary.appended", "k1", 1500)
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps({"type": "session.commentary.append", "content": "x",
                            "delegation_id": "deleg_nope", "event_id": "k2"}))
    assert (err.value.param, err.value.event_id) == ("delegation_id", "k2")


def test_client_delegation_hands_the_task_over_and_the_commentary_answers_it():
    c, cmd = started(delegation={"type": "client"})
    assert [t["name"] for t in cmd.patch.tools] == [DELEGATE_TOOL]
    voice = reply("resp_1")
    frames = render(c, voice.start_events()[0])
    for event in [*voice.on_tool_call(ToolCall("resp_1", "call_7", DELEGATE_TOOL,
                                               '{"task": "book a table"}'))[1], *finish(voice)]:
        frames += render(c, event)
    [created] = [f for f in frames if f.type == "session.delegation.created"]
    assert created.delegation.target == "client" and created.delegation.response_id is None
    assert not [f for f in frames if f.type == "response.event"]  # no backend stream
    with pytest.raises(DuplexError):  # not a Responses session
        c.parse(ResponseCreateEvent(type="response.create").to_json())
    thinking = c.parse(json.dumps({"type": "session.thinking.append", "content": "Working on it.",
                                   "delegation_id": created.delegation.id}))
    assert isinstance(thinking, ItemCreate)
    answer = c.parse(CommentaryAppendEvent(type="session.commentary.append",
                                           content="Booked for 8 pm.",
                                           delegation_id=created.delegation.id).to_json())
    output, ask = answer.commands
    assert output.item.type is ItemType.FUNCTION_CALL_OUTPUT
    assert (output.item.call_id, output.item.output) == ("call_7", "Booked for 8 pm.")
    assert isinstance(ask, ResponseCreate)
    again = c.parse(CommentaryAppendEvent(type="session.commentary.append", content="Table 4.",
                                          delegation_id=created.delegation.id).to_json())
    assert again.commands[0].item.type is ItemType.MESSAGE  # more on the same task


def test_a_responses_delegation_refuses_a_delegation_id():
    c, _ = started(delegation=RESPONSES)
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps({"type": "session.instructions.append", "content": "x",
                            "delegation_id": "deleg_1"}))
    assert err.value.param == "delegation_id"


def test_the_calls_of_a_run_cut_short_are_void():
    """A barge-in cuts the run that called: its calls take no output, and a
    later ``response.create`` is not held up by them."""
    c, _ = started(delegation=RESPONSES)
    voice = reply("resp_1")
    frames = []
    for event in [voice.start_events()[0],
                  *voice.on_tool_call(ToolCall("resp_1", "call_1", "get_weather", "{}"))[1],
                  *voice.finish(ResponseStatus.CANCELLED,
                                ResponseTimes(created_at=0.0, turn_end_at=None),
                                {"type": "cancelled", "reason": "turn_detected"})]:
        frames += render(c, event)
    end = nested(frames)[-1]
    assert end["type"] == "response.failed" and "turn_detected" in end["response"]["error"]["message"]
    with pytest.raises(DuplexError) as err:
        c.parse(ResponseItemCreateEvent(type="response.item.create", item={
            "type": "function_call_output", "call_id": "call_1", "output": "x"}).to_json())
    assert err.value.param == "item.call_id"
    go = c.parse(ResponseCreateEvent(type="response.create").to_json())
    assert isinstance(go.commands[0], ResponseCreate)
