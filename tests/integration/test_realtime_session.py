"""Session configuration and input buffering over a real socket.

Pinned: the session.update echo (unknown fields ignored, invalid_value +
param); immutable_field; audio formats (PCM16 at other rates, pcmu/pcma in and
out, unsupported_audio_format); turn_detection server_vad / null /
unsupported; append, commit on an empty buffer, clear.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    assert_alive,
    expect_error,
    module_server,
    no_leaked_tasks,
    realtime_client,
    sentinel,
    stream_audio,
    tone,
    types,
    utterance,
)
from vllm_duplex.media.audio import alaw_encode, ulaw_encode
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

MANUAL = {"audio": {"input": {"turn_detection": None}}}


server = module_server()


rt = realtime_client()


def _td(**fields) -> dict:
    return {"audio": {"input": {"turn_detection": {"type": "server_vad", **fields}}}}


# ---- 5: session.update ---------------------------------------------------------------


async def test_update_echoes_the_full_effective_session(rt):
    created = rt.events[0]["session"]
    updated = await rt.update_session({"instructions": "Be brief.", "temperature": 0.3,
                                       "output_modalities": ["text"]})
    assert set(updated) == set(created)  # the full session, not just the changed fields
    assert updated["id"] == created["id"]
    assert updated["instructions"] == "Be brief."
    assert updated["temperature"] == 0.3
    assert updated["output_modalities"] == ["text"]
    assert updated["audio"] == created["audio"]  # untouched fields keep their values


async def test_unknown_fields_are_ignored(rt):
    updated = await rt.update_session({"instructions": "x", "no_such_field": 1,
                                       "audio": {"input": {"no_such_knob": True}},
                                       "tracing": "auto"})
    assert updated["instructions"] == "x"
    assert "no_such_field" not in updated and "no_such_knob" not in updated["audio"]["input"]
    assert updated["tracing"] == "auto"  # a known field (docs/realtime-conformance.md)


INVALID = [
    ({"temperature": 5}, "session.temperature"),
    ({"temperature": "hot"}, "session.temperature"),
    ({"instructions": 7}, "session.instructions"),
    ({"output_modalities": ["video"]}, "session.output_modalities"),
    ({"output_modalities": []}, "session.output_modalities"),
    ({"max_output_tokens": 0}, "session.max_output_tokens"),
    ({"audio": {"output": {"speed": 3.0}}}, "session.audio.output.speed"),
    ({"audio": "loud"}, "session.audio"),
    ({"type": "translation"}, "session.type"),
    (_td(threshold=2), "session.audio.input.turn_detection.threshold"),
    (_td(silence_duration_ms=-1), "session.audio.input.turn_detection.silence_duration_ms"),
    (_td(create_response="yes"), "session.audio.input.turn_detection.create_response"),
]


@pytest.mark.parametrize("patch, param", INVALID, ids=[p for _, p in INVALID])
async def test_invalid_values_are_rejected_naming_the_field(rt, patch, param):
    before = dict(rt.session)
    eid = await rt.send({"type": "session.update", "session": {"instructions": "changed", **patch}})
    await expect_error(rt, "invalid_value", event_id=eid, param=param)
    after = await rt.update_session({})
    assert after == before  # all or nothing: the valid part of the update was not applied


# ---- 6: immutable fields ------------------------------------------------------------


@pytest.mark.parametrize("field, value", [("model", "gpt-4o"), ("policy", "other"),
                                          ("type", "transcription")])
async def test_immutable_fields_cannot_change(rt, field, value):
    eid = await rt.send({"type": "session.update", "session": {field: value}})
    await expect_error(rt, "immutable_field", event_id=eid, param=f"session.{field}")
    same = await rt.update_session({field: rt.session[field]})  # re-stating it is fine
    assert same[field] == rt.events[0]["session"][field]


# ---- 7: audio formats ----------------------------------------------------------------


async def test_pcm16_at_16khz_input_is_accepted_and_drives_vad(rt):
    fmt = {"type": "audio/pcm", "rate": 16000}
    session = await rt.update_session({"audio": {"input": {"format": fmt}}})
    assert session["audio"]["input"]["format"] == fmt
    await stream_audio(rt, utterance(rate=16000), rate=16000)
    started = await rt.wait_for("input_audio_buffer.speech_started")
    stopped = await rt.wait_for("input_audio_buffer.speech_stopped")
    committed = await rt.wait_for("input_audio_buffer.committed")
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert started["audio_start_ms"] == 0
    assert stopped["audio_end_ms"] == 800  # the audio timeline, independent of the rate
    assert (await rt.collect_response()).status == "completed"


@pytest.mark.parametrize("encoding, encode", [("audio/pcmu", ulaw_encode),
                                              ("audio/pcma", alaw_encode)])
async def test_g711_input_drives_vad(rt, encoding, encode):
    session = await rt.update_session({"audio": {"input": {"format": {"type": encoding}}}})
    assert session["audio"]["input"]["format"] == {"type": encoding}
    data = encode(np.frombuffer(utterance(rate=8000), "<i2"))
    for i in range(0, len(data), 160):  # 20 ms at 8 kHz, one byte per sample
        await rt.append_audio(data[i:i + 160])
    stopped = await rt.wait_for("input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] == 800
    assert (await rt.collect_response()).status == "completed"


async def _reply_audio(server, output_format: dict | None) -> tuple[bytes, dict]:
    async with await RealtimeClient.connect(server.ws_url) as rt:
        patch: dict = {"audio": {"input": {"turn_detection": None}}}
        if output_format is not None:
            patch["audio"]["output"] = {"format": output_format}
        session = await rt.update_session(patch)
        await rt.create_response()
        result = await rt.collect_response()
        assert result.status == "completed"
        assert result.done["response"]["audio"]["output"]["format"] == \
            session["audio"]["output"]["format"]
        return result.audio, session


@pytest.mark.parametrize("encoding", ["audio/pcmu", "audio/pcma"])
async def test_g711_output_is_8khz_one_byte_per_sample(server, encoding):
    pcm24, _ = await _reply_audio(server, None)
    g711, session = await _reply_audio(server, {"type": encoding})
    assert session["audio"]["output"]["format"]["type"] == encoding
    assert len(g711) * 6 == pytest.approx(len(pcm24), rel=0.02)  # 8000 x 1 vs 24000 x 2 bytes/s
    assert len(set(g711)) > 16  # a tone, not silence


@pytest.mark.parametrize("fmt, bytes_per_s", [({"type": "audio/pcmu"}, 8000),
                                              ({"type": "audio/pcm", "rate": 16000}, 32000)])
async def test_resampled_output_has_the_full_duration(server, fmt, bytes_per_s):
    pcm24, _ = await _reply_audio(server, None)
    out, _ = await _reply_audio(server, fmt)
    # The resampler's held-back tail is flushed at the end: nothing of the reply is lost.
    duration_s = len(pcm24) / 48000
    assert len(out) == round(duration_s * bytes_per_s)


UNSUPPORTED = [
    ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "session.audio.input.format.type"),
    ({"audio": {"output": {"format": {"type": "audio/pcm", "rate": 96000}}}},
     "session.audio.output.format.rate"),
    ({"audio": {"output": {"format": {"type": "audio/pcmu", "rate": 16000}}}},
     "session.audio.output.format.rate"),
    ({"input_audio_format": "g729"}, "session.input_audio_format"),
]


@pytest.mark.parametrize("patch, param", UNSUPPORTED, ids=[p for _, p in UNSUPPORTED])
async def test_unsupported_audio_format(rt, patch, param):
    eid = await rt.send({"type": "session.update", "session": patch})
    await expect_error(rt, "unsupported_audio_format", event_id=eid, param=param)
    after = await rt.update_session({})
    assert after["audio"] == rt.events[0]["session"]["audio"]


# ---- 8: turn detection ---------------------------------------------------------------


async def test_server_vad_parameters_are_echoed(rt):
    td = {"type": "server_vad", "threshold": 0.3, "prefix_padding_ms": 100,
          "silence_duration_ms": 300, "create_response": False, "interrupt_response": False,
          "idle_timeout_ms": 5000}
    session = await rt.update_session({"audio": {"input": {"turn_detection": td}}})
    assert session["audio"]["input"]["turn_detection"] == td


async def test_noise_reduction_is_echoed_and_the_input_still_drives_vad(rt):
    for kind in ("near_field", "far_field"):
        session = await rt.update_session({"audio": {"input": {"noise_reduction": {"type": kind}}}})
        assert session["audio"]["input"]["noise_reduction"] == {"type": kind}
    await stream_audio(rt, utterance())
    await rt.wait_for("input_audio_buffer.speech_stopped")
    assert (await rt.collect_response()).status == "completed"
    session = await rt.update_session({"input_audio_noise_reduction": None})  # the beta name: off
    assert session["audio"]["input"]["noise_reduction"] is None


async def test_unsupported_turn_detection_type(rt):
    eid = await rt.send({"type": "session.update", "session": _td(type="push_to_talk")})
    await expect_error(rt, "unsupported_turn_detection", event_id=eid,
                       param="session.audio.input.turn_detection.type")
    await assert_alive(rt)
    assert rt.session["audio"]["input"]["turn_detection"]["type"] == "server_vad"


async def test_turn_detection_null_means_manual_commits(rt):
    session = await rt.update_session(MANUAL)
    assert session["audio"]["input"]["turn_detection"] is None
    await stream_audio(rt, utterance())
    await rt.commit()
    committed = await rt.wait_for("input_audio_buffer.committed")
    await rt.create_response()
    assert (await rt.collect_response()).status == "completed"
    seen = types(rt.events)
    assert "input_audio_buffer.speech_started" not in seen
    assert "input_audio_buffer.speech_stopped" not in seen
    assert seen.count("response.created") == 1  # only the one the client asked for
    assert seen.index("input_audio_buffer.committed") < seen.index("response.created")
    assert committed["item_id"]


async def test_server_vad_without_create_response_commits_but_does_not_answer(rt):
    await rt.update_session(_td(create_response=False))
    await stream_audio(rt, utterance())
    committed = await rt.wait_for("input_audio_buffer.committed")
    await sentinel(rt, committed["item_id"])
    seen = types(rt.events)
    assert seen.index("input_audio_buffer.speech_started") < \
        seen.index("input_audio_buffer.speech_stopped") < seen.index("input_audio_buffer.committed")
    assert "response.created" not in seen


# ---- 9: append / commit / clear ------------------------------------------------------


async def test_commit_on_an_empty_buffer(rt):
    await rt.update_session(MANUAL)
    eid = await rt.commit()
    await expect_error(rt, "input_audio_buffer_empty", event_id=eid, param=None)
    await assert_alive(rt)


async def test_append_accumulates_until_commit(rt):
    await rt.update_session(MANUAL)
    for _ in range(5):
        await rt.append_audio(tone(0.1))
    await rt.commit()
    committed = await rt.wait_for("input_audio_buffer.committed")
    added = await rt.wait_for("conversation.item.added")
    assert added["item"]["id"] == committed["item_id"]
    assert added["item"]["role"] == "user"
    assert added["item"]["content"][0]["type"] == "input_audio"
    eid = await rt.commit()  # the commit emptied the buffer
    await expect_error(rt, "input_audio_buffer_empty", event_id=eid)
    assert types(rt.events).count("input_audio_buffer.committed") == 1


async def test_clear_empties_the_buffer(rt):
    await rt.update_session(MANUAL)
    await rt.append_audio(tone(0.2))
    await rt.clear()
    await rt.wait_for("input_audio_buffer.cleared")
    eid = await rt.commit()
    await expect_error(rt, "input_audio_buffer_empty", event_id=eid)
    await rt.clear()  # clearing an empty buffer is fine too
    await rt.wait_for("input_audio_buffer.cleared")
