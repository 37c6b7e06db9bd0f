"""The session core without I/O: messages in, the exact effects out.

In the style of python-websockets' ``tests/test_protocol.py``: no socket, no
task, no stage -- a ``SessionCore`` with a real policy, driven by typed
commands and stage outputs at chosen times, and its effects compared whole.
Ids come from a counter so events compare exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.session_core import TEN_MS, create_response, emitted, make_core, manual, output, types
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AsrConfig,
    AudioIn,
    AudioOut,
    GenerateRequest,
    GenerationDone,
    SpeechDone,
    StageFailed,
    StageOutput,
    TextDelta,
    ToolCall,
    VadConfig,
    VadSpeechStarted,
    VideoFrame,
)
from vllm_duplex.domain.session_config import SessionPatch, Transcription, TurnDetection
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.session.core import SessionCore
from vllm_duplex.session.turn_end import PAUSE_DETECT_MS
from vllm_duplex.session.effects import (
    AckEvents,
    Cancel,
    Close,
    DecodeImage,
    Emit,
    FeedVideo,
    Forward,
    FrameDecoded,
    PollVideo,
    Submit,
)
from vllm_duplex.session.mailbox import Lane, Mailbox, lane_of

F0 = Fence("s")


# ---- opening ------------------------------------------------------------------------


def test_start_announces_the_session_then_configures_the_vad():
    core = make_core()
    effects = core.start("tok", 0.0)
    td = TurnDetection()
    assert effects == [
        Emit(ev.Envelope(1, F0, ev.SessionCreated(session=core.session_object(), resume_token="tok"))),
        Submit("vad", F0, "vad-config", VadConfig(threshold=td.threshold,
                                                  prefix_padding_ms=td.prefix_padding_ms,
                                                  silence_duration_ms=td.silence_duration_ms,
                                                  # the pause before that: a reply is prepared in it
                                                  pause_ms=PAUSE_DETECT_MS)),
    ]
    assert core.session_object()["id"] == "s"


def test_seq_is_dense_across_messages_and_fences():
    core = manual(output_modalities=("text",))
    effects = core.start("tok", 0.0) + core.handle(cmd.ResponseCreate(), 0.0)
    effects += core.handle(cmd.ResponseCancel(), 0.0) + core.handle(cmd.AudioClear(), 0.0)
    envelopes = [e.envelope for e in effects if isinstance(e, Emit)]
    assert [e.seq for e in envelopes] == list(range(1, len(envelopes) + 1))
    assert {e.fence for e in envelopes} == {F0, F0.next_epoch()}


def test_a_restored_session_goes_on_from_its_stored_state():
    """Adoption (``durable/adopt.py``) rebuilds a session through ``restore``:
    the conversation is there and in the next reply's context, what the dead
    owner's stages still make is stale, and numbered input resumes after the
    last stored seq. Not a bump: nothing ran under the old fence here."""
    core = manual(output_modalities=("text",))
    said = ConversationItem("item_a", ItemType.MESSAGE, Role.USER,
                            content=[ContentPart(type="input_text", text="hi")])
    owners = Fence("s", 2, 5)
    core.restore([said], owners, last_input_seq=4)
    assert core.fence == owners.next_incarnation() == Fence("s", 3, 6)
    assert core.snapshot()["items"] == [said.wire()] and core.last_input_seq == 4
    assert core.metrics.epoch_bumps.get() == 0 and core.metrics.incarnation_bumps.get() == 0
    assert {e.envelope.fence for e in core.start("tok", 0.0) if isinstance(e, Emit)} == {
        core.fence}
    assert output(core, TextDelta("resp_old", "late"), fence=owners) == []
    assert core.gate.dropped == 1
    assert core.handle(cmd.AudioAppend(audio=TEN_MS * 10, seq=4), 0.0) == []  # a resend
    assert core.input.samples == 0
    assert core.handle(cmd.AudioAppend(audio=TEN_MS * 10, seq=5), 0.0) == []
    [err] = emitted(core.handle(cmd.AudioAppend(audio=TEN_MS * 10, seq=7), 0.0))
    assert err.error.code == "sequence_gap" and core.last_input_seq == 5
    [req] = [e.payload for e in core.handle(cmd.ResponseCreate(), 0.0) if isinstance(e, Submit)]
    assert isinstance(req, GenerateRequest) and "hi" in str(req.context)


# ---- input --------------------------------------------------------------------------


def test_audio_under_server_vad_is_one_submission_to_the_vad():
    core = make_core()
    [submit] = core.handle(cmd.AudioAppend(audio=TEN_MS * 10), 1.0, received_at=0.99)
    assert (type(submit), submit.stage, submit.fence, submit.role) == (Submit, "vad", F0, "audio")
    assert isinstance(submit.payload, AudioIn) and submit.payload.start_ms == 0
    assert 1400 <= submit.payload.pcm.size <= 1600  # ~100 ms at the internal 16 kHz
    assert core.metrics.ingest_latency.count == 1


def test_commit_and_clear():
    core = manual()
    assert core.handle(cmd.AudioAppend(audio=TEN_MS * 10), 0.0) == []  # manual turns: it waits
    effects = core.handle(cmd.AudioCommit(), 0.0)
    item = core.conversation.get("item_1").wire()
    assert emitted(effects) == [
        ev.InputAudioBufferCommitted(item_id="item_1", previous_item_id=None),
        ev.ConversationItemAdded(item=item, previous_item_id=None),
        ev.ConversationItemDone(item=item, previous_item_id=None),
    ]
    assert item["content"][0]["type"] == "input_audio"
    [err] = emitted(core.handle(cmd.AudioCommit(event_id="c2"), 0.0))  # nothing left
    assert (err.error.code, err.error.event_id) == ("input_audio_buffer_empty", "c2")
    core.handle(cmd.AudioAppend(audio=TEN_MS * 10), 0.0)
    assert core.input.samples > 0
    assert emitted(core.handle(cmd.AudioClear(), 0.0)) == [ev.InputAudioBufferCleared()]
    assert core.input.samples == 0


def test_duplicate_numbered_audio_is_ignored_and_a_gap_refused():
    core = manual()
    assert core.handle(cmd.AudioAppend(audio=TEN_MS * 10, seq=1), 0.0) == []
    once = core.input.samples
    assert once > 0
    assert core.handle(cmd.AudioAppend(audio=TEN_MS * 10, seq=1), 0.0) == []  # a resend
    [err] = emitted(core.handle(cmd.AudioAppend(audio=TEN_MS * 10, seq=3, event_id="a3"), 0.0))
    assert (err.error.code, err.error.event_id) == ("sequence_gap", "a3")
    assert core.input.samples == once and core.last_input_seq == 1


# ---- session.update -----------------------------------------------------------------


@pytest.mark.parametrize("patch, code, param", [
    (SessionPatch(model="other"), "immutable_field", "session.model"),
    # (semantic_vad is not refused: a policy without it runs it as server
    # VAD, tests/unit/test_turn_end.py)
    (SessionPatch(turn_detection=TurnDetection(type="push_to_talk")),
     "unsupported_turn_detection", "session.audio.input.turn_detection.type"),
    (SessionPatch(output_modalities=("video",)), "invalid_value", "session.output_modalities"),
])
def test_refused_updates_change_nothing(patch, code, param):
    core = make_core()
    before = core.config
    [err] = emitted(core.handle(cmd.SessionUpdate(patch=patch, event_id="u1"), 0.0))
    assert (err.error.code, err.error.param, err.error.event_id) == (code, param, "u1")
    assert core.config is before


def test_a_new_turn_detection_reconfigures_the_vad_before_the_update_is_echoed():
    core = manual()
    effects = core.handle(cmd.SessionUpdate(patch=SessionPatch(turn_detection=TurnDetection(
        silence_duration_ms=300))), 0.0)
    assert types(effects) == ["Submit", "session.updated"]
    assert effects[0].payload.silence_duration_ms == 300


def test_the_transcription_prompt_reaches_the_asr_when_it_is_set_or_changed():
    """``audio.input.transcription.prompt`` (names, spellings) is the ASR's:
    sent at the start, again when an update changes it, cleared with null."""
    asr = ("vad", "asr", "llm", "tts")
    core = make_core(CascadePolicy(), stages=asr, turn_detection=None,
                     transcription=Transcription(prompt="Siobhan"))
    started = core.start("tok", 0.0)
    assert [e.payload for e in started if isinstance(e, Submit)] == [AsrConfig("Siobhan")]
    assert started[-1].stage == "asr"

    def update(prompt):
        return core.handle(cmd.SessionUpdate(patch=SessionPatch(
            transcription=Transcription(prompt=prompt))), 0.0)

    assert types(update("Siobhan")) == ["session.updated"]  # unchanged: nothing to say
    changed = update("Aoife, Niamh")
    assert types(changed) == ["Submit", "session.updated"]
    assert changed[0].payload == AsrConfig("Aoife, Niamh")
    assert update(None)[0].payload == AsrConfig(None)
    # A policy that routes no AsrConfig (no ASR stage of its own) is sent none.
    scripted = make_core(turn_detection=None, transcription=Transcription(prompt="Siobhan"))
    assert types(scripted.start("tok", 0.0)) == ["session.created"]


# ---- responses, cancel, barge-in ----------------------------------------------------


def test_a_response_is_its_start_events_then_one_submission_to_the_generator():
    """The message item opens with the first words (a tool call needs none)."""
    core = manual()
    effects = core.handle(cmd.ResponseCreate(), 0.0)
    assert types(effects) == ["response.created", "Submit"]
    submit = effects[-1]
    assert (submit.stage, submit.fence, submit.role) == ("llm", F0, "llm")
    assert isinstance(submit.payload, GenerateRequest) and submit.payload.response_id == "resp_1"
    [err] = emitted(core.handle(cmd.ResponseCreate(event_id="r2"), 0.0))
    assert err.error.code == "conversation_already_has_active_response"


def test_a_pipeline_without_the_generator_cannot_answer():
    core = make_core(stages=("vad",), turn_detection=None)
    [err] = emitted(core.handle(cmd.ResponseCreate(), 0.0))
    assert err.error.code == "capability_unsupported" and core.shown is None


def test_cancel_is_one_epoch_bump_response_done_first_then_one_cancel():
    core = manual(output_modalities=("text",))
    rid = create_response(core)
    output(core, TextDelta(rid, "Hello "))
    effects = core.handle(cmd.ResponseCancel(event_id="x"), 2.0, received_at=1.5)
    f1 = F0.next_epoch()
    assert types(effects) == ["response.output_text.done", "response.content_part.done",
                              "response.output_item.done", "conversation.item.done",
                              "response.done", "Cancel"]
    assert effects[-1] == Cancel(f1) and core.fence == f1
    done = effects[-2].envelope
    assert done.fence == f1 and done.event.response["status"] == "cancelled"
    assert done.event.response["status_details"]["reason"] == "client_cancelled"
    assert core.metrics.cancel_latency.total == pytest.approx(0.5)
    [err] = emitted(core.handle(cmd.ResponseCancel(), 2.0))  # nothing active any more
    assert err.error.code == "response_cancel_not_active"


def test_stale_outputs_are_dropped_by_the_gate_and_counted():
    core = manual(output_modalities=("text",))
    rid = create_response(core)
    core.handle(cmd.ResponseCancel(), 0.0)
    assert output(core, TextDelta(rid, "late"), fence=F0) == []
    assert output(core, GenerationDone(rid, "stop"), fence=F0) == []
    assert core.gate.dropped == 2 and core.metrics.stale_dropped.get(stage="llm") == 2
    # The cancel moved the fence once (the floor's move, counted by the one mover).
    assert core.metrics.epoch_bumps.get() == 1 and core.metrics.incarnation_bumps.get() == 0


def test_barge_in_during_speech_cuts_the_reply_to_what_was_heard():
    """One epoch bump; response.done(cancelled, turn_detected) before the one
    Cancel; the item keeps what the client can have heard (300 ms of 1 s)."""
    core = make_core()
    rid = create_response(core, now=0.0)
    tone = np.zeros(16000, np.int16)  # one second of speech for "one two three four"
    assert types(output(core, AudioOut(rid, tone, text="one two three four"), stage="tts",
                        now=10.0)) == ["response.output_item.added", "conversation.item.added",
                                       "response.content_part.added", "response.output_audio.delta"]
    effects = output(core, VadSpeechStarted(audio_ms=40), stage="vad", now=10.3)
    f1 = F0.next_epoch()
    assert types(effects) == [
        "input_audio_buffer.speech_started", "response.output_audio.done",
        "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done",
        "conversation.item.truncated", "Cancel"]
    assert effects[-1] == Cancel(f1)
    assert [e.envelope.fence for e in effects[:-1]] == [F0] + [f1] * 7
    assert emitted(effects[-2:-1]) == [ev.ConversationItemTruncated(
        item_id="item_2", content_index=0, audio_end_ms=300)]
    assert core.conversation.get("item_2").text() == "one"
    assert core.metrics.interrupts.get(reason="turn_detected") == 1


def test_spoken_reply_ends_with_the_speech_not_the_text():
    core = manual()
    rid = create_response(core)
    assert types(output(core, TextDelta(rid, "Hi."))) == [
        "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_audio_transcript.delta", "Forward"]
    assert types(output(core, GenerationDone(rid, "stop", 3, 1))) == ["Forward"]
    assert core.shown is not None
    effects = output(core, SpeechDone(rid), stage="tts")
    assert types(effects)[-1] == "response.done"
    assert effects[-1].envelope.event.response["status"] == "completed"
    assert core.shown is None


def test_a_stage_failure_fails_the_reply_and_a_terminal_one_closes_the_session():
    core = manual(output_modalities=("text",))
    create_response(core)
    effects = output(core, StageFailed(DuplexError("stage_failed", "boom")))
    assert types(effects)[0] == "error" and types(effects)[-1] == "response.done"
    assert effects[-1].envelope.event.response["status"] == "failed"
    effects = output(core, StageFailed(DuplexError("engine_dead", "gone")))
    assert types(effects) == ["error", "Close"] and effects[-1] == Close(CloseReason.ENGINE_DEAD)


def test_a_tool_call_is_its_own_output_item_in_the_conversation():
    core = make_core(CascadePolicy(), stages=("vad", "asr", "llm", "tts"), turn_detection=None,
                     output_modalities=("text",))
    rid = create_response(core)
    effects = output(core, ToolCall(rid, "call_1", "weather", '{"city":"Paris"}'))
    assert types(effects) == [
        "response.output_item.added", "conversation.item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "conversation.item.done"]
    done = effects[3].envelope.event
    assert (done.call_id, done.name, done.arguments) == ("call_1", "weather", '{"city":"Paris"}')
    call = core.conversation.last
    assert call.type is ItemType.FUNCTION_CALL and call.call_id == "call_1"


# ---- conversation items -------------------------------------------------------------


def spoken_item(core: SessionCore) -> str:
    rid = create_response(core)
    item_id = core.shown.record.item.id
    output(core, AudioOut(rid, np.zeros(16000, np.int16), text="one two three four"), stage="tts")
    output(core, GenerationDone(rid, "stop"))
    output(core, SpeechDone(rid), stage="tts")
    return item_id


def test_truncate_cuts_an_assistant_audio_item_and_refuses_the_rest():
    core = manual()
    item_id = spoken_item(core)
    assert emitted(core.handle(cmd.ItemTruncate(item_id=item_id, content_index=0,
                                                audio_end_ms=500), 0.0)) == [
        ev.ConversationItemTruncated(item_id=item_id, content_index=0, audio_end_ms=500)]
    assert core.conversation.get(item_id).text() == "one two"
    core.handle(cmd.AudioAppend(audio=TEN_MS * 10), 0.0)
    assert types(core.handle(cmd.AudioCommit(), 0.0))[0] == "input_audio_buffer.committed"
    user = core.conversation.last.id
    for bad, param in [(dict(item_id=item_id, content_index=0, audio_end_ms=900), "audio_end_ms"),
                       (dict(item_id=item_id, content_index=3, audio_end_ms=0), "content_index"),
                       (dict(item_id=user, content_index=0, audio_end_ms=0), "item_id")]:
        [err] = emitted(core.handle(cmd.ItemTruncate(**bad), 0.0))
        assert (err.error.code, err.error.param) == ("invalid_value", param)
    [err] = emitted(core.handle(cmd.ItemTruncate(item_id="nope", content_index=0,
                                                 audio_end_ms=0), 0.0))
    assert err.error.code == "item_not_found"


def test_items_are_created_retrieved_and_deleted():
    core = manual()
    text = ConversationItem("", ItemType.MESSAGE, Role.USER,
                            content=[ContentPart(type="input_text", text="hi")])
    effects = core.handle(cmd.ItemCreate(item=text), 0.0)
    assert types(effects) == ["conversation.item.added", "conversation.item.done"]
    assert core.items[0].id == "item_1"
    dup = dataclasses.replace(text, id="item_1")
    [err] = emitted(core.handle(cmd.ItemCreate(item=dup), 0.0))
    assert (err.error.code, err.error.param) == ("invalid_value", "item.id")
    [got] = emitted(core.handle(cmd.ItemRetrieve(item_id="item_1"), 0.0))
    assert got.item["content"][0]["text"] == "hi"
    assert emitted(core.handle(cmd.ItemDelete(item_id="item_1"), 0.0)) == [
        ev.ConversationItemDeleted(item_id="item_1")]
    assert core.items == ()


def test_an_image_part_is_decoded_by_the_runner_then_seen_by_the_policy():
    core = make_core(CascadePolicy(vision=True), stages=("vad", "asr", "llm", "tts", "vision"),
                     turn_detection=None)
    image = ContentPart(type="input_image", image_url="data:image/png;base64,AAAA")
    item = ConversationItem("", ItemType.MESSAGE, Role.USER, content=[image])
    effects = core.handle(cmd.ItemCreate(item=item, event_id="i1"), 2.5)
    assert types(effects) == ["conversation.item.added", "conversation.item.done", "DecodeImage"]
    assert effects[-1] == DecodeImage(b"\0\0\0", 2500, "image", "i1")
    frame = VideoFrame(np.zeros((2, 2, 3), np.uint8), 2500, "image")
    [submit] = core.handle(FrameDecoded(frame), 2.6)
    assert (submit.stage, submit.payload) == ("vision", frame)


@pytest.mark.parametrize("vision,url,code", [
    (False, "data:image/png;base64,AAAA", "capability_unsupported"),  # no eyes
    (True, "https://example.com/cat.png", None),  # not a data URL: refused by the decoder
])
def test_an_item_with_an_image_that_is_refused_leaves_no_item_behind(vision, url, code):
    stages = ("vad", "asr", "llm", "tts", "vision") if vision else ("vad", "asr", "llm", "tts")
    core = make_core(CascadePolicy(vision=vision), stages=stages, turn_detection=None)
    image = ContentPart(type="input_image", image_url=url)
    item = ConversationItem("", ItemType.MESSAGE, Role.USER,
                            content=[ContentPart(type="input_text", text="what is this?"), image])
    effects = core.handle(cmd.ItemCreate(item=item, event_id="i1"), 1.0)
    [err] = emitted(effects)
    assert err.type == "error" and err.error.event_id == "i1"
    if code is not None:
        assert err.error.code == code
    assert core.items == () and not [e for e in effects if type(e).__name__ == "Submit"]


def test_video_without_a_vision_policy_is_refused_before_any_decoding():
    core = manual()
    [err] = emitted(core.handle(cmd.VideoFrameIn(image=b"x", event_id="v"), 0.0))
    assert (err.error.code, err.error.event_id) == ("capability_unsupported", "v")
    core = make_core(CascadePolicy(vision=True), stages=("vad", "asr", "llm", "tts", "vision"))
    assert core.handle(cmd.VideoChunkIn(data=b"x", container="webm"), 0.0) == [
        FeedVideo(b"x", "webm", None)]
    assert core.handle(cmd.VideoDecoded(), 0.0) == [PollVideo()]


# ---- acks, close, the unknown -------------------------------------------------------


def test_ack_close_and_unknown_messages():
    core = manual()
    assert core.handle(cmd.EventAck(seq=3), 0.0) == [AckEvents(3)]
    effects = core.handle(cmd.SessionClose(), 0.0)
    assert effects == [Emit(ev.Envelope(1, F0, ev.SessionClosed(reason="client"))),
                       Close(CloseReason.CLIENT)]
    [err] = emitted(core.handle(object(), 0.0))
    assert err.error.code == "unknown_event"


def test_a_bug_in_one_command_is_contained():
    core = manual()
    core.policy = None  # type: ignore[assignment]  # any call into it now fails
    [err] = emitted(core.handle(cmd.ResponseCreate(event_id="r"), 0.0))
    assert (err.error.code, err.error.event_id) == ("internal_error", "r")
    assert emitted(core.handle(cmd.AudioClear(), 0.0)) == [ev.InputAudioBufferCleared()]


# ---- with the mailbox: the control lane overtakes -----------------------------------


async def test_cancel_behind_100_queued_appends_is_handled_first():
    core = manual(output_modalities=("text",))
    create_response(core)
    mailbox: Mailbox[object] = Mailbox()
    commands = [cmd.AudioAppend(audio=TEN_MS * 2) for _ in range(100)]
    commands += [cmd.AudioCommit(), cmd.ResponseCancel()]
    for c in commands:
        mailbox.put_nowait(c, lane_of(c))
    handled = []
    while mailbox.qsize():
        _, message = await mailbox.get()
        handled.append(types(core.handle(message, 0.0)))
    assert handled[0][-2:] == ["response.done", "Cancel"]  # the cancel, before any audio
    assert handled[1:101] == [[]] * 100 and handled[101][0] == "input_audio_buffer.committed"
    assert core.conversation.last.content[0].audio_ms == 2000
    assert mailbox.overtaken == 1 and Lane.CONTROL < Lane.DATA


def test_forward_keeps_the_output_whole_and_names_the_stage_it_goes_to():
    core = manual()
    rid = create_response(core)
    out = StageOutput(F0, F0.request_id("llm"), "llm", TextDelta(rid, "Hi"))
    assert core.handle(out, 0.0)[-1] == Forward(out, "tts")
