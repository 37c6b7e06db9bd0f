"""GA fidelity of the session core, effects compared whole.

What real clients depend on (docs/clients.md): a truncate of the item being
generated stops it, a client's truncate after the server's own barge-in cut
is checked against the audio sent, a tool-call response holds only the
call, ``response.create`` sets tools, tool choice, output audio and context
for itself, and the transcription's ``usage``.
"""

from __future__ import annotations

import numpy as np
from support.session_core import TEN_MS, create_response, emitted, make_core, manual, output, types
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.payloads import (
    AudioOut,
    GenerateRequest,
    GenerationDone,
    SpeechDone,
    TextDelta,
    ToolCall,
    TranscriptFinal,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.metrics import STAGE_LATENCIES
from vllm_duplex.session.effects import Emit
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat
from vllm_duplex.models.cascade import CascadePolicy

ONE_SECOND = np.zeros(16000, np.int16)  # "one two three four" at the internal 16 kHz
WEATHER = {"type": "function", "name": "weather"}


def speaking(core, now: float = 0.0) -> str:
    rid = create_response(core, now=now)
    output(core, AudioOut(rid, ONE_SECOND, text="one two three four"), stage="tts", now=now)
    return rid


def test_truncating_the_item_being_generated_stops_it_and_keeps_the_heard_part():
    core = manual()
    speaking(core)
    item_id = core.shown.record.item.id
    effects = core.handle(cmd.ItemTruncate(item_id=item_id, content_index=0, audio_end_ms=500), 1.0)
    assert types(effects) == [
        "conversation.item.truncated", "response.output_audio.done",
        "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done", "Cancel"]
    events = emitted(effects[:-1])
    assert events[2].transcript == "one two"
    assert events[5].item["content"][0]["transcript"] == "one two"
    assert events[6].response["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert core.shown is None and core.fence == effects[-1].fence
    assert core.conversation.get(item_id).text() == "one two"  # the next context's words


def test_a_truncate_after_a_barge_in_may_reach_the_audio_sent():
    """The barge-in cut is an estimate (300 ms of the 1 s sent); the client
    played 301 ms: accepted, and its figure wins. Beyond what was sent is refused."""
    core = make_core()
    speaking(core, now=10.0)
    item_id = core.shown.record.item.id
    output(core, VadSpeechStarted(audio_ms=40), stage="vad", now=10.3)
    assert core.conversation.get(item_id).content[0].audio_ms == 300
    [cut] = emitted(core.handle(cmd.ItemTruncate(item_id=item_id, content_index=0,
                                                 audio_end_ms=301), 10.4))
    assert cut == ev.ConversationItemTruncated(item_id=item_id, content_index=0, audio_end_ms=301)
    [err] = emitted(core.handle(cmd.ItemTruncate(item_id=item_id, content_index=0,
                                                 audio_end_ms=302), 10.5))
    assert (err.error.code, err.error.param) == ("invalid_value", "audio_end_ms")


def test_a_tool_call_response_holds_only_the_call():
    core = make_core(CascadePolicy(), stages=("vad", "asr", "llm", "tts"), turn_detection=None)
    rid = create_response(core)
    output(core, ToolCall(rid, "call_1", "weather", "{}"))
    effects = output(core, GenerationDone(rid, "tool_calls"))
    effects += output(core, SpeechDone(rid), stage="tts")
    [done] = [e for e in emitted([e for e in effects if hasattr(e, "envelope")])
              if e.type == "response.done"]
    assert [i["type"] for i in done.response["output"]] == ["function_call"]
    assert [i.type for i in core.conversation] == [ItemType.FUNCTION_CALL]


def test_words_after_a_call_open_the_message_after_it():
    core = manual(output_modalities=("text",))
    rid = create_response(core)
    output(core, ToolCall(rid, "call_1", "weather", "{}"))
    added = emitted([e for e in output(core, TextDelta(rid, "Sunny.")) if hasattr(e, "envelope")])
    assert added[0].type == "response.output_item.added" and added[0].output_index == 1
    assert added[1].previous_item_id == core.conversation.snapshot()[0].id


def test_a_reply_with_no_words_still_has_its_message():
    core = manual(output_modalities=("text",))
    create_response(core)
    effects = core.handle(cmd.ResponseCancel(), 0.0)
    assert types(effects)[:3] == ["response.output_item.added", "conversation.item.added",
                                  "response.content_part.added"]
    assert [i["type"] for i in emitted(effects[-2:-1])[0].response["output"]] == ["message"]


def submitted(effects) -> GenerateRequest:
    return effects[-1].payload


def test_response_create_sets_its_own_tools_choice_audio_and_context():
    core = manual(tools=(WEATHER,))
    core.handle(cmd.ItemCreate(item=ConversationItem(
        "", ItemType.MESSAGE, Role.USER, content=[ContentPart("input_text", text="hi")])), 0.0)
    pcmu = AudioFormat(AudioEncoding.PCMU, 8000)
    given = ConversationItem("", ItemType.FUNCTION_CALL_OUTPUT, call_id="c", output="sunny")
    effects = core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        tools=(), tool_choice="none", output_format=pcmu, voice="ash", input=(given,))), 0.0)
    req = submitted(effects)
    assert (req.tools, req.tool_choice) == ((), "none")
    assert [m.text for m in req.context] == ["sunny"]  # the input, not the conversation
    created = emitted(effects[:1])[0].response
    assert created["audio"]["output"] == {"format": {"type": "audio/pcmu"}, "voice": "ash"}
    audio = emitted([e for e in output(core, AudioOut(core.shown.id, ONE_SECOND), stage="tts")
                     if hasattr(e, "envelope")])[-1]
    # G.711 at 8 kHz, one byte a sample (the resampler holds back its last few ms)
    assert 7400 <= len(audio.delta) <= 8000 and set(audio.delta) == {0xFF}  # µ-law silence


def test_response_input_may_reference_conversation_items():
    core = manual()
    effects = core.handle(cmd.ItemCreate(item=ConversationItem(
        "", ItemType.MESSAGE, Role.USER, content=[ContentPart("input_text", text="hi")])), 0.0)
    item_id = emitted(effects[:1])[0].item["id"]
    req = submitted(core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        input=(item_id,))), 0.0))
    assert [m.text for m in req.context] == ["hi"]
    core.handle(cmd.ResponseCancel(), 0.0)
    [err] = emitted(core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        input=("nope",))), 0.0))
    assert (err.error.code, err.error.param) == ("item_not_found", "response.input[0].id")
    assert core.shown is None


def test_transcription_completed_carries_its_duration_usage():
    core = manual()
    core.handle(cmd.AudioAppend(audio=TEN_MS * 50), 0.0)
    core.handle(cmd.AudioCommit(), 0.0)
    [done] = emitted(output(core, TranscriptFinal("hello"), stage="asr"))
    assert done.usage["type"] == "duration" and 0.45 <= done.usage["seconds"] <= 0.5


def test_a_tool_choice_that_cannot_be_met_is_refused():
    core = manual()
    for options, param in [(cmd.ResponseOptions(tool_choice="required"), "response.tool_choice"),
                           (cmd.ResponseOptions(tools=(WEATHER,), tool_choice={
                               "type": "function", "name": "other"}), "response.tool_choice")]:
        [err] = emitted(core.handle(cmd.ResponseCreate(options=options), 0.0))
        assert (err.error.code, err.error.param) == ("invalid_value", param)
        assert core.shown is None
    req = submitted(core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(
        tools=(WEATHER,), tool_choice={"type": "function", "name": "weather"})), 0.0))
    assert req.must_call and req.callable_tools() == (WEATHER,)


# ---- per-stage latency (issue 14 item 7) -------------------------------------------------


def test_a_turn_s_stage_latencies_reach_metrics_and_response_done():
    """100 ms chunks arrive at 0.1 s .. 1.0 s; each figure is measured from
    the arrival of the audio it is about (or the stage before) on the core's clock."""
    core = make_core()
    for i in range(10):
        t = 0.1 * (i + 1)
        core.handle(cmd.AudioAppend(audio=TEN_MS * 10), t, received_at=t)
    output(core, VadSpeechStarted(audio_ms=150), stage="vad", now=1.05)  # audio of 0.2 s
    effects = output(core, VadSpeechStopped(audio_ms=750), stage="vad", now=1.2)  # of 0.8 s
    assert "response.created" in types(effects)
    rid = core.shown.id
    output(core, TranscriptFinal("hello"), stage="asr", now=1.3)
    output(core, TextDelta(rid, "Hi."), now=1.5)
    output(core, AudioOut(rid, ONE_SECOND, text="Hi."), stage="tts", now=1.6)
    output(core, GenerationDone(rid, "stop"), now=1.7)
    [done] = [e.envelope.event for e in output(core, SpeechDone(rid), stage="tts", now=2.0)
              if isinstance(e, Emit) and e.envelope.event.type == "response.done"]
    path = {"vad": 400, "decision": 0, "release": 0, "llm_request": 0, "llm_first": 300,
            "llm_phrase": 0, "tts": 100, "pacing": 0}
    assert done.response["metadata"] == {
        "duplex_vad_onset_ms": "850", "duplex_end_of_turn_ms": "400", "duplex_asr_final_ms": "100",
        "duplex_llm_ttft_ms": "300", "duplex_tts_first_audio_ms": "100", "duplex_turn_gap_ms": "800",
        # what the gap waited on: the VAD's silence, then the LLM's first token, then the TTS
        # (the final transcript came meanwhile, off the path)
        "duplex_critical_path": ", ".join(f"{k} {v}" for k, v in path.items()),
        "duplex_first_phrase_tokens_ms": "0"}
    assert sum(path.values()) == 800  # the path adds up to the turn gap
    assert core.metrics.critical_path.count(segment="llm_first") == 1
    hist = core.metrics.stage_latency
    assert all(hist.count(stage=s) == 1 for s in STAGE_LATENCIES)
    text = core.metrics.render()
    assert 'duplex_turn_latency_seconds_bucket{stage="turn_gap",le="1.0"} 1' in text
    assert 'duplex_turn_latency_seconds_bucket{stage="turn_gap",le="0.75"} 0' in text


def test_a_response_without_a_turn_has_no_turn_figures_and_keeps_the_client_metadata():
    core = manual(output_modalities=("text",))
    core.handle(cmd.ResponseCreate(options=cmd.ResponseOptions(metadata={"k": "v"})), 0.0)
    rid = core.shown.id
    output(core, TextDelta(rid, "Hi."), now=0.25)
    [done] = [e.envelope.event for e in output(core, GenerationDone(rid, "stop"), now=0.5)
              if isinstance(e, Emit) and e.envelope.event.type == "response.done"]
    assert done.response["metadata"] == {"k": "v", "duplex_llm_ttft_ms": "250"}
    assert core.metrics.stage_latency.count(stage="turn_gap") == 0
    assert 'duplex_turn_latency_seconds_count{stage="turn_gap"} 0' in core.metrics.render()
