"""The sans-I/O parts behind the browser transports: the SDP offer checks,
client secrets on a virtual clock, the reply track's positions and clears,
and the outbox's watchers (a call's sideband sockets)."""

from __future__ import annotations

import numpy as np
import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope, SessionUpdated
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import AudioFormat, SessionPatch, SessionType
from vllm_duplex.leases.client_secrets import ClientSecrets
from vllm_duplex.realtime.server.webrtc.media import ReplyTrack
from vllm_duplex.realtime.server.webrtc.offer import check_offer
from vllm_duplex.replay.journal import Journal
from vllm_duplex.replay.outbox import Notice, Outbox, OutboxLimits
from vllm_duplex.testing.clock import VirtualClock

OFFER = "\r\n".join([
    "v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE 0 1",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111 0", "c=IN IP4 0.0.0.0", "a=mid:0", "a=sendrecv", "a=rtcp-mux",
    "a=rtpmap:111 opus/48000/2", "a=rtpmap:0 PCMU/8000",
    "a=ice-ufrag:abcd", "a=ice-pwd:0123456789012345678901",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32), "a=setup:actpass",
    "a=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host",
    "a=candidate:2 1 udp 2130706431 192.0.2.9 50002 typ host",
    "a=candidate:3 1 udp 2130706431 abc.local 50004 typ host",
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "c=IN IP4 0.0.0.0", "a=mid:1",
    "a=sctp-port:5000", "a=ice-ufrag:abcd", "a=ice-pwd:0123456789012345678901",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32), "a=setup:actpass", ""])


def code(fn) -> str:
    with pytest.raises(DuplexError) as err:
        fn()
    return err.value.code


def test_a_good_offer_keeps_only_candidates_the_server_can_reach():
    offer = check_offer(OFFER, ("127.0.0.1",))
    assert offer.data_channel
    assert "127.0.0.1 50000" in offer.sdp
    assert "192.0.2.9" not in offer.sdp and ".local" not in offer.sdp
    assert "192.0.2.9" in check_offer(OFFER).sdp  # no restriction configured


@pytest.mark.parametrize("text", [
    "", "   ", "hello", OFFER.replace("v=0", "v=1"),
    OFFER.replace("a=ice-pwd:0123456789012345678901\r\na=fingerprint", "a=fingerprint", 1),
    OFFER.replace("a=rtcp-mux\r\n", ""),
    OFFER.replace("m=audio", "m=video").replace("opus/48000/2", "VP8/90000"),
    OFFER.replace("a=sendrecv", "a=inactive"),
    OFFER + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n",
    "v=0\r\n" + "a=x:" + "y" * (70 << 10),
])
def test_what_an_offer_must_hold_is_invalid_sdp(text):
    assert code(lambda: check_offer(text)) == "invalid_sdp"


def test_audio_without_opus_is_unsupported_codec():
    no_opus = OFFER.replace("111 0", "0").replace("a=rtpmap:111 opus/48000/2\r\n", "")
    assert code(lambda: check_offer(no_opus)) == "unsupported_codec"


async def test_a_client_secret_opens_one_session_until_it_expires():
    clock = VirtualClock()
    keys = ClientSecrets(clock, "w2")
    value, secret = keys.mint("sk-owner", "sess_x", None, 10, now_unix=1000)
    assert value.startswith("ek_") and value.endswith(".w2") and secret.expires_at_unix == 1010
    assert keys.redeem(value).owner_key == "sk-owner"
    assert code(lambda: keys.redeem(value)) == "client_secret_used"
    assert keys.owner(value) == "sk-owner"  # a resume or a sideband still passes
    other, _ = keys.mint(None, "sess_y", SessionPatch(type=SessionType.TRANSCRIPTION), 10, 1000)
    await clock.advance(10)
    assert code(lambda: keys.redeem(other)) == "client_secret_expired"
    assert code(lambda: keys.owner(value)) == "client_secret_expired"
    assert code(lambda: keys.redeem("ek_unknown")) == "unauthorized"
    assert code(lambda: keys.mint(None, "s", None, 9, 0)) == "invalid_value"
    keys.mint(None, "s", None, 10, 0)
    assert len(keys) == 1  # the expired ones were forgotten at the next mint


def test_client_secrets_are_bounded():
    keys = ClientSecrets(VirtualClock(), "w1", max_keys=3)
    first, _ = keys.mint(None, "s", None, 60, 0)
    for _ in range(3):
        keys.mint(None, "s", None, 60, 0)
    assert len(keys) == 3 and code(lambda: keys.redeem(first)) == "unauthorized"


async def test_the_reply_track_reports_and_clears_where_it_was():
    seen: list[tuple[str, str]] = []
    track = ReplyTrack(lambda kind, rid: seen.append((kind, rid)))
    fmt = AudioFormat(rate=24000)
    track.player.push("r1", "i1", np.full(2400, 9000, "<i2").tobytes(), fmt)  # 100 ms
    frames = [await track.recv() for _ in range(3)]  # 60 ms out, at real time
    assert seen == [("output_audio_buffer.started", "r1")]
    assert frames[0].sample_rate == 48000 and frames[0].samples == 960
    response, item, heard = track.player.clear()
    assert (response, item) == ("r1", "i1") and 55 <= heard <= 65
    assert seen[-1] == ("output_audio_buffer.cleared", "r1")
    track.player.push("r1", "i1", np.full(2400, 9000, "<i2").tobytes(), fmt)  # a cut reply stays cut
    assert not np.frombuffer(bytes((await track.recv()).planes[0]), "<i2").any()
    track.player.push("r2", "i2", np.full(480, 9000, "<i2").tobytes(), fmt)  # 20 ms, then done
    track.player.finish("r2")
    await track.recv()
    assert seen[-2:] == [("output_audio_buffer.started", "r2"), ("output_audio_buffer.stopped", "r2")]
    assert track.player.clear() is None  # nothing playing
    track.stop()


def test_watchers_follow_live_and_a_slow_one_is_cut_off_alone():
    outbox = Outbox(Journal(max_events=100, max_bytes=1 << 20, max_age_s=60),
                    OutboxLimits(max_events=2))
    main, _ = outbox.attach()
    fence = Fence("s")

    def publish(seq: int) -> None:
        assert outbox.publish(Envelope(seq, fence, SessionUpdated(session={})), 0)
        assert main.get_nowait().seq == seq  # the call's own channel reads on

    publish(1)
    side = outbox.watch()
    publish(2)
    publish(3)
    assert [side.get_nowait().seq for _ in range(2)] == [2, 3]  # no replay of 1
    for seq in (4, 5, 6):  # the sideband stops reading
        publish(seq)
    assert side.ended is Notice.SLOW_CONSUMER and outbox.attachment is main
    outbox.close()
    assert main.closed

