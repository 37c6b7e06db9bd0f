"""One accepted SIP call: a thin I/O shell around a realtime session, as
``webrtc/call.py``'s ``RtcCall`` is for a WebRTC call.

The session is opened through the same ``SessionPort`` as a socket's (the
same admission, capacity ceiling, keys and codec); its audio formats default to
the G.711 law the call negotiated, so the RTP payload is the session's
input as it arrives, and the reply's deltas are already G.711 at 8 kHz.

- RTP in (one UDP socket per call): G.711 payloads become
  ``input_audio_buffer.append`` (converted when a sideband changed the
  session's input format); RFC 4733 telephone-events become
  ``input_audio_buffer.dtmf_event_received`` on the sideband sockets; any
  other packet, or one from an address that is not the caller's, is dropped
  and counted (``dropped``) -- it never reaches the session.
- RTP out: one 20 ms packet every 20 ms from the ``ReplyPlayer`` (silence
  between replies), or a DTMF key pressed for the caller (``send_dtmf``:
  RFC 4733 telephone-events in place of the audio for their 140 ms, the
  reply waiting meanwhile). Speech over a reply (``input_audio_buffer.
  speech_started`` with ``interrupt_response``) empties the player at once:
  the next packet is silence. ``output_audio_buffer.clear`` from a sideband
  cuts the reply and truncates its item to what was sent.
- The call ends with its session: the caller's BYE, ``POST …/hangup``
  (we send BYE), the session closing, or a transfer (REFER) completing.
  Every task and the RTP socket end in ``hangup`` (``port/calls.py``'s
  ``Call``: what every call does the same way).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import Closed, DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat, SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.media.audio import AudioEncoder, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from vllm_duplex.realtime.server.port.calls import Call
from vllm_duplex.realtime.server.port.session_port import Codec, SessionPort, realtime_codec
from vllm_duplex.realtime.server.reply_player import ReplyPlayer
from vllm_duplex.realtime.server.telephony import rtp, sdp

log = logging.getLogger(__name__)

RATE = 8000  # G.711's clock
FRAME = RATE // 50  # samples in a 20 ms packet
_FRAME_S = FRAME / RATE
_MAX_RTP_BYTES = 1500


class Dialog(Protocol):
    """What a call asks of its SIP dialog (``sip_dialog``)."""

    peer_host: str  # where the INVITE came from

    async def bye(self) -> None: ...

    async def refer(self, target_uri: str) -> int: ...


def with_phone_formats(patch: SessionPatch | None, law: AudioEncoding) -> SessionPatch:
    """The accepted session, its audio in the call's G.711 law unless it says otherwise."""
    patch = patch or SessionPatch()
    phone = AudioFormat(law, RATE)
    return dataclasses.replace(patch, input_format=patch.get("input_format") or phone,
                               output_format=patch.get("output_format") or phone)


class _RtpProtocol(asyncio.DatagramProtocol):
    def __init__(self, call: SipCall) -> None:
        self.call = call

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.call._received(data, addr)

    def error_received(self, exc: Exception) -> None:  # ICMP unreachable: the caller is gone soon
        log.debug("call %s: RTP error %s", self.call.call_id, exc)


class SipCall(Call):
    task_prefix = "sip"

    def __init__(self, port: SessionPort, call_id: str, offer: sdp.Offer, dialog: Dialog,
                 dropped_metric: Any, *, on_end: Callable[[SipCall], None]) -> None:
        super().__init__(port, call_id, on_end=on_end)
        self.offer = offer
        self.dialog = dialog
        self.codec = port.codec
        self.player = ReplyPlayer(self._buffer_event, RATE)
        self.dropped = 0  # RTP packets dropped: malformed, unknown payload, stranger
        self.digits: list[str] = []  # DTMF received, in order
        self._law = offer.encoding
        self._sender = rtp.RtpSender(offer.payload_type)
        self._dtmf = rtp.DtmfReceiver()
        self._order = rtp.SequenceGate()
        self._dropped_metric = dropped_metric
        self._remote = (offer.address, offer.port)
        # Media may come from the SDP's address or the signalling peer's (a
        # phone on loopback announces its LAN address): from no one else.
        self._speakers = {offer.address, dialog.peer_host}
        self._encoder: tuple[AudioFormat, AudioEncoder] | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._send_bye = True  # the first hang-up decides: a caller's BYE needs none back
        # Keys to press, in order: each its packets and the future its sender awaits.
        self._tones: collections.deque[tuple[Iterator[bytes], asyncio.Future[None]]] = \
            collections.deque()

    # ---- set-up -----------------------------------------------------------------

    @classmethod
    async def open(cls, sessions: RealtimeSessions, call_id: str, key: str | None,
                   patch: SessionPatch | None, offer: sdp.Offer, media_host: str,
                   dialog: Dialog, on_end: Callable[[SipCall], None], *,
                   codec: Codec | None = None) -> SipCall:
        """Open the call's session and its RTP socket; the typed error of
        what failed, with nothing left open. ``codec``: the dialect of its
        session (OpenAI Realtime unless a route names another)."""
        port = await SessionPort.open(sessions, codec or realtime_codec(sessions), key,
                                      with_phone_formats(patch, offer.encoding),
                                      transport=SessionPatch.played_here())
        dropped = sessions.counter(
            "duplex_rtp_dropped_total", "RTP packets of calls dropped before the session, by reason")
        call = cls(port, call_id, offer, dialog, dropped, on_end=on_end)
        try:
            loop = asyncio.get_running_loop()
            call._transport, _ = await loop.create_datagram_endpoint(
                lambda: _RtpProtocol(call), local_addr=(media_host, 0))
        except BaseException:
            await call.hangup(send_bye=False)
            raise
        call._spawn(call._deliver(), "writer")
        call._spawn(call._send_audio(), "rtp-out")
        return call

    @property
    def rtp_port(self) -> int:
        assert self._transport is not None
        return self._transport.get_extra_info("sockname")[1]

    # ---- RTP in -----------------------------------------------------------------------

    def _drop(self, reason: str) -> None:
        self.dropped += 1
        self._dropped_metric.inc(reason=reason)

    def _received(self, data: bytes, addr: Any) -> None:
        if addr[0] not in self._speakers:
            self._drop("stranger")  # only the caller's media address may speak for the caller
            return
        try:
            if len(data) > _MAX_RTP_BYTES:
                raise rtp.RtpError("larger than any packet of a call")
            packet = rtp.parse(data)
            if packet.payload_type == self.offer.dtmf_payload_type:
                digit = self._dtmf.receive(packet)
                if digit is not None:
                    self.dtmf(digit)
                return
            if packet.payload_type != self.offer.payload_type or not packet.payload:
                self._drop("payload_type")
                return
        except rtp.RtpError:
            self._drop("malformed")
            return
        if not self._order.admit(packet):
            self._drop("late")
            return
        self._remote = (addr[0], addr[1])  # symmetric RTP: answer where it comes from (NAT)
        self._append(packet.payload)

    def _append(self, payload: bytes) -> None:
        fmt = self.port.config.input_format
        if fmt.encoding is not self._law or fmt.rate != RATE:  # a sideband changed it
            if self._encoder is None or self._encoder[0] != fmt:
                self._encoder = (fmt, AudioEncoder(fmt, in_rate=RATE))
            decode = ulaw_decode if self._law is AudioEncoding.PCMU else alaw_decode
            payload = self._encoder[1].encode(decode(payload))
            if not payload:
                return
        try:
            self.port.append_audio(payload)
        except Closed:
            self._hang_up_soon()
        except DuplexError:  # e.g. resource_exhausted: the session lags (counted)
            pass

    def dtmf(self, digit: str) -> None:
        """A key the caller pressed: to the sideband sockets, in order."""
        self.digits.append(digit)
        self._notify("input_audio_buffer.dtmf_event_received", event=digit,
                     received_at=int(time.time()))

    # ---- RTP out ----------------------------------------------------------------------

    async def _send_audio(self) -> None:
        """One packet every 20 ms at real time, from the reply player."""
        encode = ulaw_encode if self._law is AudioEncoding.PCMU else alaw_encode
        start, sent = time.monotonic(), 0
        while True:
            packet = self._tone_packet()
            if packet is None:
                pcm, speech = self.player.pull()
                packet = self._sender.packet(encode(pcm), FRAME, speech=speech)
            if self._transport is not None and not self._transport.is_closing():
                self._transport.sendto(packet, self._remote)
            sent += 1
            wait = start + sent * _FRAME_S - time.monotonic()
            if wait < -0.2:  # the loop stalled: restart the clock, do not burst
                start, sent = time.monotonic(), 0
            await asyncio.sleep(max(0.0, wait))

    def _tone_packet(self) -> bytes | None:
        """The next packet of the key being pressed, if any (its sender is
        told once the last one is out)."""
        while self._tones:
            packets, pressed = self._tones[0]
            packet = next(packets, None)
            if packet is not None:
                return packet
            self._tones.popleft()
            if not pressed.done():
                pressed.set_result(None)
        return None

    async def send_dtmf(self, digit: str) -> None:
        """Press ``digit`` (``rtp.DTMF_EVENTS``) for the caller's side: RFC
        4733 telephone-events on the call's RTP stream; returns once they are
        sent. ``capability_unsupported`` when the caller's SDP offered no
        telephone-event (nothing could carry the key)."""
        payload_type = self.offer.dtmf_payload_type
        if payload_type is None:
            raise DuplexError("capability_unsupported", "the caller's side offered no "
                              "telephone-event (RFC 4733): this call cannot carry DTMF",
                              param="event")
        pressed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tones.append((self._sender.tone(payload_type, digit, FRAME), pressed))
        await pressed

    # ---- the session's events ----------------------------------------------------------

    async def _follow(self, item: Envelope) -> None:
        self.player.follow(item.event, self.port.config)  # what the phone plays

    def _buffer_event(self, kind: str, response_id: str) -> None:
        self._notify(kind, response_id=response_id)

    def _cut_output(self) -> tuple[str, int] | None:
        cut = self.player.clear()
        if cut is None:
            return None
        _, item_id, heard_ms = cut
        return item_id, heard_ms

    async def refer(self, target_uri: str) -> int:
        """Transfer the caller (SIP REFER); the status the caller's side answered."""
        return await self.dialog.refer(target_uri)

    @staticmethod
    async def transfer(call: Call, target_uri: Any) -> None:
        """A REST refer of ``call`` to ``target_uri``, checked: a SIP, SIPS or
        tel URI, a SIP call, a caller's side that answers and agrees; else a
        typed error (``param`` the call's id as ``call_id``)."""
        if not isinstance(target_uri, str) or not target_uri.startswith(("sip:", "sips:", "tel:")) \
                or any(c in target_uri for c in "<>\r\n \t"):
            raise DuplexError("invalid_value", "target_uri is a sip:, sips: or tel: URI",
                              param="target_uri")
        if not isinstance(call, SipCall):
            raise DuplexError("capability_unsupported", "only a SIP call can be referred",
                              param="call_id")
        try:
            status = await call.refer(target_uri)
        except (asyncio.TimeoutError, ConnectionError):
            raise DuplexError("call_not_found", "the caller's side did not answer the REFER",
                              param="call_id") from None
        if not 200 <= status < 300:
            raise DuplexError("invalid_value", f"the caller's side refused the transfer "
                              f"(SIP {status})", param="target_uri")

    # ---- the end ------------------------------------------------------------------------

    async def hangup(self, *, send_bye: bool = True,
                     reason: CloseReason = CloseReason.HANGUP) -> None:
        """Idempotent: end the session (with ``reason``, unless it already
        closed with its own), say BYE unless the caller did, close the RTP
        socket, stop every task of the call."""
        if self._hanging_up_here():
            self._send_bye = send_bye
        await super().hangup(reason)

    async def _close_wire(self, reason: CloseReason) -> None:
        if self._transport is not None:
            self._transport.close()
        while self._tones:  # keys not pressed: their senders learn why
            _, pressed = self._tones.popleft()
            if not pressed.done():
                pressed.set_exception(DuplexError("session_closed", "the call ended before "
                                                  "the key was sent", param="event"))

    async def _after_stop(self, reason: CloseReason) -> None:
        if self._send_bye:
            try:
                await self.dialog.bye()
            except Exception:  # the caller is unreachable: the call is over anyway
                log.info("call %s: BYE failed", self.call_id, exc_info=True)
