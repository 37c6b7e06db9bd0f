"""One WebRTC call: a thin I/O shell around a realtime session, as
``RealtimeConnection`` is for a WebSocket.

``POST /v1/realtime/calls`` opens the session (through the same
``SessionPort`` as a socket's, so the same admission, keys, client secrets
and config), applies
the caller's SDP offer to an aiortc peer connection and answers it. Then:

- the data channel ``oai-events`` carries exactly the socket's events, both
  ways, through the same codec -- except the reply's audio deltas, which go
  out on the call's audio track instead (``media.ReplyTrack``), as OpenAI's
  calls do;
- the caller's microphone track becomes ``input_audio_buffer.append``
  commands (``media.MicrophoneEncoder``);
- ``output_audio_buffer.started`` / ``.stopped`` / ``.cleared`` (no ``seq``:
  they are about this call's player, not the session) tell what the track
  plays; ``output_audio_buffer.clear`` from the caller cuts it, and the
  item is truncated to what was sent of it (``conversation.item.truncate``,
  as a WebSocket client would send with its played milliseconds);
- sideband WebSockets (``/v1/realtime?call_id=…``, the same API key) follow
  and drive the session too (``connection.py``);
- the call ends with its session: the peer hangs up (its connection fails
  or closes, or its data channel closes), ``POST …/hangup``, the session
  closes, or the peer never connects within ``webrtc.connect_timeout_s``.
  A call has no resume: its session ends with it.

Every task, the peer connection and its UDP sockets end in ``hangup``
(``port/calls.py``'s ``Call``: what every call does the same way).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import Closed, DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.deploy import WebRtc
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.port.calls import Call
from vllm_duplex.realtime.server.port.session_port import Codec, Rules, SessionPort, realtime_codec
from vllm_duplex.realtime.server.webrtc.media import MicrophoneEncoder, ReplyTrack, mono_int16
from vllm_duplex.realtime.server.webrtc.offer import Offer

log = logging.getLogger(__name__)

CHANNEL = "oai-events"
_HIGH_WATER, _LOW_WATER = 1 << 20, 256 << 10  # data channel bytes buffered by SCTP


class RtcCall(Call):
    task_prefix = "rtc"

    def __init__(self, port: SessionPort, settings: WebRtc, call_id: str,
                 *, on_end: Callable[[RtcCall], None]) -> None:
        super().__init__(port, call_id, on_end=on_end)
        self.settings = settings
        self.codec = port.codec
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[
            RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
            for s in settings.ice_servers]))
        self.track = ReplyTrack(self._buffer_event)
        self.channel: Any = None
        # The data channel's rules over the port: a call has no resume, and
        # its clear cuts the track.
        self.rules = Rules("a call has no resume: its session ends with it", clear=self.clear_output)
        self._channel_ready = asyncio.Event()
        self._connected = asyncio.Event()

    # ---- set-up ---------------------------------------------------------------

    @classmethod
    async def answer(cls, sessions: RealtimeSessions, settings: WebRtc, call_id: str,
                     key: str | None, offer: Offer, patch: SessionPatch | None,
                     on_end: Callable[[RtcCall], None], *,
                     codec: Codec | None = None) -> tuple[RtcCall, str]:
        """Open the call's session and answer ``offer``; the typed error of
        what failed, with nothing left open. ``codec``: the data channel's
        dialect (OpenAI Realtime unless a route names another)."""
        port = await SessionPort.open(sessions, codec or realtime_codec(sessions), key, patch,
                                      transport=SessionPatch.played_here())
        call = cls(port, settings, call_id, on_end=on_end)
        try:
            sdp = await call._negotiate(offer)
        except BaseException:
            await call.hangup()
            raise
        call._start()
        return call, sdp

    async def _negotiate(self, offer: Offer) -> str:
        pc = self.pc
        pc.on("datachannel", self._on_channel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)
        if not offer.data_channel:
            self._channel_ready.set()  # events go to sideband sockets only
        # Opus only (the offer was checked to have it), one track each way.
        transceiver = pc.addTransceiver(self.track, direction="sendrecv")
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs
                if c.mimeType.lower() == "audio/opus"]
        transceiver.setCodecPreferences(opus)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer.sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())  # gathers the candidates
        except (ValueError, KeyError, IndexError, TypeError, AssertionError) as exc:
            raise DuplexError("invalid_sdp", f"the SDP offer cannot be answered ({exc})",
                              param="sdp") from None
        except Exception as exc:  # aiortc's OperationError / InvalidStateError
            raise DuplexError("invalid_sdp", f"the SDP offer cannot be answered "
                              f"({type(exc).__name__}: {exc})", param="sdp") from None
        return pc.localDescription.sdp

    def _start(self) -> None:
        self._spawn(self._deliver(), "writer")
        self._spawn(self._watch_connect(), "connect")

    # ---- the peer's events ----------------------------------------------------

    def _on_channel(self, channel: Any) -> None:
        if channel.label != CHANNEL or self.channel is not None:
            channel.close()  # one oai-events channel per call
            return
        self.channel = channel
        channel.bufferedAmountLowThreshold = _LOW_WATER
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._hang_up_soon())
        if channel.readyState == "open":
            self._opened()
        else:
            channel.on("open", self._opened)

    def _opened(self) -> None:
        self._connected.set()
        self._channel_ready.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._microphone(track), "mic")

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self._connected.set()
        elif state in ("failed", "closed"):
            self._hang_up_soon()

    def _on_message(self, message: str | bytes) -> None:
        """One data-channel message: the same rules as a socket's frame."""
        try:
            self.port.feed(message, self.rules)
        except DuplexError as err:
            self._send_now(self.port.error(err))

    # ---- the microphone ----------------------------------------------------------

    async def _microphone(self, track: MediaStreamTrack) -> None:
        encoder = MicrophoneEncoder()
        port = self.port
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return  # the caller's track ended
            audio = self._heard(encoder.encode(mono_int16(frame), port.config.input_format))
            if not audio:
                continue
            try:
                port.append_audio(audio)
            except Closed:
                return
            except DuplexError as err:  # e.g. resource_exhausted: the session lags
                self._send_now(port.error(err))

    def _heard(self, audio: bytes) -> bytes:
        """The microphone's audio as the session gets it (a dialect's gate)."""
        return audio

    # ---- the session's events ----------------------------------------------------

    async def _deliver(self) -> None:
        await self._channel_ready.wait()
        await super()._deliver()

    async def _follow(self, item: Envelope) -> None:
        if self.track.player.follow(item.event, self.port.config):
            return  # reply audio: on the track, not the channel
        text = self.codec.render(item)
        if text is not None:
            await self._send(text)

    async def _send(self, text: str) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        if channel.bufferedAmount > _HIGH_WATER:  # the peer reads slowly: wait, bounded
            low = asyncio.Event()
            channel.once("bufferedamountlow", low.set)
            await low.wait()
        self._send_now(text)

    def _send_now(self, text: str) -> None:
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)

    def _buffer_event(self, kind: str, response_id: str) -> None:
        """From the reply track: a WebRTC-only ``output_audio_buffer.*`` event,
        on the data channel and to the sidebands."""
        text = self.codec.render_notice(kind, self.port.fence, response_id=response_id)
        self._send_now(text)
        self._to_sidebands(text)

    def _cut_output(self) -> tuple[str, int] | None:
        cut = self.track.player.clear()
        if cut is None:
            return None
        _, item_id, heard_ms = cut
        return item_id, heard_ms

    # ---- the end -------------------------------------------------------------------

    async def _watch_connect(self) -> None:
        try:
            await asyncio.wait_for(self._connected.wait(), self.settings.connect_timeout_s)
        except asyncio.TimeoutError:
            log.info("call %s: the peer did not connect; hanging up", self.call_id)
            self._hang_up_soon()

    async def _close_wire(self, reason: CloseReason) -> None:
        """The peer connection and its UDP sockets."""
        self.track.stop()
        await self.pc.close()
