"""The GPT-Live codec's sideband and telephony pieces without sockets: the
SDK's own ``transport.dtmf.send`` parses into a key press (or a typed
refusal), and every event a sideband gets -- ``transport.dtmf.*``, the
reflected ``session.input_audio.append``, the ``session.started`` of an
attach, a call's ``session.closed`` -- is exactly the SDK's shape
(``tests/support/live_shapes.py``); the data channel's permissions
(``client.data_channel``) are checked as the SDK defines them."""

from __future__ import annotations

import base64
import json

import pytest
from openai.types.live.connect_client_event import TransportDtmfSend
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.realtime.server.live.webrtc_call import DataChannelPolicy
from vllm_duplex.realtime.wire.live.audio_frames import input_reflection, output_reflection
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import DTMF_KEYS, LiveDtmf

from support.live_shapes import live_event


def codec() -> LiveCodec:
    return LiveCodec(max_event_bytes=1 << 20, model_aliases={"smollm2": "smollm2"},
                     clock=lambda: 100.0)


@pytest.mark.parametrize("key", list(DTMF_KEYS))
def test_every_key_the_sdk_names_is_pressed(key):
    sent = TransportDtmfSend(type="transport.dtmf.send", event=key, event_id="k1")
    command = codec().parse(sent.to_json(use_api_names=True, exclude_unset=True))
    assert command == LiveDtmf(digit=key, event_id="k1")
    confirmed = live_event(codec().render_dtmf("transport.dtmf.sent", key, "k1"))
    assert (confirmed.event, confirmed.client_event_id) == (key, "k1")
    assert live_event(codec().render_dtmf("transport.dtmf.received", key)).event == key


@pytest.mark.parametrize("key", ["", "10", "a", "E", "x", 5, None])
def test_anything_else_is_refused_by_name_with_its_event_id(key):
    with pytest.raises(DuplexError) as err:
        codec().parse(json.dumps({"type": "transport.dtmf.send", "event": key, "event_id": "k"}))
    assert (err.value.code, err.value.param, err.value.event_id) == ("invalid_value", "event", "k")


def test_reflected_audio_is_the_sdks_shape_and_bytes():
    pcm = bytes(range(256)) * 4
    shaped = live_event(input_reflection(pcm))
    assert base64.b64decode(shaped.audio) == pcm


def test_an_attach_and_a_calls_end_carry_the_session_by_the_id_its_owner_knows():
    c = codec()
    c.session_id = "sip_42"  # a call's id, not the session's own
    c.render(Envelope(seq=1, fence=Fence("sess_1"), event=ev.SessionCreated(session={
        "id": "sess_1", "expires_at": 1_800_000_000,
        "audio": {"output": {"format": {"type": "audio/pcmu"}, "voice": "marin"}}},
        resume_token="rt")))
    attached = live_event(c.started())
    assert attached.session.id == "sip_42" and attached.client_event_id is None
    assert (attached.session.audio.format.type, attached.session.audio.format.rate) == \
        ("audio/pcmu", 8000)
    closed = live_event(c.closed("hangup"))
    assert (closed.reason, closed.session.id) == ("close_requested", "sip_42")


def test_the_data_channel_policy_is_the_sdks():
    assert DataChannelPolicy.parse(None).may_send("session.update")
    everything = DataChannelPolicy.parse({"data_channel": {"allowed_client_events": "all"}})
    assert everything.may_send("session.close") and everything.may_get('{"type":"x"}')
    narrow = DataChannelPolicy.parse({"data_channel": {
        "allowed_client_events": ["session.input_audio.mute"],
        "allowed_server_events": [{"type": "session.started"},
                                  {"type": "response.event", "response_event": "x"}]}})
    assert narrow.may_send("session.input_audio.mute") and not narrow.may_send("session.update")
    assert narrow.may_get('{"type":"session.started","event_id":"e"}')
    assert not narrow.may_get('{"type":"session.output_transcript.delta","event_id":"e"}')
    nothing = DataChannelPolicy.parse({"data_channel": {"allowed_client_events": []}})
    assert not nothing.may_send("session.close")
    for bad in ({"data_channel": {"allowed_client_events": ["session.nope"]}},
                {"data_channel": {"allowed_server_events": "some"}}, {"data_channel": 1}, 7):
        with pytest.raises(DuplexError) as err:
            DataChannelPolicy.parse(bad)
        assert err.value.code == "invalid_value" and err.value.param.startswith("session.client")


def test_reflected_reply_audio_carries_its_range_as_the_sdk_requires_on_a_sideband():
    pcm = b"\x01\x00" * 480  # 20 ms at 24 kHz
    shaped = live_event(output_reflection(pcm, 1000, 1020))
    assert (base64.b64decode(shaped.delta), shaped.start_ms, shaped.end_ms) == (pcm, 1000, 1020)
