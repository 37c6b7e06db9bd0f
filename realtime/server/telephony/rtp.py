"""RTP (RFC 3550) and RFC 4733 DTMF, sans-I/O: packets in and out as bytes.

- ``parse(data)`` reads one packet; a malformed one is an ``RtpError``
  (the call drops and counts it; it never reaches the session).
- ``RtpSender`` numbers and stamps what we send: one SSRC, sequence numbers
  and 8 kHz timestamps that run on, with the marker bit on the first packet
  of a talk spurt; ``tone`` sends one DTMF key as RFC 4733
  telephone-events in the same stream.
- ``SequenceGate`` drops duplicates and late packets of the caller's audio.
- ``DtmfReceiver`` turns telephone-event packets into digits, once each:
  a sender repeats an event's packets (and its end packet three times), all
  with the event's timestamp, so a digit is reported at its first packet
  and its repeats are ignored.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass

HEADER = struct.Struct("!BBHII")
DTMF_EVENTS = "0123456789*#ABCD"  # RFC 4733 event codes 0-15
TONE_FRAMES = 5  # a key we press: 100 ms of tone (20 ms packets), then its end
_TONE_VOLUME = 10  # -10 dBm0, RFC 4733's usual level


class RtpError(ValueError):
    pass


@dataclass(frozen=True)
class RtpPacket:
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False

    def encode(self) -> bytes:
        return HEADER.pack(0x80, (0x80 if self.marker else 0) | self.payload_type,
                           self.sequence & 0xFFFF, self.timestamp & 0xFFFFFFFF,
                           self.ssrc) + self.payload


def parse(data: bytes) -> RtpPacket:
    if len(data) < HEADER.size:
        raise RtpError("shorter than an RTP header")
    first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
    if first >> 6 != 2:
        raise RtpError("not RTP version 2")
    offset = HEADER.size + 4 * (first & 0x0F)  # CSRCs
    if first & 0x10:  # a header extension: skip it
        if len(data) < offset + 4:
            raise RtpError("truncated header extension")
        offset += 4 + 4 * struct.unpack_from("!H", data, offset + 2)[0]
    end = len(data)
    if first & 0x20:  # padding: its last byte counts it
        if end <= offset or data[-1] == 0 or data[-1] > end - offset:
            raise RtpError("bad padding")
        end -= data[-1]
    if offset > end:
        raise RtpError("truncated packet")
    pt = second & 0x7F
    if 72 <= pt <= 76:
        raise RtpError("an RTCP packet on the RTP port")
    return RtpPacket(pt, sequence, timestamp, ssrc, bytes(data[offset:end]), bool(second & 0x80))


class RtpSender:
    """Sequence, timestamp and SSRC of one outgoing stream."""

    def __init__(self, payload_type: int, *, ssrc: int | None = None,
                 sequence: int | None = None, timestamp: int | None = None) -> None:
        self.payload_type = payload_type
        self.ssrc = secrets.randbits(32) if ssrc is None else ssrc
        self._seq = secrets.randbits(16) if sequence is None else sequence
        self._ts = secrets.randbits(32) if timestamp is None else timestamp
        self._talking = False

    def packet(self, payload: bytes, samples: int, *, speech: bool = True) -> bytes:
        """The next packet of ``payload`` (``samples`` long at 8 kHz);
        ``speech`` False between replies (silence): the next speech packet
        carries the marker bit (a new talk spurt, RFC 3551 §4.1)."""
        marker = speech and not self._talking
        self._talking = speech
        out = RtpPacket(self.payload_type, self._seq, self._ts, self.ssrc, payload, marker).encode()
        self._seq = (self._seq + 1) & 0xFFFF
        self._ts = (self._ts + samples) & 0xFFFFFFFF
        return out

    def tone(self, payload_type: int, digit: str, samples: int) -> Iterator[bytes]:
        """One DTMF key as RFC 4733 telephone-event packets, one per
        ``samples``-long frame, pulled as the frames go out (their sequence
        numbers run on between the audio packets around them): every packet
        carries the event's start timestamp and its growing duration, the first
        the marker bit, the last -- the end (E bit) -- three times (RFC 4733
        §2.5.1.4). The audio after it goes on at the event's end."""
        event = DTMF_EVENTS.index(digit)
        start = self._ts
        for frame in range(1, TONE_FRAMES + 1):
            last = frame == TONE_FRAMES
            payload = struct.pack("!BBH", event, (0x80 if last else 0) | _TONE_VOLUME,
                                  frame * samples)
            for _ in range(3 if last else 1):
                yield RtpPacket(payload_type, self._seq, start, self.ssrc, payload,
                                frame == 1).encode()
                self._seq = (self._seq + 1) & 0xFFFF
        self._ts = (start + TONE_FRAMES * samples) & 0xFFFFFFFF
        self._talking = False  # the next speech is a new talk spurt


class SequenceGate:
    """Lets each packet of a stream through once, in order: a duplicate or
    one older than the newest seen (within half the 16-bit sequence space)
    is refused -- appending it would repeat or scramble the caller's audio.
    A jump ahead (loss) passes."""

    def __init__(self) -> None:
        self._newest: int | None = None

    def admit(self, packet: RtpPacket) -> bool:
        if self._newest is not None:
            ahead = (packet.sequence - self._newest) & 0xFFFF
            if ahead == 0 or ahead >= 0x8000:
                return False
        self._newest = packet.sequence
        return True


class DtmfReceiver:
    """RFC 4733 telephone-events of one stream -> digits, in order, once each."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None  # (ssrc, timestamp) of the last event

    def receive(self, packet: RtpPacket) -> str | None:
        """The digit ``packet`` starts, or None (a repeat, an end packet of
        a digit already reported, an event that is no key)."""
        if len(packet.payload) < 4:
            raise RtpError("a telephone-event payload is 4 bytes")
        event = packet.payload[0]
        key = (packet.ssrc, packet.timestamp)
        if key == self._last:
            return None
        self._last = key
        return DTMF_EVENTS[event] if event < len(DTMF_EVENTS) else None
