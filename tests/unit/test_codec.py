"""The Realtime wire codec (``realtime/wire``), without sockets: client frames
parsed into typed commands or typed errors, server events rendered as JSON (GA
and beta names), and what the official SDK sends and expects."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.audio import b64
from vllm_duplex.domain.commands import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    DuplexInput,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ResponseCancel,
    ResponseCreate,
    ResponseOptions,
    SessionClose,
    SessionUpdate,
)
from vllm_duplex.domain.contracts import InputMode
from vllm_duplex.domain.conversation import (
    ContentPart,
    ConversationItem,
    ItemType,
    Response,
    ResponseStatus,
    Role,
)
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import (
    ContentPartAdded,
    ConversationItemAdded,
    ConversationItemDone,
    Envelope,
    ErrorEvent,
    InputAudioBufferCleared,
    OutputAudioDelta,
    OutputAudioTranscriptDelta,
    OutputTextDelta,
    ResponseCreated,
    ResponseDone,
    SessionCreated,
    SessionUpdated,
)
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import (
    AudioEncoding,
    AudioFormat,
    SessionConfig,
    SessionPatch,
    SessionType,
    Tracing,
    Transcription,
    TurnDetection,
    session_wire,
)
from vllm_duplex.realtime.wire.codec import CLIENT_EVENT_TYPES, Dialect, RealtimeCodec

codec = RealtimeCodec()
FENCE = Fence("sess_1", 2, 5)


def parse(obj: Any, c: RealtimeCodec = codec):
    return c.parse(json.dumps(obj))


def fails(obj: Any, code: str, param: str | None = None, event_id: str | None = None) -> DuplexError:
    frame = obj if isinstance(obj, (str, bytes)) else json.dumps(obj)
    with pytest.raises(DuplexError) as ei:
        codec.parse(frame)
    err = ei.value
    assert (err.code, err.param, err.event_id) == (code, param, event_id), repr(err)
    return err


def fields(patch: SessionPatch) -> dict[str, Any]:
    return patch.fields_set()


# ---- parse: session.update -------------------------------------------------------


class TestSessionUpdate:
    def test_ga_shape(self) -> None:
        cmd = parse({
            "type": "session.update",
            "event_id": "evt_1",
            "session": {
                "type": "realtime",
                "model": "m",
                "instructions": "be brief",
                "output_modalities": ["text"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 16000},
                        "transcription": {"model": "asr", "prompt": "Paris"},
                        "turn_detection": {
                            "type": "server_vad", "threshold": 0.7, "prefix_padding_ms": 100,
                            "silence_duration_ms": 250, "create_response": False,
                            "interrupt_response": False, "idle_timeout_ms": 5000,
                        },
                        "noise_reduction": {"type": "near_field"},
                    },
                    "output": {"format": {"type": "audio/pcmu"}, "voice": "alloy", "speed": 1.0},
                },
                "tools": [{"type": "function", "name": "f", "description": "d",
                           "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "f"},
                "max_output_tokens": 200,
                "temperature": 0.9,
                "tracing": "auto",
            },
        })
        assert isinstance(cmd, SessionUpdate) and cmd.event_id == "evt_1"
        assert fields(cmd.patch) == {
            "type": SessionType.REALTIME,
            "model": "m",
            "instructions": "be brief",
            "output_modalities": ("text",),
            "input_format": AudioFormat(AudioEncoding.PCM16, 16000),
            "transcription": Transcription(model="asr", language=None, prompt="Paris"),
            "turn_detection": TurnDetection("server_vad", 0.7, 100, 250, False, False, 5000),
            "noise_reduction": "near_field",
            "output_format": AudioFormat(AudioEncoding.PCMU, 8000),
            "voice": "alloy",
            "speed": 1.0,
            "tools": ({"type": "function", "name": "f", "description": "d",
                       "parameters": {"type": "object"}},),
            "tool_choice": {"type": "function", "name": "f"},
            "max_output_tokens": 200,
            "temperature": 0.9,
            "tracing": Tracing(),
        }

    def test_beta_shape(self) -> None:
        cmd = parse({
            "type": "session.update",
            "session": {
                "modalities": ["audio", "text"],
                "voice": "verse",
                "input_audio_format": "g711_alaw",
                "output_audio_format": "pcm16",
                "input_audio_transcription": {"model": "whisper-1"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 800},
                "max_response_output_tokens": "inf",
                "temperature": 0.6,
                "input_audio_noise_reduction": None,
            },
        })
        assert fields(cmd.patch) == {
            "output_modalities": ("audio", "text"),
            "voice": "verse",
            "input_format": AudioFormat(AudioEncoding.PCMA, 8000),
            "output_format": AudioFormat(AudioEncoding.PCM16, 24000),
            "transcription": Transcription(model="whisper-1"),
            "turn_detection": TurnDetection(silence_duration_ms=800),
            "noise_reduction": None,  # off
            "max_output_tokens": None,  # "inf"
            "temperature": 0.6,
        }

    def test_ga_wins_over_beta_alias(self) -> None:
        cmd = parse({"type": "session.update", "session": {
            "voice": "beta", "audio": {"output": {"voice": "ga"}},
            "modalities": ["audio"], "output_modalities": ["text"]}})
        assert fields(cmd.patch) == {"voice": "ga", "output_modalities": ("text",)}

    def test_nulls(self) -> None:
        cmd = parse({"type": "session.update", "session": {
            "instructions": None, "audio": {"input": {"turn_detection": None, "transcription": None},
                                            "output": None}}})
        assert fields(cmd.patch) == {"turn_detection": None, "transcription": None}

    def test_empty_session_is_an_empty_patch(self) -> None:
        assert fields(parse({"type": "session.update", "session": {}}).patch) == {}

    @pytest.mark.parametrize(("fmt", "expected"), [
        ({"type": "audio/pcm"}, AudioFormat(AudioEncoding.PCM16, 24000)),
        ({"type": "audio/pcm", "rate": 8000}, AudioFormat(AudioEncoding.PCM16, 8000)),
        ({"type": "audio/pcm", "rate": 48000}, AudioFormat(AudioEncoding.PCM16, 48000)),
        ({"type": "audio/pcma"}, AudioFormat(AudioEncoding.PCMA, 8000)),
        ("g711_ulaw", AudioFormat(AudioEncoding.PCMU, 8000)),
    ])
    def test_audio_formats(self, fmt: Any, expected: AudioFormat) -> None:
        cmd = parse({"type": "session.update", "session": {"audio": {"input": {"format": fmt}}}})
        assert cmd.patch.input_format == expected

    def test_tool_choice_strings_and_defaults(self) -> None:
        cmd = parse({"type": "session.update", "session": {
            "tools": [{"name": "g"}], "tool_choice": "required", "max_output_tokens": 1}})
        assert fields(cmd.patch) == {"tools": ({"type": "function", "name": "g"},),
                                     "tool_choice": "required", "max_output_tokens": 1}

    def test_voice_object_and_policy_extension(self) -> None:
        cmd = parse({"type": "session.update", "session": {
            "policy": "cascade", "audio": {"output": {"voice": {"id": "voice_1"}}}}})
        assert fields(cmd.patch) == {"policy": "cascade", "voice": "voice_1"}


# ---- parse: the other client events -------------------------------------------------


class TestClientDefaults:
    """What real clients send by default (LiveKit Agents, the OpenAI Agents SDK:
    ``semantic_vad``; every client: its own model name) is understood, never refused."""

    @pytest.mark.parametrize("eagerness", [None, "auto", "medium", "high", "low"])
    def test_semantic_vad_is_parsed_with_its_eagerness(self, eagerness) -> None:
        td = {"type": "semantic_vad", "create_response": True, "interrupt_response": False}
        if eagerness is not None:
            td["eagerness"] = eagerness
        for session in ({"audio": {"input": {"turn_detection": td}}}, {"turn_detection": td}):
            patch = parse(su(session)).patch
            assert patch.turn_detection == TurnDetection(
                "semantic_vad", eagerness=eagerness or "auto", create_response=True,
                interrupt_response=False)

    def test_semantic_vad_keeps_the_rest_of_the_update(self) -> None:
        patch = parse(su({"instructions": "hi", "audio": {
            "input": {"turn_detection": {"type": "semantic_vad"}},
            "output": {"voice": "marin"}}})).patch
        assert (patch.instructions, patch.voice) == ("hi", "marin")
        assert patch.turn_detection.type == "semantic_vad"

    @pytest.mark.parametrize(("field", "value"), [
        ("silence_duration_ms", -1), ("silence_duration_ms", 10_001), ("silence_duration_ms", 1.5),
        ("prefix_padding_ms", 86_400_000), ("idle_timeout_ms", 10**9)])
    def test_absurd_durations_are_refused_naming_the_field(self, field, value) -> None:
        fails(su({"audio": {"input": {"turn_detection": {"type": "server_vad", field: value}}}}),
              "invalid_value", f"{TD}.{field}", "e")

    @pytest.mark.parametrize("eagerness", ["eager", 1, True])
    def test_semantic_vad_bad_eagerness(self, eagerness) -> None:
        fails(su({"audio": {"input": {"turn_detection": {"type": "semantic_vad",
                                                          "eagerness": eagerness}}}}),
              "invalid_value", f"{TD}.eagerness", "e")
        fails(su({"audio": {"input": {"turn_detection": {"type": "semantic_vad",
                                                          "create_response": "yes"}}}}),
              "invalid_value", f"{TD}.create_response", "e")

    def test_model_aliases_mean_the_served_model(self) -> None:
        c = RealtimeCodec(model_aliases={"gpt-realtime": "duplex-scripted",
                                         "duplex-scripted": "duplex-scripted"})
        assert parse(su({"model": "gpt-realtime"}), c).patch.model == "duplex-scripted"
        assert parse(su({"model": "duplex-scripted"}), c).patch.model == "duplex-scripted"
        # another name is passed on as sent: the session refuses the change (immutable_field)
        assert parse(su({"model": "gpt-4o"}), c).patch.model == "gpt-4o"
        assert fields(parse(su({"instructions": "x"}), c).patch) == {"instructions": "x"}


class TestClientEvents:
    def test_append(self) -> None:
        assert parse({"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02\x03"),
                      "event_id": "a"}) == AudioAppend(audio=b"\x01\x02\x03", event_id="a")
        assert parse({"type": "input_audio_buffer.append", "audio": "", "seq": 7}) == AudioAppend(
            audio=b"", seq=7)

    def test_buffer_commands(self) -> None:
        assert parse({"type": "input_audio_buffer.commit"}) == AudioCommit()
        assert parse({"type": "input_audio_buffer.clear", "event_id": "x"}) == AudioClear(event_id="x")

    def test_item_create_user_message(self) -> None:
        cmd = parse({"type": "conversation.item.create", "previous_item_id": "item_0", "item": {
            "id": "item_1", "type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "hi"},
                {"type": "input_audio", "audio": b64(b"\0\0"), "transcript": "hm"},
            ]}})
        assert cmd == ItemCreate(previous_item_id="item_0", item=ConversationItem(
            id="item_1", type=ItemType.MESSAGE, role=Role.USER, content=[
                ContentPart("input_text", text="hi"), ContentPart("input_audio", transcript="hm")]))

    def test_item_create_assistant_with_beta_parts(self) -> None:
        cmd = parse({"type": "conversation.item.create", "item": {
            "type": "message", "role": "assistant", "content": [
                {"type": "text", "text": "a"}, {"type": "output_text", "text": "b"},
                {"type": "audio", "transcript": "c"}, {"type": "output_audio"}]}})
        assert cmd.item.id == ""
        assert cmd.item.content == [
            ContentPart("output_text", text="a"), ContentPart("output_text", text="b"),
            ContentPart("output_audio", transcript="c"), ContentPart("output_audio")]

    def test_item_create_system_and_functions(self) -> None:
        sys_item = parse({"type": "conversation.item.create", "item": {
            "type": "message", "role": "system", "content": [{"type": "input_text", "text": "rules"}]}}).item
        assert sys_item.role is Role.SYSTEM and sys_item.text() == "rules"
        call = parse({"type": "conversation.item.create", "item": {
            "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}}).item
        assert call == ConversationItem(id="", type=ItemType.FUNCTION_CALL, call_id="c1", name="f",
                                        arguments="{}")
        out = parse({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": "c1", "output": "42"}}).item
        assert out == ConversationItem(id="", type=ItemType.FUNCTION_CALL_OUTPUT, call_id="c1",
                                       output="42")

    def test_item_retrieve_delete_truncate(self) -> None:
        assert parse({"type": "conversation.item.retrieve", "item_id": "i"}) == ItemRetrieve(item_id="i")
        assert parse({"type": "conversation.item.delete", "item_id": "i"}) == ItemDelete(item_id="i")
        assert parse({"type": "conversation.item.truncate", "item_id": "i", "content_index": 0,
                      "audio_end_ms": 1500}) == ItemTruncate(item_id="i", content_index=0,
                                                             audio_end_ms=1500)

    def test_response_create(self) -> None:
        assert parse({"type": "response.create"}) == ResponseCreate()
        assert parse({"type": "response.create", "response": None}) == ResponseCreate()
        ga = parse({"type": "response.create", "event_id": "r", "response": {
            "output_modalities": ["text"], "instructions": "x", "max_output_tokens": 5,
            "metadata": {"k": "v"}, "conversation": "none", "tools": []}})
        assert ga == ResponseCreate(event_id="r", options=ResponseOptions(
            output_modalities=("text",), instructions="x", max_output_tokens=5,
            metadata={"k": "v"}, conversation="none", tools=()))
        beta = parse({"type": "response.create", "response": {
            "modalities": ["audio", "text"], "max_response_output_tokens": "inf"}})
        assert beta.options == ResponseOptions(output_modalities=("audio", "text"))

    def test_response_cancel(self) -> None:
        assert parse({"type": "response.cancel"}) == ResponseCancel()
        assert parse({"type": "response.cancel", "response_id": "resp_1"}) == ResponseCancel(
            response_id="resp_1")
        assert ResponseCancel.urgent and not AudioAppend.urgent  # control overtakes data

    def test_extensions(self) -> None:
        assert parse({"type": "duplex.input", "mode": "append_tokens", "text": "hi"}) == DuplexInput(
            mode=InputMode.APPEND_TOKENS, text="hi")
        assert parse({"type": "duplex.input", "mode": "rollback_to_checkpoint", "checkpoint": "c",
                      "audio": b64(b"ab")}) == DuplexInput(
            mode=InputMode.ROLLBACK_TO_CHECKPOINT, checkpoint="c", audio=b"ab")
        assert parse({"type": "session.close", "event_id": "z"}) == SessionClose(reason="client",
                                                                                event_id="z")

    def test_bytes_frames_and_unknown_fields(self) -> None:
        frame = json.dumps({"type": "input_audio_buffer.commit", "whatever": [1, {"x": None}]})
        assert codec.parse(frame.encode()) == AudioCommit()
        assert codec.parse(bytearray(frame.encode())) == AudioCommit()


# ---- parse: errors ---------------------------------------------------------------


def su(session: Any) -> dict[str, Any]:
    return {"type": "session.update", "event_id": "e", "session": session}


TD = "session.audio.input.turn_detection"

INVALID_VALUE_CASES = [
    (su(None), "session"),
    (su([]), "session"),
    (su({"type": "translation"}), "session.type"),
    (su({"model": 5}), "session.model"),
    (su({"instructions": ["x"]}), "session.instructions"),
    (su({"output_modalities": []}), "session.output_modalities"),
    (su({"audio": {"input": {"noise_reduction": "near_field"}}}), "session.audio.input.noise_reduction"),
    (su({"audio": {"input": {"noise_reduction": {"type": "studio"}}}}),
     "session.audio.input.noise_reduction.type"),
    (su({"input_audio_noise_reduction": {}}), "session.input_audio_noise_reduction.type"),
    (su({"audio": {"input": {"echo_cancellation": True}}}), "session.audio.input.echo_cancellation"),
    (su({"audio": {"input": {"echo_cancellation": {"type": "client"}}}}),
     "session.audio.input.echo_cancellation.type"),
    (su({"audio": {"input": {"echo_cancellation": {"type": "server", "delay_ms": 100}}}}),
     "session.audio.input.echo_cancellation.delay_ms"),
    (su({"output_modalities": ["video"]}), "session.output_modalities"),
    (su({"modalities": "audio"}), "session.modalities"),
    (su({"audio": "x"}), "session.audio"),
    (su({"audio": {"input": 3}}), "session.audio.input"),
    (su({"audio": {"input": {"format": {"type": "audio/pcm", "rate": "24000"}}}}),
     "session.audio.input.format.rate"),
    (su({"audio": {"input": {"format": 16000}}}), "session.audio.input.format"),
    (su({"audio": {"input": {"transcription": "on"}}}), "session.audio.input.transcription"),
    (su({"audio": {"input": {"transcription": {"language": 1}}}}),
     "session.audio.input.transcription.language"),
    (su({"audio": {"input": {"turn_detection": {"silence_duration_ms": -1}}}}), f"{TD}.silence_duration_ms"),
    (su({"audio": {"input": {"turn_detection": {"silence_duration_ms": 1.5}}}}), f"{TD}.silence_duration_ms"),
    (su({"audio": {"input": {"turn_detection": {"prefix_padding_ms": True}}}}), f"{TD}.prefix_padding_ms"),
    (su({"audio": {"input": {"turn_detection": {"threshold": 1.5}}}}), f"{TD}.threshold"),
    (su({"audio": {"input": {"turn_detection": {"threshold": "high"}}}}), f"{TD}.threshold"),
    (su({"audio": {"input": {"turn_detection": {"create_response": 1}}}}), f"{TD}.create_response"),
    (su({"audio": {"input": {"turn_detection": {"interrupt_response": "no"}}}}),
     f"{TD}.interrupt_response"),
    (su({"audio": {"input": {"turn_detection": {"idle_timeout_ms": "1s"}}}}), f"{TD}.idle_timeout_ms"),
    (su({"audio": {"input": {"turn_detection": {"type": 1}}}}), f"{TD}.type"),
    (su({"audio": {"input": {"turn_detection": []}}}), TD),
    (su({"turn_detection": {"threshold": -0.1}}), "session.turn_detection.threshold"),
    (su({"audio": {"output": {"speed": 2}}}), "session.audio.output.speed"),
    (su({"speed": 0.1}), "session.speed"),
    (su({"audio": {"output": {"voice": 3}}}), "session.audio.output.voice"),
    (su({"voice": {"name": "x"}}), "session.voice.id"),
    (su({"tools": {}}), "session.tools"),
    (su({"tools": [{"name": "a"}, {"name": "a"}]}), "session.tools[1].name"),
    (su({"tools": [{"description": "no name"}]}), "session.tools[0].name"),
    (su({"tools": [{"name": "get weather"}]}), "session.tools[0].name"),
    (su({"tools": [{"name": "a", "parameters": "{}"}]}), "session.tools[0].parameters"),
    (su({"tool_choice": "sometimes"}), "session.tool_choice"),
    (su({"tool_choice": {"type": "function"}}), "session.tool_choice.name"),
    (su({"max_output_tokens": 0}), "session.max_output_tokens"),
    (su({"max_output_tokens": "lots"}), "session.max_output_tokens"),
    (su({"max_response_output_tokens": 1.5}), "session.max_response_output_tokens"),
    (su({"temperature": 3}), "session.temperature"),
    ({"type": "input_audio_buffer.append", "event_id": "e"}, "audio"),
    ({"type": "input_audio_buffer.append", "event_id": "e", "audio": 12}, "audio"),
    ({"type": "input_audio_buffer.append", "event_id": "e", "audio": "", "seq": -1}, "seq"),
    ({"type": "input_audio_buffer.append", "event_id": "e", "audio": "", "seq": "1"}, "seq"),
    ({"type": "conversation.item.create", "event_id": "e"}, "item"),
    ({"type": "conversation.item.create", "event_id": "e", "item": {"type": "reasoning"}}, "item.type"),
    ({"type": "conversation.item.create", "event_id": "e", "item": {"role": "robot"}}, "item.role"),
    ({"type": "conversation.item.create", "event_id": "e", "item": {"role": "user", "content": "hi"}},
     "item.content"),
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"role": "user", "content": [{"type": "output_text", "text": "x"}]}}, "item.content[0].type"),
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"role": "system", "content": [{"type": "input_audio"}]}}, "item.content[0].type"),
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}},
     "item.content[0].image_url"),  # a data: URL only (the server fetches nothing)
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}},
     "item.content[0].type"),
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"role": "user", "content": [{"type": "input_text", "text": 1}]}}, "item.content[0].text"),
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"role": "user", "content": ["hi"]}}, "item.content[0]"),
    ({"type": "conversation.item.create", "event_id": "e", "item": {"id": 3, "role": "user"}}, "item.id"),
    ({"type": "conversation.item.create", "event_id": "e", "item": {"type": "function_call"}}, "item.name"),
    ({"type": "conversation.item.create", "event_id": "e",
      "item": {"type": "function_call_output", "call_id": "c"}}, "item.output"),
    ({"type": "conversation.item.create", "event_id": "e", "previous_item_id": 1,
      "item": {"role": "user"}}, "previous_item_id"),
    ({"type": "conversation.item.retrieve", "event_id": "e"}, "item_id"),
    ({"type": "conversation.item.delete", "event_id": "e", "item_id": 5}, "item_id"),
    ({"type": "conversation.item.truncate", "event_id": "e", "item_id": "i", "content_index": 0},
     "audio_end_ms"),
    ({"type": "conversation.item.truncate", "event_id": "e", "item_id": "i", "content_index": -1,
      "audio_end_ms": 0}, "content_index"),
    ({"type": "response.create", "event_id": "e", "response": "now"}, "response"),
    ({"type": "response.create", "event_id": "e", "response": {"conversation": 1}},
     "response.conversation"),
    ({"type": "response.create", "event_id": "e", "response": {"modalities": []}}, "response.modalities"),
    ({"type": "response.create", "event_id": "e", "response": {"max_output_tokens": -5}},
     "response.max_output_tokens"),
    ({"type": "response.create", "event_id": "e", "response": {"metadata": {"k": 1}}},
     "response.metadata.k"),
    ({"type": "response.create", "event_id": "e", "response": {"instructions": 1}},
     "response.instructions"),
    ({"type": "response.cancel", "event_id": "e", "response_id": 1}, "response_id"),
    ({"type": "duplex.input", "event_id": "e", "mode": "telepathy"}, "mode"),
    ({"type": "duplex.input", "event_id": "e"}, "mode"),
    ({"type": "duplex.input", "event_id": "e", "mode": "append_tokens", "text": 1}, "text"),
]


class TestErrors:
    @pytest.mark.parametrize(("obj", "param"), INVALID_VALUE_CASES)
    def test_invalid_value(self, obj: dict[str, Any], param: str) -> None:
        fails(obj, "invalid_value", param, "e")

    @pytest.mark.parametrize(("fmt", "param"), [
        ({"type": "audio/opus"}, "session.audio.input.format.type"),
        ({"type": "audio/pcm", "rate": 96000}, "session.audio.input.format.rate"),
        ({"type": "audio/pcm", "rate": 7999}, "session.audio.input.format.rate"),
        ({"type": "audio/pcmu", "rate": 16000}, "session.audio.input.format.rate"),
        ("mp3", "session.audio.input.format"),
    ])
    def test_unsupported_audio_format(self, fmt: Any, param: str) -> None:
        fails(su({"audio": {"input": {"format": fmt}}}), "unsupported_audio_format", param, "e")

    def test_unsupported_output_and_beta_formats(self) -> None:
        fails(su({"audio": {"output": {"format": {"type": "audio/mp3"}}}}), "unsupported_audio_format",
              "session.audio.output.format.type", "e")
        fails(su({"input_audio_format": "pcm24"}), "unsupported_audio_format",
              "session.input_audio_format", "e")

    @pytest.mark.parametrize("kind", ["foo", "none", ""])
    def test_unsupported_turn_detection(self, kind: str) -> None:
        fails(su({"audio": {"input": {"turn_detection": {"type": kind}}}}), "unsupported_turn_detection",
              f"{TD}.type", "e")
        fails(su({"turn_detection": {"type": kind}}), "unsupported_turn_detection",
              "session.turn_detection.type", "e")

    @pytest.mark.parametrize("audio", ["not base64!", "AAA", "AA==AA==", "é", "AAAA\n"])
    def test_invalid_audio(self, audio: str) -> None:
        fails({"type": "input_audio_buffer.append", "event_id": "e", "audio": audio}, "invalid_audio",
              "audio", "e")

    def test_invalid_audio_in_items_and_duplex_input(self) -> None:
        fails({"type": "conversation.item.create", "event_id": "e", "item": {
            "role": "user", "content": [{"type": "input_audio", "audio": "!!"}]}},
            "invalid_audio", "item.content[0].audio", "e")
        fails({"type": "duplex.input", "event_id": "e", "mode": "append_audio_chunk", "audio": "%"},
              "invalid_audio", "audio", "e")

    @pytest.mark.parametrize("frame", ["{", "", "nope", '{"type": "x",}', "[1,", '{"a": NaN}',
                                       '{"a": Infinity}', "[" * 100_000 + "]" * 100_000])
    def test_invalid_json(self, frame: str) -> None:
        fails(frame, "invalid_json")

    def test_bad_utf8_is_invalid_json(self) -> None:
        fails(b'{"type": "\xff"}', "invalid_json")

    @pytest.mark.parametrize("obj", ["[]", "1", '"s"', "null", '[{"type": "session.update"}]'])
    def test_non_object_is_invalid_event(self, obj: Any) -> None:
        fails(obj, "invalid_event")

    def test_missing_or_bad_type_is_invalid_event_with_event_id(self) -> None:
        fails({"event_id": "e1"}, "invalid_event", "type", "e1")
        fails({"event_id": "e2", "type": 3}, "invalid_event", "type", "e2")

    def test_unknown_event_echoes_event_id(self) -> None:
        err = fails({"type": "response.explode", "event_id": "evt_9"}, "unknown_event", "type", "evt_9")
        assert err.to_wire()["event_id"] == "evt_9"

    def test_non_string_event_id(self) -> None:
        fails({"type": "input_audio_buffer.commit", "event_id": 5}, "invalid_value", "event_id")

    def test_oversized_frame_rejected_before_parsing(self) -> None:
        junk = "x" * (2 << 20)  # 2 MiB of non-JSON
        fails(junk, "event_too_large")
        fails(junk.encode(), "event_too_large")

    def test_size_limit_counts_utf8_bytes(self) -> None:
        small = RealtimeCodec(max_event_bytes=64)
        frame = json.dumps({"type": "input_audio_buffer.commit", "pad": "é" * 10}, ensure_ascii=False)
        assert len(frame) <= 64 < len(frame.encode())
        with pytest.raises(DuplexError) as ei:
            small.parse(frame)
        assert ei.value.code == "event_too_large"
        exact = '{"type":"input_audio_buffer.commit"}'
        assert RealtimeCodec(max_event_bytes=len(exact)).parse(exact) == AudioCommit()
        with pytest.raises(DuplexError):
            RealtimeCodec(max_event_bytes=len(exact) - 1).parse(exact)

    def test_error_shape_on_the_wire(self) -> None:
        err = fails({"type": "nope", "event_id": "c1"}, "unknown_event", "type", "c1")
        out = json.loads(codec.render_error(err))
        assert list(out) == ["type", "event_id", "error"]
        assert out["type"] == "error" and out["event_id"].startswith("event_")
        assert out["error"] == {"type": "invalid_request_error", "code": "unknown_event",
                                "message": "unknown event type 'nope'", "param": "type",
                                "event_id": "c1", "retryable": False}


# ---- render -----------------------------------------------------------------------


def env(event: Any, seq: int = 1) -> Envelope:
    return Envelope(seq=seq, fence=FENCE, event=event)


def session_dict(model: str = "duplex-test", **kw: Any) -> dict[str, Any]:
    cfg = SessionConfig(model=model, policy="scripted", transcription=Transcription(), **kw)
    return session_wire(cfg, session_id="sess_1", extra={"policy": "scripted", "fence": FENCE.wire()})


def response_dict(status: ResponseStatus = ResponseStatus.COMPLETED) -> dict[str, Any]:
    item = ConversationItem(id="item_2", type=ItemType.MESSAGE, role=Role.ASSISTANT,
                            content=[ContentPart("output_audio", transcript="Hello.")])
    r = Response(id="resp_1", conversation_id="conv_1", output_modalities=("audio",),
                 output_format={"type": "audio/pcm", "rate": 24000}, voice="alloy",
                 status=status, output=[item], input_tokens=3, output_tokens=4)
    if status is ResponseStatus.CANCELLED:
        r.status_details = {"type": "cancelled", "reason": "client_cancelled"}
    return r.wire()


AUDIO = OutputAudioDelta(response_id="resp_1", item_id="item_2", output_index=0, content_index=0,
                         delta=b"\x00\x01\xff")


class TestRender:
    def test_audio_delta_byte_exact(self) -> None:
        c = RealtimeCodec()
        text = c.render(env(AUDIO, seq=7))
        eid = json.loads(text)["event_id"]
        assert text == (
            '{"type":"response.output_audio.delta","event_id":"' + eid + '",'
            '"response_id":"resp_1","item_id":"item_2","output_index":0,"content_index":0,'
            '"delta":"AAH/","seq":7,"metadata":{"fence":{"incarnation":2,"epoch":5}}}'
        )

    def test_event_ids_are_unique(self) -> None:
        c1, c2 = RealtimeCodec(), RealtimeCodec()
        ids = [json.loads(c.render(env(InputAudioBufferCleared())))["event_id"]
               for c in (c1, c2) for _ in range(50)]
        ids.append(json.loads(c1.render_error(DuplexError("invalid_json", "x")))["event_id"])
        assert len(set(ids)) == len(ids)

    def test_error_event(self) -> None:
        err = DuplexError("input_audio_buffer_empty", "buffer is empty", event_id="c7")
        out = json.loads(codec.render(env(ErrorEvent(error=err), seq=3)))
        assert out["error"] == {"type": "invalid_request_error", "code": "input_audio_buffer_empty",
                                "message": "buffer is empty", "param": None, "event_id": "c7",
                                "retryable": False}
        assert out["seq"] == 3 and out["metadata"] == {"fence": {"incarnation": 2, "epoch": 5}}

    def test_session_created_carries_resume_token(self) -> None:
        sess = session_dict()
        out = json.loads(codec.render(env(SessionCreated(session=sess, resume_token="rt_1"))))
        assert out["type"] == "session.created"
        assert out["resume_token"] == "rt_1"
        assert out["session"] == sess

    def test_render_error_has_no_seq(self) -> None:
        out = json.loads(codec.render_error(DuplexError("event_too_large", "too big")))
        assert "seq" not in out and "metadata" not in out
        assert out["error"]["code"] == "event_too_large"

    def test_non_ascii_and_lone_surrogates_are_escaped(self) -> None:
        text = codec.render(env(OutputTextDelta(response_id="r", item_id="i", output_index=0,
                                                content_index=0, delta="héllo \ud800")))
        text.encode("utf-8")  # always encodable
        assert json.loads(text)["delta"] == "héllo \ud800"

    @pytest.mark.parametrize(("event", "ga", "beta"), [
        (AUDIO, "response.output_audio.delta", "response.audio.delta"),
        (OutputAudioTranscriptDelta(response_id="r", item_id="i", output_index=0, content_index=0,
                                    delta="x"),
         "response.output_audio_transcript.delta", "response.audio_transcript.delta"),
        (OutputTextDelta(response_id="r", item_id="i", output_index=0, content_index=0, delta="x"),
         "response.output_text.delta", "response.text.delta"),
        (ConversationItemAdded(item={"id": "i"}, previous_item_id=None),
         "conversation.item.added", "conversation.item.created"),
        (InputAudioBufferCleared(), "input_audio_buffer.cleared", "input_audio_buffer.cleared"),
    ])
    def test_beta_renames(self, event: Any, ga: str, beta: str) -> None:
        assert json.loads(RealtimeCodec().render(env(event)))["type"] == ga
        assert json.loads(RealtimeCodec(dialect=Dialect.BETA).render(env(event)))["type"] == beta

    def test_item_done_has_no_beta_equivalent(self) -> None:
        ev = ConversationItemDone(item={"id": "i"}, previous_item_id=None)
        assert RealtimeCodec(dialect=Dialect.BETA).render(env(ev)) is None
        assert json.loads(RealtimeCodec().render(env(ev)))["type"] == "conversation.item.done"

    def test_beta_session_shape(self) -> None:
        sess = session_dict(input_format=AudioFormat(AudioEncoding.PCMU, 8000),
                            output_modalities=("text",), max_output_tokens=50)
        snapshot = json.dumps(sess)
        out = json.loads(RealtimeCodec(dialect=Dialect.BETA).render(env(SessionUpdated(session=sess))))
        s = out["session"]
        assert json.dumps(sess) == snapshot  # the journaled snapshot is not mutated
        assert s["modalities"] == ["text"]
        assert s["input_audio_format"] == "g711_ulaw" and s["output_audio_format"] == "pcm16"
        assert s["voice"] == "default" and s["max_response_output_tokens"] == 50
        assert s["turn_detection"]["type"] == "server_vad"
        assert s["input_audio_transcription"] == {"model": "default", "language": None, "prompt": None}
        assert s["id"] == "sess_1" and s["fence"] == FENCE.wire() and s["temperature"] == 0.8
        assert not {"audio", "output_modalities", "max_output_tokens", "type"} & set(s)

    def test_beta_response_and_item_shapes(self) -> None:
        c = RealtimeCodec(dialect=Dialect.BETA)
        r = json.loads(c.render(env(ResponseDone(response=response_dict()))))["response"]
        assert r["modalities"] == ["audio"] and r["output_audio_format"] == "pcm16"
        assert r["voice"] == "alloy" and "audio" not in r
        assert r["output"][0]["content"][0]["type"] == "audio"
        part = json.loads(c.render(env(ContentPartAdded(
            response_id="r", item_id="i", output_index=0, content_index=0,
            part={"type": "output_text", "text": ""}))))["part"]
        assert part == {"type": "text", "text": ""}


# ---- the official SDK accepts what we render ------------------------------------------


class TestSdkCompatibility:
    @staticmethod
    def ga_check(text: str, model: type) -> Any:
        from openai._models import construct_type
        from openai.types.realtime import RealtimeServerEvent

        obj = json.loads(text)
        strict = model.model_validate(obj)  # pydantic validation: types must match
        loose = construct_type(type_=RealtimeServerEvent, value=obj)  # what the SDK client does
        assert type(loose) is model
        return strict

    def test_ga_events(self) -> None:
        from openai.types.realtime import (
            RealtimeErrorEvent,
            ResponseAudioDeltaEvent,
            ResponseCreatedEvent,
            ResponseDoneEvent,
            SessionCreatedEvent,
        )

        c = RealtimeCodec()
        ev = self.ga_check(c.render(env(ResponseCreated(response=response_dict(ResponseStatus.IN_PROGRESS)))),
                           ResponseCreatedEvent)
        assert ev.response.status == "in_progress"
        ev = self.ga_check(c.render(env(ResponseDone(response=response_dict(ResponseStatus.CANCELLED)))),
                           ResponseDoneEvent)
        assert ev.response.status_details.reason == "client_cancelled"
        assert ev.response.output[0].content[0].transcript == "Hello."
        ev = self.ga_check(c.render(env(AUDIO)), ResponseAudioDeltaEvent)
        assert base64.b64decode(ev.delta) == b"\x00\x01\xff"
        err = DuplexError("invalid_value", "bad", param="session.temperature", event_id="c1")
        ev = self.ga_check(c.render(env(ErrorEvent(error=err))), RealtimeErrorEvent)
        assert (ev.error.code, ev.error.param, ev.error.event_id) == ("invalid_value",
                                                                      "session.temperature", "c1")
        ev = self.ga_check(c.render_error(DuplexError("invalid_json", "x")), RealtimeErrorEvent)
        sess = session_dict(tools=({"type": "function", "name": "f", "parameters": {}},))
        ev = self.ga_check(c.render(env(SessionCreated(session=sess, resume_token="rt"))),
                           SessionCreatedEvent)
        assert ev.session.audio.input.turn_detection.type == "server_vad"
        assert ev.session.audio.output.format.rate == 24000

    def test_beta_events(self) -> None:
        from openai.types.beta.realtime import (
            ResponseAudioDeltaEvent,
            ResponseDoneEvent,
            SessionCreatedEvent,
        )

        c = RealtimeCodec(dialect=Dialect.BETA)
        # The beta SDK types pin ``model`` to OpenAI's names (a Literal), so the
        # strict check uses one of them; the SDK client itself parses leniently.
        s = SessionCreatedEvent.model_validate(json.loads(c.render(env(SessionCreated(
            session=session_dict(model="gpt-realtime"), resume_token="rt")))))
        assert s.session.input_audio_format == "pcm16" and s.session.modalities == ["audio"]
        ResponseAudioDeltaEvent.model_validate(json.loads(c.render(env(AUDIO))))
        r = ResponseDoneEvent.model_validate(json.loads(c.render(env(ResponseDone(response=response_dict())))))
        assert r.response.output[0].content[0].type == "audio"

    def test_sdk_client_events_parse(self) -> None:
        """What the SDK's own param types serialise to is accepted."""
        from openai.types.realtime import SessionUpdateEvent

        ev = SessionUpdateEvent(type="session.update", session={
            "type": "realtime", "output_modalities": ["audio"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}}})
        cmd = codec.parse(ev.model_dump_json(exclude_none=True))
        assert cmd.patch.turn_detection == TurnDetection(silence_duration_ms=200)


# ---- fuzz: nothing but DuplexError ever escapes ------------------------------------------

_json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=12)
_keys = st.sampled_from([
    "type", "event_id", "session", "audio", "input", "output", "format", "rate", "turn_detection",
    "threshold", "silence_duration_ms", "idle_timeout_ms", "transcription", "voice", "speed",
    "tools", "tool_choice", "name", "item", "role", "content", "text", "transcript", "call_id",
    "output", "arguments", "response", "modalities", "output_modalities", "metadata",
    "conversation", "max_output_tokens", "item_id", "content_index", "audio_end_ms", "seq",
    "mode", "input_audio_format", "id", "parameters",
]) | st.text(max_size=6)
_values = st.recursive(
    _json_scalars | st.sampled_from(sorted(CLIENT_EVENT_TYPES)) | st.sampled_from(
        ["audio/pcm", "audio/pcmu", "server_vad", "user", "assistant", "message", "function_call",
         "input_text", "input_audio", "output_text", "AAAA", "inf", "auto"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=6),
    max_leaves=25,
)
_events = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(CLIENT_EVENT_TYPES))},
    optional={"event_id": _values},
).flatmap(lambda base: st.dictionaries(_keys, _values, max_size=6).map(lambda d: {**d, **base}))


def _only_duplex_errors(frame: str | bytes) -> None:
    try:
        codec.parse(frame)
    except DuplexError as err:
        json.dumps(err.to_wire())  # and the error itself is renderable
        codec.render_error(err)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_events)
def test_fuzz_structured_events(obj: dict[str, Any]) -> None:
    _only_duplex_errors(json.dumps(obj))


@settings(max_examples=200, deadline=None)
@given(_values)
def test_fuzz_random_json(value: Any) -> None:
    _only_duplex_errors(json.dumps(value))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzz_random_bytes(data: bytes) -> None:
    _only_duplex_errors(data)
    _only_duplex_errors(data.decode("utf-8", "replace"))
