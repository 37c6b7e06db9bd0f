"""Stored GPT-Live sessions and their forks, without sockets: what a stored
session keeps of its conversation, how a fork's overrides make the
``session.start`` it means (then parsed as any other), and the store that
keeps it (the engine's session store, under its own keys)."""

from __future__ import annotations

import json

import pytest
from openai.types.live import ForkSessionStartEvent
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable import live_sessions
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.records import LIVE_PREFIX
from vllm_duplex.durable.store import Bounds, decode, encode
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveStart
from vllm_duplex.realtime.wire.live.forks import fork_start, stored_items
from vllm_duplex.testing.clock import VirtualClock

from support.live_shapes import live_event

WIRE_ITEMS = [  # a session's conversation as its snapshot has it (Realtime GA items)
    {"id": "i1", "type": "message", "role": "system",
     "content": [{"type": "input_text", "text": "The caller is Ana."}]},
    {"id": "i2", "type": "message", "role": "user",
     "content": [{"type": "input_audio", "transcript": "My flight is BA 117."}]},
    {"id": "i3", "type": "message", "role": "assistant",
     "content": [{"type": "output_audio", "transcript": "Noted, BA 117."}]},
    {"id": "i4", "type": "message", "role": "user",
     "content": [{"type": "input_audio", "transcript": None}]},  # heard nothing: left out
    {"id": "i5", "type": "function_call", "name": "f", "call_id": "c", "arguments": "{}"},
]
CONFIG = {"model": "gpt-live-1", "instructions": "Be brief.", "store": True,
          "audio": {"format": {"type": "audio/pcm", "rate": 24000},
                    "output": {"voice": "marin"}},
          "delegation": {"type": "responses", "responses": {"model": "gpt-5.5"}}}


def codec() -> LiveCodec:
    return LiveCodec(max_event_bytes=1 << 20, model_aliases={"smollm2": "smollm2"},
                     clock=lambda: 0.0)


def test_a_stored_conversation_is_its_messages_role_and_text():
    assert stored_items(WIRE_ITEMS) == [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "The caller is Ana."}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "My flight is BA 117."}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Noted, BA 117."}]},
    ]


def fork_frame(**session) -> dict:
    return json.loads(ForkSessionStartEvent(type="session.start", event_id="fs",
                                            session=session).to_json(
        use_api_names=True, exclude_unset=True))


def test_a_fork_starts_from_the_stored_config_and_conversation():
    items = tuple(stored_items(WIRE_ITEMS))
    c = codec()
    start = c.parse(json.dumps(fork_start(fork_frame(), CONFIG, items)))
    assert isinstance(start, LiveStart) and start.event_id == "fs"
    assert start.model == "gpt-live-1" and start.patch.instructions == "Be brief."
    assert start.patch.voice == "marin"
    assert [i.item.content[0].text for i in start.history] == [
        "The caller is Ana.", "My flight is BA 117.", "Noted, BA 117."]
    assert c.store and c.started_with == CONFIG  # a fork of a stored session is stored too


def test_a_forks_overrides():
    items = tuple(stored_items(WIRE_ITEMS))
    c = codec()
    start = c.parse(json.dumps(fork_start(fork_frame(
        audio={"format": {"type": "audio/pcmu", "rate": 8000}}, store=False,
        delegation={"type": "responses", "responses": {"max_output_tokens": 200}}),
        CONFIG, items)))
    assert start.patch.output_format.rate == 8000 and start.patch.voice == "marin"
    assert not c.store
    session = live_event(c.render(_created(c)))
    assert session.session.store is False
    assert session.session.delegation.responses.model == "gpt-5.5"  # kept beside the override
    assert session.session.delegation.responses.max_output_tokens == 200


def _created(c):
    from vllm_duplex.domain import events as ev
    from vllm_duplex.domain.events import Envelope
    from vllm_duplex.domain.fence import Fence

    return Envelope(seq=1, fence=Fence("s"), event=ev.SessionCreated(
        session={"id": "sess_2", "expires_at": 1}, resume_token="r"))


@pytest.mark.parametrize("session, code, param", [
    ({"model": "gpt-live-1"}, "invalid_value", "session.model"),
    ({"instructions": "x"}, "invalid_value", "session.instructions"),
    ({"client": {"events": {}}}, "unsupported_option", "session.client"),
    ({"delegation": {"type": "client"}}, "invalid_value", "session.delegation"),
    ({"audio": {"output": {"voice": "cedar"}}}, "invalid_value", "session.audio"),
])
def test_what_a_fork_may_not_set_is_refused_by_name(session, code, param):
    with pytest.raises(DuplexError) as err:
        fork_start({"type": "session.start", "session": session}, CONFIG, ())
    assert (err.value.code, err.value.param) == (code, param)


def test_a_webrtc_fork_leaves_the_audio_format_to_webrtc_and_may_set_the_client():
    client = {"data_channel": {"allowed_server_events": ["session.started"]}}
    start = fork_start({"type": "session.start", "session": {"client": client}}, CONFIG,
                       tuple(stored_items(WIRE_ITEMS)), webrtc=True)["session"]
    assert "format" not in start["audio"] and start["audio"]["output"] == {"voice": "marin"}
    assert start["client"] == client and start["input"] == stored_items(WIRE_ITEMS)
    assert CONFIG["audio"]["format"] == {"type": "audio/pcm", "rate": 24000}  # kept as stored
    with pytest.raises(DuplexError) as err:
        fork_start({"type": "session.start", "session": {"audio": {"format": {
            "type": "audio/pcm"}}}}, CONFIG, (), webrtc=True)
    assert (err.value.code, err.value.param) == ("invalid_value", "session.audio")


def test_other_frames_pass_through_to_the_codec():
    frame = {"type": "session.input_audio.append", "audio": ""}
    assert fork_start(frame, CONFIG, ()) is frame


# ---- the store ---------------------------------------------------------------------------

async def test_a_stored_session_is_kept_in_the_session_store_and_found_by_its_key():
    clock = VirtualClock()
    store = MemoryStore(clock, Bounds(keep_s=600.0))
    items = stored_items(WIRE_ITEMS)
    await live_sessions.keep(store, "w1#1", "sess_1", config=CONFIG, items=items[:1],
                             api_key="sk-a")
    await live_sessions.keep(store, "w1#1", "sess_1", config=CONFIG, items=items,
                             api_key="sk-a")  # saved again after a reply: the latest wins
    record = await live_sessions.find(store, "sess_1", "sk-a")
    assert record.config == CONFIG and list(record.items) == items
    assert decode(encode(record)) == record  # through the allow-listed pickle of a shared store
    assert record.recording == b""  # none given: an empty one
    await live_sessions.keep(store, "w1#1", "sess_1", config=CONFIG, items=items,
                             api_key="sk-a", recording=b"RIFF...")
    record = await live_sessions.find(store, "sess_1", "sk-a")
    assert decode(encode(record)).recording == b"RIFF..."  # kept with it, the same owner
    for sid, key in (("sess_1", "sk-b"), ("sess_1", None), ("sess_9", "sk-a")):
        with pytest.raises(DuplexError) as err:
            await live_sessions.find(store, sid, key)
        assert err.value.code == "session_not_found"
    assert await store.load("sess_1") is None  # its own keys: not a realtime session's
    assert (await store.load(LIVE_PREFIX + "sess_1")) is not None
    await clock.advance(601.0)  # kept as long as the store keeps any session's keys
    with pytest.raises(DuplexError):
        await live_sessions.find(store, "sess_1", "sk-a")
