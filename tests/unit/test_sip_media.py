"""The media side of SIP calls, sans-I/O: SDP offer/answer, RTP packets,
RFC 4733 DTMF, the 8 kHz reply player, and the webhook signature checked by
the ``standardwebhooks`` package."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat
from vllm_duplex.media.audio import ulaw_encode
from vllm_duplex.realtime.server.telephony import rtp, sdp, webhooks
from vllm_duplex.realtime.server.reply_player import ReplyPlayer
from vllm_duplex.realtime.server.telephony.sip_call import FRAME, RATE

BARESIP_OFFER = "\r\n".join([
    "v=0", "o=- 1 2 IN IP4 192.168.1.5", "s=-", "c=IN IP4 192.168.1.5", "t=0 0",
    "m=audio 10000 RTP/AVP 9 8 0 101", "a=rtpmap:9 G722/8000", "a=rtpmap:8 PCMA/8000",
    "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-15",
    "a=ptime:20", "a=sendrecv", ""])


# ---- SDP ----------------------------------------------------------------------------


def test_the_first_g711_law_offered_is_chosen_with_dtmf():
    offer = sdp.parse_offer(BARESIP_OFFER)
    assert (offer.address, offer.port) == ("192.168.1.5", 10000)
    assert (offer.payload_type, offer.encoding) == (8, AudioEncoding.PCMA)  # G.722 skipped
    assert offer.dtmf_payload_type == 101
    answer = sdp.answer(offer, "127.0.0.1", 40000, 7)
    assert "m=audio 40000 RTP/AVP 8 101" in answer and "c=IN IP4 127.0.0.1" in answer
    assert "a=rtpmap:8 PCMA/8000" in answer and "a=rtpmap:101 telephone-event/8000" in answer


def test_static_payload_types_need_no_rtpmap():
    offer = sdp.parse_offer("v=0\r\nc=IN IP4 10.0.0.1\r\nm=audio 4000 RTP/AVP 0\r\n")
    assert offer.encoding is AudioEncoding.PCMU and offer.dtmf_payload_type is None


@pytest.mark.parametrize("text, why", [
    ("v=0\r\nc=IN IP4 1.2.3.4\r\nm=video 4000 RTP/AVP 96\r\n", "no audio"),
    ("v=0\r\nc=IN IP4 1.2.3.4\r\nm=audio 4000 RTP/SAVP 0\r\n", "SRTP"),
    ("v=0\r\nc=IN IP4 1.2.3.4\r\nm=audio 4000 RTP/AVP 111\r\na=rtpmap:111 opus/48000/2\r\n",
     "neither PCMU nor PCMA"),
    ("v=0\r\nm=audio 4000 RTP/AVP 0\r\n", "connection address"),
])
def test_offers_we_cannot_answer_say_why(text, why):
    with pytest.raises(sdp.SdpError, match=why):
        sdp.parse_offer(text)


# ---- RTP and DTMF ---------------------------------------------------------------------


def test_rtp_round_trips_and_the_sender_numbers_and_stamps():
    sender = rtp.RtpSender(0, ssrc=7, sequence=65535, timestamp=2**32 - 100)
    first = rtp.parse(sender.packet(b"\xff" * 160, 160))
    second = rtp.parse(sender.packet(b"\xff" * 160, 160, speech=False))
    third = rtp.parse(sender.packet(b"\x00" * 160, 160))
    assert (first.sequence, second.sequence) == (65535, 0)  # wraps
    assert second.timestamp == (first.timestamp + 160) % 2**32
    assert first.marker and not second.marker and third.marker  # a talk spurt's first packet
    assert first.ssrc == 7 and first.payload == b"\xff" * 160


def test_csrcs_extensions_and_padding_are_skipped():
    header = bytes([0x80 | 0x20 | 0x10 | 1, 0]) + (1).to_bytes(2, "big") + bytes(8)
    packet = header + bytes(4) + b"\xbe\xde\x00\x01" + bytes(4) + b"voice" + b"\x00\x00\x03"
    assert rtp.parse(packet).payload == b"voice"


@pytest.mark.parametrize("data", [b"", b"\x80\x00", bytes([0x40, 0]) + bytes(10),
                                  bytes([0xA0, 0]) + bytes(10) + b"\x20",  # padding past the end
                                  bytes([0x80, 200]) + bytes(10)])  # RTCP
def test_malformed_rtp_raises(data):
    with pytest.raises(rtp.RtpError):
        rtp.parse(data)


@given(st.binary(max_size=64))
def test_no_bytes_make_rtp_fail_other_than_by_its_error(data):
    try:
        rtp.parse(data)
    except rtp.RtpError:
        pass


def test_the_sequence_gate_drops_duplicates_and_late_packets_across_the_wrap():
    gate = rtp.SequenceGate()
    seqs = [65534, 65535, 65535, 0, 65533, 3, 2, 4]
    passed = [s for s in seqs if gate.admit(rtp.RtpPacket(0, s, 0, 1, b"x"))]
    assert passed == [65534, 65535, 0, 3, 4]  # 1 and 2 lost: 2 came after 3


def _event(ts: int, code: int, end: bool) -> rtp.RtpPacket:
    return rtp.RtpPacket(101, 0, ts, 9, bytes([code, 0x80 if end else 0, 0, 160]))


def test_dtmf_digits_come_once_each_in_order_whatever_the_repeats():
    receiver = rtp.DtmfReceiver()
    packets = [_event(1000, 1, False), _event(1000, 1, False), _event(1000, 1, True),
               _event(1000, 1, True), _event(1000, 1, True),
               _event(2000, 11, True),  # a digit heard only by its end packets
               _event(3000, 1, False), _event(3000, 1, True)]  # the same key again
    digits = [d for p in packets if (d := receiver.receive(p)) is not None]
    assert digits == ["1", "#", "1"]


def test_a_pressed_key_is_one_telephone_event_between_the_audio_around_it():
    sender = rtp.RtpSender(0, ssrc=7, sequence=0xFFFE, timestamp=500)
    before = rtp.parse(sender.packet(b"\xff" * FRAME, FRAME))
    tone = [rtp.parse(p) for p in sender.tone(101, "#", FRAME)]
    after = rtp.parse(sender.packet(b"\xff" * FRAME, FRAME))
    seqs = [p.sequence for p in (before, *tone, after)]
    assert seqs == [(0xFFFE + i) & 0xFFFF for i in range(len(seqs))]  # one stream, across the wrap
    assert {p.payload_type for p in tone} == {101} and {p.timestamp for p in tone} == {660}
    assert [p.marker for p in tone] == [True] + [False] * (len(tone) - 1)
    ends = [p for p in tone if p.payload[1] & 0x80]
    assert len(ends) == 3 and len({p.payload for p in ends}) == 1  # the end, three times
    durations = [int.from_bytes(p.payload[2:], "big") for p in tone]
    assert durations == sorted(durations) and durations[-1] == rtp.TONE_FRAMES * FRAME
    assert after.timestamp == 660 + rtp.TONE_FRAMES * FRAME  # the audio goes on after the tone
    receiver = rtp.DtmfReceiver()
    assert [d for p in tone if (d := receiver.receive(p)) is not None] == ["#"]


# ---- the player ---------------------------------------------------------------------------


def _ulaw(seconds: float) -> bytes:
    return ulaw_encode(np.full(int(8000 * seconds), 8000, np.int16))


def test_the_player_plays_a_reply_then_silence_and_reports_it():
    seen: list[tuple[str, str]] = []
    player = ReplyPlayer(lambda kind, rid: seen.append((kind, rid)), RATE)
    fmt = AudioFormat(AudioEncoding.PCMU, 8000)
    player.push("r1", "i1", _ulaw(0.05), fmt)
    player.finish("r1")
    frames = [player.pull() for _ in range(4)]
    assert [speech for _, speech in frames] == [True, True, True, False]
    assert all(f.size == FRAME for f, _ in frames)
    assert seen == [("output_audio_buffer.started", "r1"), ("output_audio_buffer.stopped", "r1")]


def test_interrupting_silences_the_next_frame_and_clear_says_what_was_heard():
    seen: list[str] = []
    player = ReplyPlayer(lambda kind, rid: seen.append(kind), RATE)
    fmt = AudioFormat(AudioEncoding.PCMU, 8000)
    player.push("r1", "i1", _ulaw(1.0), fmt)
    for _ in range(10):
        player.pull()
    assert player.clear() == ("r1", "i1", 200)  # 10 frames of 20 ms were sent
    assert not player.pull()[1]
    player.push("r1", "i1", _ulaw(0.1), fmt)  # late audio of the cut reply: dropped
    assert not player.pull()[1]
    player.push("r2", "i2", _ulaw(1.0), fmt)
    assert player.pull()[1]
    player.interrupted()
    assert not player.pull()[1] and player.queued_ms == 0
    assert seen.count("output_audio_buffer.cleared") == 2


# ---- the webhook ---------------------------------------------------------------------------


def test_the_webhook_verifies_with_standardwebhooks():
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    event = webhooks.incoming_call("sip_x.w1", [("From", "<sip:alice@example.com>;tag=1")],
                                   now=1_750_000_000)
    hook = webhooks.signed(secret, event, time.time())
    assert Webhook(secret).verify(hook.body, hook.headers) == json.loads(hook.body)
    assert json.loads(hook.body)["data"] == {
        "call_id": "sip_x.w1", "sip_headers": [{"name": "From", "value": "<sip:alice@example.com>;tag=1"}]}
    # Standard Webhooks' reference vector (its README): the same algorithm.
    assert webhooks.signature("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
                              1614265330, b'{"test": 2432232314}') == \
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
