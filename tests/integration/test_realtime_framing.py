"""Handshake, framing, seq/fence metadata and the beta dialect over a real socket.

Pinned: session.created; invalid_json / invalid_event / unknown_event;
event_too_large, invalid_audio; metadata.fence on every event (fences only
grow); seq strictly +1 and the resume token; the beta dialect
(``OpenAI-Beta: realtime=v1``).
"""

from __future__ import annotations

import json

import pytest
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    ANY,
    SCRIPTED_REPLY,
    assert_alive,
    assert_error,
    b64,
    expect_error,
    module_server,
    no_leaked_tasks,
    realtime_client,
    scripted_config,
    tone,
)
from vllm_duplex.realtime.client.realtime import RealtimeClient
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_EVENT = 64 << 10  # event_too_large above this ...
MAX_FRAME = 256 << 10  # ... and the WebSocket layer refuses frames above this (close 1009)


server = module_server(scripted_config(max_event_bytes=MAX_EVENT, max_frame_bytes=MAX_FRAME))


rt = realtime_client()


# ---- 1, 24: session.created ---------------------------------------------------------


async def test_session_created_carries_session_object_and_resume_token(server, rt):
    created = rt.events[0]
    assert created["type"] == "session.created"
    assert created["seq"] == 1
    assert created["metadata"] == {"fence": {"incarnation": 0, "epoch": 0}}
    assert isinstance(created["resume_token"], str) and len(created["resume_token"]) >= 16
    s = created["session"]
    assert s["type"] == "realtime"
    assert s["id"].startswith("sess_")
    assert s["model"] == "duplex-scripted"
    assert s["policy"] == "scripted"
    assert s["fence"] == {"incarnation": 0, "epoch": 0}
    caps = s["capabilities"]
    assert "append_audio_chunk" in caps["input_modes"]
    assert "rollback_to_checkpoint" not in caps["input_modes"]
    assert caps["turn_detection"] == ["server_vad"]
    assert s["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert s["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert s["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert s["output_modalities"] == ["audio"]

    async with await RealtimeClient.connect(server.ws_url) as other:
        assert other.session_id != rt.session_id
        assert other.resume_token != rt.resume_token


# ---- 2: invalid JSON, invalid events, unknown events ----------------------------------

FRAMES = [
    pytest.param("{not json", "invalid_json", None, ANY, id="bad-json"),
    pytest.param('{"type":"session.update","session":{"temperature":NaN},"event_id":"e0"}',
                 "invalid_json", None, ANY, id="nan-is-not-json"),
    pytest.param(b"\xff\xfe\x00", "invalid_json", None, ANY, id="binary-not-utf8"),
    pytest.param("[1, 2]", "invalid_event", None, ANY, id="not-an-object"),
    pytest.param('"session.update"', "invalid_event", None, ANY, id="json-string"),
    pytest.param('{"event_id":"e1"}', "invalid_event", "e1", "type", id="missing-type"),
    pytest.param('{"type":5,"event_id":"e2"}', "invalid_event", "e2", "type", id="non-string-type"),
    pytest.param('{"type":"no.such.event","event_id":"e3"}', "unknown_event", "e3", "type",
                 id="unknown-type"),
]


@pytest.mark.parametrize("frame, code, event_id, param", FRAMES)
async def test_bad_frames_get_an_error_and_the_socket_stays_open(rt, frame, code, event_id, param):
    await rt.ws.send(frame)
    await expect_error(rt, code, event_id=event_id, param=param)
    await assert_alive(rt)


async def test_binary_frame_with_a_json_event_is_parsed_like_text(rt):
    await rt.ws.send(json.dumps({"type": "session.update", "event_id": "bin1",
                                 "session": {"instructions": "binary"}}).encode())
    updated = await rt.wait_for("session.updated", "error", timeout=10)
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["instructions"] == "binary"


# ---- 3: size limits and bad audio --------------------------------------------------------


def _append_frame(total_bytes: int, event_id: str) -> str:
    head = json.dumps({"type": "input_audio_buffer.append", "event_id": event_id, "audio": ""})
    n = (total_bytes - len(head)) // 4 * 3  # base64 of n bytes is 4n/3 characters
    return json.dumps({"type": "input_audio_buffer.append", "event_id": event_id,
                       "audio": b64(bytes(n))})


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
async def test_event_over_max_event_bytes_is_refused_and_socket_stays_open(rt, binary):
    frame = _append_frame(MAX_EVENT + 4096, "big1")
    assert MAX_EVENT < len(frame) < MAX_FRAME
    await rt.ws.send(frame.encode() if binary else frame)
    await expect_error(rt, "event_too_large")
    await assert_alive(rt)


async def test_event_just_under_max_event_bytes_is_accepted(rt):
    frame = _append_frame(MAX_EVENT - 1024, "fits1")
    assert len(frame) <= MAX_EVENT
    await rt.ws.send(frame)
    await assert_alive(rt)
    assert not [e for e in rt.events if e["type"] == "error"]


async def test_frame_over_transport_limit_closes_with_1009(rt):
    await rt.ws.send(_append_frame(MAX_FRAME + 4096, "huge1"))
    with pytest.raises(ConnectionClosed):
        await rt.wait_for("never", timeout=10)
    assert rt.ws.close_code == 1009


@pytest.mark.parametrize("audio", ["!!not base64!!", "AAA"], ids=["garbage", "bad-padding"])
async def test_undecodable_base64_audio_is_invalid_audio(rt, audio):
    eid = await rt.send({"type": "input_audio_buffer.append", "audio": audio})
    await expect_error(rt, "invalid_audio", event_id=eid, param="audio")
    await assert_alive(rt)


# ---- 21, 24: seq and fence on every journaled event -----------------------------------


async def test_seq_is_strictly_plus_one_and_fences_never_decrease(rt):
    await rt.update_session({"audio": {"input": {"turn_detection": None}}})
    await rt.commit()  # journaled error: input_audio_buffer_empty
    await expect_error(rt, "input_audio_buffer_empty")
    await rt.create_response()
    await rt.wait_for("response.output_audio_transcript.delta")  # the first word
    await rt.cancel_response()
    cancelled = await rt.collect_response()
    assert cancelled.status == "cancelled"
    await rt.create_response()
    assert (await rt.collect_response()).status == "completed"

    seqs = [e["seq"] for e in rt.events]
    assert seqs == list(range(1, len(rt.events) + 1))
    fences = [(e["metadata"]["fence"]["incarnation"], e["metadata"]["fence"]["epoch"])
              for e in rt.events]
    assert all(isinstance(x, int) for f in fences for x in f)
    assert fences == sorted(fences)
    assert fences[0] == (0, 0) and fences[-1] == (0, 1)  # one cancel: one epoch bump


async def test_framing_errors_also_carry_metadata_fence(rt):
    await rt.ws.send("{oops")
    event = await expect_error(rt, "invalid_json")
    assert event.get("metadata", {}).get("fence") == {"incarnation": 0, "epoch": 0}


# ---- beta dialect ------------------------------------------------------------------------

GA_ONLY = {"response.output_audio.delta", "response.output_audio.done",
           "response.output_audio_transcript.delta", "response.output_audio_transcript.done",
           "response.output_text.delta", "response.output_text.done",
           "conversation.item.added", "conversation.item.done"}


async def test_beta_dialect_renames_events_and_reshapes_documents(server):
    async with await RealtimeClient.connect(server.ws_url, beta=True) as rt:
        s = rt.events[0]["session"]
        assert "audio" not in s and "output_modalities" not in s
        assert s["modalities"] == ["audio"]
        assert s["input_audio_format"] == "pcm16" and s["output_audio_format"] == "pcm16"
        assert s["turn_detection"]["type"] == "server_vad"

        s = await rt.update_session({"turn_detection": None, "output_audio_format": "g711_ulaw"})
        assert s["turn_detection"] is None and s["output_audio_format"] == "g711_ulaw"
        await rt.update_session({"output_audio_format": "pcm16"})

        await rt.append_audio(tone(0.2))
        await rt.commit()
        await rt.create_response()
        result = await rt.collect_response()
        assert result.status == "completed"
        assert result.transcript == SCRIPTED_REPLY
        assert len(result.audio) == 24000 * 2 * 1440 // 1000  # 12 words x 120 ms, pcm16 24 kHz

        seen = {e["type"] for e in rt.events}
        assert {"response.audio.delta", "response.audio_transcript.delta", "response.audio.done",
                "response.audio_transcript.done", "conversation.item.created"} <= seen
        assert not seen & GA_ONLY
        done = result.done["response"]
        assert done["modalities"] == ["audio"] and "output_modalities" not in done
        assert done["output"][0]["content"][0]["type"] == "audio"
        for event in rt.events:
            assert "fence" in event["metadata"]


async def test_beta_dialect_errors_have_the_same_shape(server):
    async with await RealtimeClient.connect(server.ws_url, beta=True) as rt:
        eid = await rt.send({"type": "response.cancel"})
        event = await expect_error(rt, "response_cancel_not_active", event_id=eid)
        assert_error(event, "response_cancel_not_active", event_id=eid)
        await assert_alive(rt)
