"""One WebRTC call: a thin I/O shell around a realtime session, as
``RealtimeConnection`` is for a WebSocket.

``POST /v1/realtime/calls`` opens the session (the same runtime call as a
socket's, so the same admission, keys, client secrets and config), applies
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

Every task, the peer connection and its UDP sockets end in ``hangup``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.commands import AudioAppend, ItemTruncate, OutputAudioClear, SessionResume
from vllm_duplex.core.errors import Closed, DuplexError
from vllm_duplex.core.session_config import SessionPatch
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.webrtc.media import MicrophoneEncoder, ReplyTrack, mono_int16
from vllm_duplex.realtime.server.webrtc.offer import Offer
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.replay.outbox import Notice
from vllm_duplex.session.runner import DuplexSession

log = logging.getLogger(__name__)

CHANNEL = "oai-events"
_HIGH_WATER, _LOW_WATER = 1 << 20, 256 << 10  # data channel bytes buffered by SCTP


class RtcCall:
    def __init__(self, runtime: Runtime, call_id: str, session: DuplexSession,
                 *, on_end: Callable[[RtcCall], None]) -> None:
        self.runtime = runtime
        self.call_id = call_id
        self.session = session
        self.codec = RealtimeCodec(max_event_bytes=runtime.config.limits.max_event_bytes,
                                   model_aliases={n: runtime.model for n in runtime.config.model_names})
        webrtc = runtime.config.webrtc
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[
            RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
            for s in webrtc.ice_servers]))
        self.track = ReplyTrack(self._buffer_event)
        self.channel: Any = None
        self.sidebands: set[Callable[[str], Awaitable[None]]] = set()
        self._channel_ready = asyncio.Event()
        self._connected = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_end = on_end
        self._ended: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()

    # ---- set-up ---------------------------------------------------------------

    @classmethod
    async def answer(cls, runtime: Runtime, call_id: str, key: str | None, offer: Offer,
                     patch: SessionPatch | None, on_end: Callable[[RtcCall], None]
                     ) -> tuple[RtcCall, str]:
        """Open the call's session and answer ``offer``; the typed error of
        what failed, with nothing left open."""
        session = await runtime.open_realtime_session(key, patch,
                                                      transport=SessionPatch.played_here())
        call = cls(runtime, call_id, session, on_end=on_end)
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
        self._spawn(self._write(), "writer")
        self._spawn(self._watch_connect(), "connect")

    def _spawn(self, coro: Awaitable[Any], what: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"duplex-rtc-{what}-{self.call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        session = self.session
        try:
            command = self.codec.parse(message)
            if isinstance(command, SessionResume):
                raise DuplexError("invalid_event", "a call has no resume: its session ends "
                                  "with it", param="type", event_id=command.event_id)
            if isinstance(command, OutputAudioClear):
                self.clear_output()
                return
            session.deliver(command, self.runtime.clock.now())
        except DuplexError as err:
            self.runtime.metrics.errors.inc(code=err.code)
            self._send_now(self.codec.render_error(err, session.fence))

    # ---- the microphone ----------------------------------------------------------

    async def _microphone(self, track: MediaStreamTrack) -> None:
        encoder = MicrophoneEncoder()
        session, clock = self.session, self.runtime.clock
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return  # the caller's track ended
            audio = encoder.encode(mono_int16(frame), session.config.input_format)
            if not audio:
                continue
            try:
                session.deliver(AudioAppend(audio=audio), clock.now())
            except Closed:
                return
            except DuplexError as err:  # e.g. resource_exhausted: the session lags
                self.runtime.metrics.errors.inc(code=err.code)
                self._send_now(self.codec.render_error(err, session.fence))

    # ---- the session's events ----------------------------------------------------

    async def _write(self) -> None:
        session = self.session
        att = session.attachment
        await self._channel_ready.wait()
        if att is None:
            return
        track = self.track
        while True:
            item = await att.get()
            if item is None or isinstance(item, Notice):
                break
            if track.player.follow(item.event, session.config):
                continue  # reply audio: on the track, not the channel
            text = self.codec.render(item)
            if text is not None:
                await self._send(text)
        self._hang_up_soon()  # the session ended (or this call was cut off)

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
        """From the reply track: a WebRTC-only ``output_audio_buffer.*`` event."""
        text = self.codec.render_notice(kind, self.session.fence, response_id=response_id)
        self._send_now(text)
        for send in list(self.sidebands):
            self._spawn(send(text), "sideband")

    def clear_output(self) -> None:
        """``output_audio_buffer.clear``: cut the reply off where the caller is,
        and keep only that much of its item (what a client's truncate does)."""
        cut = self.track.player.clear()
        if cut is None:
            return
        response_id, item_id, heard_ms = cut
        try:
            self.session.deliver(ItemTruncate(item_id=item_id, content_index=0,
                                              audio_end_ms=heard_ms), self.runtime.clock.now())
        except DuplexError:
            pass  # the session is closing

    # ---- the end -------------------------------------------------------------------

    async def _watch_connect(self) -> None:
        try:
            await asyncio.wait_for(self._connected.wait(),
                                   self.runtime.config.webrtc.connect_timeout_s)
        except asyncio.TimeoutError:
            log.info("call %s: the peer did not connect; hanging up", self.call_id)
            self._hang_up_soon()

    def _hang_up_soon(self) -> None:
        if self._ended is None:
            self._ended = asyncio.ensure_future(self.hangup())

    async def hangup(self) -> None:
        """Idempotent: end the session, close the peer connection (its UDP
        sockets), stop every task of the call."""
        if self.ended.is_set():
            return
        current = asyncio.current_task()
        if self._ended is not None and self._ended is not current:
            await self._ended
            return
        self._ended = self._ended or current
        self._on_end(self)
        await self.runtime.end_session(self.session, self.session.close_reason or CloseReason.HANGUP)
        self.track.stop()
        await self.pc.close()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.ended.set()


class Calls:
    """The live calls of this process, by call id: WebRTC calls, and SIP calls
    (``telephony/sip_call.py``, the same surface: ``call_id``, ``session``,
    ``sidebands``, ``clear_output``, ``hangup``), so sideband sockets and
    ``…/hangup`` reach both."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._calls: dict[str, RtcCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: RtcCall) -> None:
        self._calls[call.call_id] = call

    def remove(self, call: RtcCall) -> None:
        if self._calls.get(call.call_id) is call:
            del self._calls[call.call_id]

    def get(self, call_id: str, api_key: str | None) -> RtcCall:
        """The call, for the key that owns its session (a client secret acts
        as its minting key); any other key, an unknown or ended call:
        ``call_not_found`` (no existence leak)."""
        call = self._calls.get(call_id)
        try:
            if call is None:
                raise DuplexError("session_not_found", "no such call")
            self.runtime.manager.get(call.session.session_id, self.runtime.caller_key(api_key))
        except DuplexError:
            raise DuplexError("call_not_found", f"no call {call_id!r} for this key",
                              param="call_id") from None
        return call

    async def close(self) -> None:
        await asyncio.gather(*(c.hangup() for c in list(self._calls.values())),
                             return_exceptions=True)
