"""The GPT-Live codec without sockets: client frames built by the ``openai``
SDK's own models parse into the session's commands, and every server event it
renders is exactly the SDK's shape (``tests/support/live_shapes.py``)."""

from __future__ import annotations

import base64
import json
import typing
from pathlib import Path

import pytest
from openai.types.live import (
    InputAudioAppendEvent,
    InstructionsAppendEvent,
    ThinkingAppendEvent,
    InputAudioMuteEvent,
    InputAudioUnmuteEvent,
    SessionCloseEvent,
    SessionUpdateEvent,
)
from openai.types.live.client_event import ClientEvent
from openai.types.live.connect_client_event import ConnectClientEvent
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import AudioAppend, ItemCreate, SessionClose, SessionUpdate
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import AudioEncoding
from vllm_duplex.realtime.wire.live.client_events import HANDLED, REFUSED
from vllm_duplex.realtime.wire.live.commands import LiveAck

from support.live_kit import SESSION_DOC, Clock, codec, env, frame, start
from support.live_shapes import SERVER_MODELS, live_event

ROOT = Path(__file__).resolve().parents[2]


def client_types(union) -> set[str]:
    return {typing.get_args(m.model_fields["type"].annotation)[0]
            for m in typing.get_args(typing.get_args(union)[0])}


# ---- every client event has its disposition -------------------------------------------

def test_every_sdk_client_event_is_handled_or_refused_by_name():
    sdk = client_types(ClientEvent) | client_types(ConnectClientEvent)
    assert sdk == set(HANDLED) | set(REFUSED)


def test_conformance_doc_lists_every_sdk_event():
    doc = (ROOT / "docs" / "live-conformance.md").read_text()
    sdk = client_types(ClientEvent) | client_types(ConnectClientEvent) | set(SERVER_MODELS)
    missing = sorted(k for k in sdk if f"`{k}`" not in doc)
    assert not missing, f"docs/live-conformance.md lacks {missing}"


# ---- parse -----------------------------------------------------------------------------

def test_session_start_is_the_realtime_session_it_means():
    c = codec()
    cmd = start(c, instructions="Be brief.",
                audio={"format": {"type": "audio/pcm", "rate": 16000},
                       "output": {"voice": "marin"}})
    patch = cmd.patch
    assert cmd.model == "gpt-live-1" and cmd.event_id == "start_1"
    assert patch.model == "smollm2"  # the GPT-Live name means the served model
    assert patch.instructions == "Be brief." and patch.voice == "marin"
    assert patch.input_format.rate == 16000 and patch.output_format.rate == 16000
    # the engine decides when to speak: semantic end of turn answers by itself
    assert patch.turn_detection.type == "semantic_vad"
    assert patch.turn_detection.create_response and patch.turn_detection.interrupt_response
    assert patch.transcription is not None  # input transcript deltas


def test_g711_format_and_blank_instructions():
    patch = start(codec(), instructions="  ",
                  audio={"format": {"type": "audio/pcmu", "rate": 8000}}).patch
    assert patch.input_format.encoding is AudioEncoding.PCMU
    assert patch.get("instructions") is None  # blank: the server's default


@pytest.mark.parametrize("session, code, param", [
    ({"model": "gpt-4o"}, "model_not_found", "session.model"),
    ({"model": "gpt-live-1", "delegation": {"type": "decisions", "decisions": {}}},
     "invalid_value", "session.delegation.decisions.model"),
    ({"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {
        "model": "gpt-5", "tools": [{"type": "web_search"}]}}},
     "unsupported_option", "session.delegation.responses.tools[0].type"),
    ({"model": "gpt-live-1", "store": "yes"}, "invalid_value", "session.store"),
    ({"model": "gpt-live-1", "input": [{"role": "system", "content": [{"text": "hi"}]}]},
     "invalid_value", "session.input[0].role"),
    ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}},
     "unsupported_audio_format", "session.audio.format.rate"),
    ({"model": "gpt-live-1", "audio": {"output": {"voice": {"id": "voice_1"}}}},
     "unsupported_option", "session.audio.output.voice"),
])
def test_bad_start_is_a_typed_error(session, code, param):
    with pytest.raises(DuplexError) as err:
        codec().parse(json.dumps({"type": "session.start", "event_id": "s", "session": session}))
    assert (err.value.code, err.value.param, err.value.event_id) == (code, param, "s")


@pytest.mark.parametrize("text, code", [
    ("not json", "invalid_json"), ("[1]", "invalid_event"), ('{"type": 3}', "invalid_event"),
    ('{"type": "response.cancel"}', "unknown_event"),
    ('{"type": "session.input_audio.append", "audio": "***"}', "invalid_audio"),
])
def test_bad_frames(text, code):
    with pytest.raises(DuplexError) as err:
        codec().parse(text)
    assert err.value.code == code
    live_event(codec().render_error(err.value))


def test_audio_append_and_mute_sends_silence_at_once():
    c = codec()
    start(c)
    voiced = b"\x10\x27" * 480
    b64 = base64.b64encode(voiced).decode()
    append = frame(InputAudioAppendEvent(type="session.input_audio.append", audio=b64))
    assert c.parse(append) == AudioAppend(audio=voiced)
    ack = c.parse(frame(InputAudioMuteEvent(type="session.input_audio.mute", event_id="m1")))
    assert ack == LiveAck("session.input_audio.muted", "m1")
    shaped = live_event(c.render_ack(ack))
    assert shaped.type == "session.input_audio.muted" and shaped.client_event_id == "m1"
    muted = c.parse(append)
    assert muted.audio == b"\x00" * len(voiced)  # same length: the session's clock runs on
    ack = c.parse(frame(InputAudioUnmuteEvent(type="session.input_audio.unmute")))
    assert live_event(c.render_ack(ack)).type == "session.input_audio.unmuted"
    assert c.parse(append).audio == voiced


def test_muted_g711_is_its_own_silence():
    c = codec()
    start(c, audio={"format": {"type": "audio/pcma", "rate": 8000}})
    c.parse('{"type": "session.input_audio.mute"}')
    audio = c.parse(json.dumps({"type": "session.input_audio.append",
                                "audio": base64.b64encode(b"\x01\x02").decode()})).audio
    assert audio == b"\xd5\xd5"


def test_update_close_and_a_second_start():
    c = codec()
    start(c)
    upd = c.parse(frame(SessionUpdateEvent(type="session.update", session={}, event_id="u1")))
    assert isinstance(upd, SessionUpdate) and upd.patch.fields_set() == {}
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps({"type": "session.update", "event_id": "u2",
                            "session": {"triggers": [{"type": "x"}]}}))
    assert err.value.param == "session.triggers[0].type" and err.value.event_id == "u2"
    assert c.parse(frame(SessionCloseEvent(type="session.close"))) == SessionClose()


def test_delegation_without_tools_is_accepted_and_repeated():
    """LiveKit's GPT-Live model sends ``responses`` delegation by default: with
    no tools, this engine's own LLM is that backend, so it is accepted."""
    c = codec()
    start(c, delegation={"type": "responses", "responses": {"model": "gpt-5.5"}})
    started = live_event(c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r"))))
    assert started.session.delegation.type == "responses"
    assert started.session.delegation.responses.model == "gpt-5.5"
    c.parse(json.dumps({"type": "session.update", "event_id": "u1", "session": {
        "delegation": {"type": "responses", "acknowledgement_delay_ms": 200}}}))
    updated = live_event(c.render(env(ev.SessionUpdated(session=SESSION_DOC), 2)))
    assert updated.session.delegation.acknowledgement_delay_ms == 200
    assert updated.session.delegation.responses.model == "gpt-5.5"  # kept
    c.parse(json.dumps({"type": "session.update", "session": {"delegation": {
        "type": "responses", "responses": {"max_output_tokens": 300}}}}))
    updated = live_event(c.render(env(ev.SessionUpdated(session=SESSION_DOC), 3)))
    assert updated.session.delegation.responses.model == "gpt-5.5"
    assert updated.session.delegation.responses.max_output_tokens == 300
    c.parse(json.dumps({"type": "session.update", "session": {"delegation": {"type": "client"}}}))
    updated = live_event(c.render(env(ev.SessionUpdated(session=SESSION_DOC), 3)))
    assert updated.session.delegation.type == "client"
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps({"type": "session.update", "session": {
            "delegation": {"type": "responses"}}}))  # another type: its model is needed
    assert err.value.param == "session.delegation.responses"


def test_instructions_and_thinking_append_are_system_items_acknowledged_when_added():
    clock = Clock()
    c = codec(clock)
    start(c)
    c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r")))
    rule = c.parse(frame(InstructionsAppendEvent(type="session.instructions.append",
                                                 content="Answer in one sentence.",
                                                 event_id="i1")))
    assert isinstance(rule, ItemCreate) and rule.event_id == "i1"
    assert rule.item.role.value == "system"
    assert rule.item.content[0].text == "Answer in one sentence."
    know = c.parse(frame(ThinkingAppendEvent(type="session.thinking.append",
                                             content="The caller is Ana.", event_id="t1")))
    assert "The caller is Ana." in know.item.content[0].text
    assert "not to say" in know.item.content[0].text
    clock.t += 2.0
    added = ev.ConversationItemAdded(item={"id": know.item.id}, previous_item_id=None)
    ack = live_event(c.render(env(added)))
    assert (ack.type, ack.client_event_id, ack.start_ms, ack.end_ms) == (
        "session.thinking.appended", "t1", 2000, 2000)
    assert c.render(env(added, 3)) is None  # acknowledged once
    ack = live_event(c.render(env(ev.ConversationItemAdded(item={"id": rule.item.id},
                                                           previous_item_id=None), 4)))
    assert (ack.type, ack.client_event_id) == ("session.instructions.appended", "i1")


@pytest.mark.parametrize("fields, param", [
    ({"content": ""}, "content"), ({}, "content"),
    ({"content": "x", "delegation_id": "del_1"}, "delegation_id"),
])
def test_a_bad_append_is_refused(fields, param):
    with pytest.raises(DuplexError) as err:
        codec().parse(json.dumps({"type": "session.thinking.append", "event_id": "a", **fields}))
    assert (err.value.code, err.value.param, err.value.event_id) == ("invalid_value", param, "a")


# ---- render ----------------------------------------------------------------------------

def test_session_started_and_updated_are_the_sdk_resource():
    c = codec()
    start(c)
    started = live_event(c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r"))))
    assert started.client_event_id == "start_1"
    s = started.session
    assert (s.id, s.model, s.status, s.expires_at) == ("sess_1", "gpt-live-1", "active",
                                                       1_800_000_000)
    assert s.instructions == "Be brief." and s.audio.output.voice == "marin"
    assert s.audio.format.rate == 24000
    c.parse(json.dumps({"type": "session.update", "event_id": "u1", "session": {}}))
    updated = live_event(c.render(env(ev.SessionUpdated(session=SESSION_DOC), 2)))
    assert updated.client_event_id == "u1" and updated.session.id == "sess_1"


def test_audio_and_transcripts_on_the_session_timeline():
    clock = Clock()
    c = codec(clock)
    start(c)
    c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r")))
    clock.t += 1.0
    assert c.render(env(ev.SpeechStarted(audio_start_ms=1000, item_id="i1"))) is None
    clock.t += 0.5
    user = live_event(c.render(env(ev.InputTranscriptionDelta("i1", 0, "What is"))))
    assert (user.delta, user.start_ms, user.end_ms) == ("What is", 1000, 1500)
    clock.t += 1.0
    assert c.render(env(ev.ResponseCreated(response={"id": "r1"}))) is None
    pcm = b"\x01\x02" * 240
    audio = live_event(c.render(env(ev.OutputAudioDelta("r1", "a1", 0, 0, pcm))))
    assert base64.b64decode(audio.delta) == pcm and audio.start_ms is None
    clock.t += 0.25
    # the LLM's words as written are not what the voice says yet: nothing
    assert c.render(env(ev.OutputAudioTranscriptDelta("r1", "a1", 0, 0, "Paris is"))) is None
    more, said = map(live_event, c.frames(env(ev.OutputAudioDelta("r1", "a1", 0, 0, pcm,
                                                                  spoken="Paris"))))
    assert more.type == "session.output_audio.delta"
    assert (said.delta, said.start_ms, said.end_ms) == ("Paris", 2500, 2750)
    clock.t += 3.0
    usage = live_event(c.render(env(ev.ResponseDone(response={"id": "r1"}))))
    assert usage.type == "session.usage.updated" and usage.usage.seconds == 5.0
    # what GPT-Live has no event for renders to nothing
    assert c.render(env(ev.OutputItemDone(response_id="r1", output_index=0, item={}))) is None
    assert c.render(env(ev.OutputAudioDelta("r1", "a1", 0, 0, b""))) is None


def test_errors_and_close():
    c = codec()
    start(c)
    c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r")))
    err = DuplexError("invalid_value", "bad", param="session.x", event_id="c9")
    shaped = live_event(c.render(env(ev.ErrorEvent(error=err))))
    assert (shaped.error.code, shaped.error.type, shaped.error.param) == (
        "invalid_value", "invalid_request_error", "session.x")
    closed = live_event(c.render(env(ev.SessionClosed(reason="client"))))
    assert closed.reason == "close_requested" and closed.session.id == "sess_1"
    assert closed.usage.seconds >= 0


def test_the_final_transcript_sends_the_words_the_fragments_did_not():
    """GPT-Live has no "completed" transcript: the words only the final heard
    (a turn's last words, after the partials' stable ones) follow as one more
    fragment, and a final that says nothing new sends nothing."""
    clock = Clock()
    c = codec(clock)
    start(c)
    c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r")))
    c.render(env(ev.SpeechStarted(audio_start_ms=0, item_id="i1")))
    c.render(env(ev.InputTranscriptionDelta("i1", 0, "What is the cap")))
    rest = live_event(c.render(env(ev.InputTranscriptionCompleted(
        "i1", 0, "What is the capital of France?"))))
    assert rest.type == "session.input_transcript.delta" and rest.delta == "ital of France?"
    # a turn heard whole by its partials: nothing more
    c.render(env(ev.InputTranscriptionDelta("i2", 0, "Okay.")))
    assert c.render(env(ev.InputTranscriptionCompleted("i2", 0, "Okay."))) is None
    # the final heard an earlier word otherwise: its words after those sent
    c.render(env(ev.InputTranscriptionDelta("i3", 0, "Tell me a joke")))
    rest = live_event(c.render(env(ev.InputTranscriptionCompleted(
        "i3", 0, "Tell me the joke about cats."))))
    assert rest.delta == " about cats."
    # no fragment at all (a short turn): the whole final
    rest = live_event(c.render(env(ev.InputTranscriptionCompleted("i4", 0, "Stop."))))
    assert rest.delta == "Stop."
