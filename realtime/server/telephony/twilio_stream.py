"""One Twilio Media Stream (``WS /v1/telephony/twilio/stream``): a thin I/O
shell around a realtime session, as ``webrtc/call.py`` is for a WebRTC call.

Twilio connects, says ``connected``, then ``start``; the start's stream token
(``twilio_auth``) names the call and its session profile, and the session
opens then -- through the same ``SessionPort`` as a socket's, so the same
admission, capacity ceiling and config -- in ``audio/pcmu`` both ways: Twilio's μ-law
goes into ``input_audio_buffer.append`` as it comes, and the reply's μ-law
goes out as it comes, with no transcoding.

- Each piece of reply audio goes out as ``media`` followed by a ``mark``;
  Twilio's echoes of the marks say what the caller has heard
  (``twilio_playout``).
- Speech over the reply (the session's ``speech_started``, when turn
  detection interrupts) sends ``clear``: Twilio drops what it had not played.
  When the session then cuts the reply (``conversation.item.truncated`` at
  its own estimate), the item is truncated again to what the marks say was
  heard, if that is less: the context keeps only what the caller heard. If
  the speech was a backchannel, the reply resumes where the session says.
- ``dtmf`` becomes ``input_audio_buffer.dtmf_event_received`` on the call's
  sideband sockets (``/v1/realtime?call_id=tw_…``, the key that owns the
  call), as OpenAI's SIP calls report keypad presses. A sideband follows and
  drives the session as for a WebRTC call, and its
  ``output_audio_buffer.clear`` clears Twilio's buffer and truncates there.
- ``stop``, the socket closing, or the session closing ends the call; the
  session closes with ``hangup`` (or its own reason: ``port/calls.py``'s
  ``Call``, what every call does the same way).

A frame we cannot read (not JSON, an unknown event, bad base64, oversized)
is counted in ``duplex_errors_total`` by its code, logged, and dropped: one
bad frame does not hang up a phone call. A protocol violation that leaves
nothing to talk to -- media before ``start``, a second ``start``, another
audio format, a start without a valid token -- closes the stream with the
error's code as the close reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import Capacity, Closed, DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat, SessionPatch
from vllm_duplex.media.audio import AudioDecoder, AudioEncoder
from vllm_duplex.realtime.server.port.calls import Call
from vllm_duplex.realtime.server.port.session_port import SessionPort
from vllm_duplex.realtime.server.reply_player import wire_format
from vllm_duplex.realtime.server.telephony import twilio_codec as tw
from vllm_duplex.realtime.server.telephony.twilio_playout import Cut, Playout

log = logging.getLogger(__name__)

PCMU_8K = AudioFormat(AudioEncoding.PCMU, 8000)
START_TIMEOUT_S = 10.0  # Twilio sends start right after connected
# Close codes: 1008 a protocol or policy violation, 1003 data we cannot take,
# 1013 try again later (at capacity); 1000 otherwise (with the session's reason).
_CLOSE_FOR = {"unsupported_audio_format": 1003}


class Refused(Exception):
    """The stream cannot go on: close it with ``err``'s code as the reason."""

    def __init__(self, err: DuplexError) -> None:
        super().__init__(err.message)
        self.err = err


class TwilioCall(Call):
    """One stream's call (see the module docstring). ``call_id``,
    ``session``, ``sidebands``, ``clear_output`` and ``hangup`` are what a
    sideband socket uses, as of every call."""

    task_prefix = "twilio"

    def __init__(self, port: SessionPort, ws: WebSocket, start: tw.Start, call_id: str,
                 on_end: Callable[[TwilioCall], None]) -> None:
        super().__init__(port, call_id, on_end=on_end)
        self.ws = ws
        self.start = start
        self.codec = port.codec
        self.playout = Playout()
        self._send_lock = asyncio.Lock()
        self._formats: dict[str, AudioFormat] = {}  # response id -> its output format
        self._transcoders: dict[str, tuple[AudioDecoder, AudioEncoder]] = {}
        self._started: set[str] = set()  # responses whose audio went out
        self._finished: set[str] = set()  # responses whose audio is all out
        self._cut: set[str] = set()  # responses cleared: their audio is dropped until resumed
        self._heard: dict[str, int] = {}  # item cut by a clear -> ms the caller heard

    # ---- the stream ---------------------------------------------------------

    async def run(self) -> None:
        """Until the call ends: Twilio's frames in, the session's audio out."""
        writer = self._spawn(self._deliver(), "writer")
        writer.add_done_callback(lambda _: self._hang_up_soon())  # a failed send ends it too
        try:
            await self._read()
        finally:
            await self.hangup()  # the caller hung up, unless the session ended first

    async def _read(self) -> None:
        while (frame := await receive(self.ws)) is not None:
            try:
                message = tw.parse(frame)
                if isinstance(message, tw.Media):
                    if message.track.startswith("inbound") and message.audio:
                        self._media(message.audio)
                elif isinstance(message, tw.Mark):
                    self._echoed(message.name)
                elif isinstance(message, tw.Dtmf):
                    self._dtmf(message.digit)
                elif isinstance(message, tw.Stop):
                    log.info("twilio call %s (%s): stop", self.call_id, self.start.call_sid)
                    return
                elif isinstance(message, tw.Start):
                    raise DuplexError("invalid_event", "a second start on one stream",
                                      param="event")
            except Closed:
                return  # the session ended: the writer closes the stream
            except DuplexError as err:
                self._bad_frame(err)

    def _media(self, audio: bytes) -> None:
        try:
            self.port.append_audio(audio)
        except Closed:
            raise
        except DuplexError as err:  # e.g. resource_exhausted: counted by the port
            self._dropped(err)

    def _bad_frame(self, err: DuplexError) -> None:
        """A frame Twilio's codec could not take: counted, then dropped."""
        self.port.sessions.count_error(err.code)
        self._dropped(err)

    def _dropped(self, err: DuplexError) -> None:
        """One frame dropped, not the call: logged, told to the sidebands."""
        log.warning("twilio call %s: dropped a frame: %s (%s)", self.call_id, err.code, err.message)
        self._to_sidebands(self.port.error(err))

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            await self.ws.send_text(text)

    # ---- the session's events -----------------------------------------------

    async def _follow(self, item: Envelope) -> None:
        session = self.session
        event = item.event
        if isinstance(event, ev.OutputAudioDelta):
            await self._play(event)
        elif isinstance(event, ev.ResponseCreated):
            raw = (event.response.get("audio") or {}).get("output") or {}
            self._formats[event.response["id"]] = wire_format(raw.get("format"),
                                                              session.config.output_format)
        elif isinstance(event, ev.ResponseDone):
            self._response_done(event.response)
        elif isinstance(event, ev.SpeechStarted):
            td = session.config.turn_detection
            if td is None or td.interrupt_response:
                await self._clear()  # the caller stops hearing the reply at once
        elif isinstance(event, ev.OutputAudioResumed):
            self._cut.discard(event.response_id)
            self._heard.pop(event.item_id, None)
            self.playout.seek(event.item_id, event.audio_start_ms)
        elif isinstance(event, ev.ConversationItemTruncated):
            heard = self._heard.pop(event.item_id, None)
            if heard is not None and heard < event.audio_end_ms:
                self.port.truncate(event.item_id, heard)

    async def _play(self, event: ev.OutputAudioDelta) -> None:
        response_id = event.response_id
        if response_id in self._cut or not event.delta:
            return
        audio = self._mulaw(response_id, event.delta)
        if not audio:
            return
        if response_id not in self._started:
            self._started.add(response_id)
            self._notice("output_audio_buffer.started", response_id)
        name = self.playout.sent(response_id, event.item_id, len(audio) / 8)  # 8 samples a ms
        await self._send(tw.media(self.start.stream_sid, audio))
        await self._send(tw.mark(self.start.stream_sid, name))

    def _mulaw(self, response_id: str, data: bytes) -> bytes:
        """A delta as Twilio's μ-law at 8 kHz (as it is, in a phone session,
        unless a response asked for another output format)."""
        fmt = self._formats.get(response_id, self.port.config.output_format)
        if fmt == PCMU_8K:
            return data
        pair = self._transcoders.get(response_id)
        if pair is None:
            pair = self._transcoders[response_id] = (AudioDecoder(fmt, out_rate=8000),
                                                     AudioEncoder(PCMU_8K, in_rate=8000))
        return pair[1].encode(pair[0].decode(data))

    def _response_done(self, response: dict[str, Any]) -> None:
        response_id = response["id"]
        self._formats.pop(response_id, None)
        self._transcoders.pop(response_id, None)
        self._cut.discard(response_id)
        for item in response.get("output") or ():
            self.playout.forget(item.get("id", ""))
        if response_id in self._started:
            self._finished.add(response_id)
            if self.playout.playing != response_id:
                self._stopped(response_id)

    def _echoed(self, name: str) -> None:
        piece = self.playout.echoed(name)
        if piece is not None and piece.response_id in self._finished \
                and self.playout.playing != piece.response_id:
            self._stopped(piece.response_id)

    def _stopped(self, response_id: str) -> None:
        self._finished.discard(response_id)
        self._started.discard(response_id)
        self._notice("output_audio_buffer.stopped", response_id)

    async def _clear(self) -> None:
        """Barge-in: Twilio drops what it has not played; the cut item's
        heard length waits for the session's own truncation (see above)."""
        cut = self._stop_playing()
        if cut is None:
            return
        self._heard[cut.item_id] = cut.heard_ms
        await self._send(tw.clear(self.start.stream_sid))
        self._notice("output_audio_buffer.cleared", cut.response_id)

    def _cut_output(self) -> tuple[str, int] | None:
        """A sideband's ``output_audio_buffer.clear``: Twilio drops what it
        has not played, and the item keeps what the marks say was heard."""
        cut = self._stop_playing()
        if cut is None:
            return None
        self._spawn(self._send(tw.clear(self.start.stream_sid)), "clear")
        self._notice("output_audio_buffer.cleared", cut.response_id)
        return cut.item_id, cut.heard_ms

    def _stop_playing(self) -> Cut | None:
        """The reply's audio stops here (its later deltas are dropped until
        the session resumes it); the cut, if anything was playing."""
        cut = self.playout.clear()
        if cut is not None:
            self._cut.add(cut.response_id)
            self._started.discard(cut.response_id)
            self._finished.discard(cut.response_id)
        return cut

    def _dtmf(self, digit: str) -> None:
        log.info("twilio call %s: dtmf %s", self.call_id, digit)
        # No fence on Twilio's keypad event (SIP's carries one): as it always was.
        self._to_sidebands(self.codec.render_notice(
            "input_audio_buffer.dtmf_event_received", event=digit, received_at=int(time.time())))

    # ---- sidebands ------------------------------------------------------------

    def _notice(self, kind: str, response_id: str) -> None:
        """A call-only ``output_audio_buffer.*`` event, for the sidebands."""
        self._notify(kind, response_id=response_id)

    # ---- the end ----------------------------------------------------------------

    async def _close_wire(self, reason: CloseReason) -> None:
        try:
            await self.ws.close(code=reason.code, reason=reason.value)
        except Exception:  # the socket is already gone: nothing to tell
            pass

    async def _after_stop(self, reason: CloseReason) -> None:
        log.info("twilio call %s (%s) ended: %s", self.call_id, self.start.call_sid, reason.value)


async def receive(ws: WebSocket) -> str | bytes | None:
    """The next frame, or None when the socket ended."""
    try:
        message = await ws.receive()
    except (WebSocketDisconnect, RuntimeError):
        return None
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    return text if text is not None else (message.get("bytes") or b"")


async def await_start(ws: WebSocket, count_error: Callable[[str], None]) -> tw.Start | None:
    """Frames up to ``start`` (``connected`` and unreadable frames are
    passed over); None when the socket ended first. Media, or anything else
    that needs a call, before it: ``Refused``."""
    async def first_start() -> tw.Start | None:
        while (frame := await receive(ws)) is not None:
            try:
                message = tw.parse(frame)
            except DuplexError as err:
                count_error(err.code)
                log.warning("twilio stream: dropped a frame before start: %s (%s)",
                            err.code, err.message)
                continue
            if isinstance(message, tw.Start):
                return message
            if isinstance(message, tw.Stop):
                return None
            if not isinstance(message, tw.Connected):
                raise Refused(DuplexError("invalid_event", f"{type(message).__name__.lower()} "
                                          "before start", param="event"))
        return None

    try:
        return await asyncio.wait_for(first_start(), START_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise Refused(DuplexError("invalid_event", f"no start within {START_TIMEOUT_S:g} s",
                                  param="event")) from None


def phone_patch(profile: SessionPatch | None) -> SessionPatch:
    """A profile's session, in Twilio's μ-law both ways (whatever it says)."""
    phone = SessionPatch(input_format=PCMU_8K, output_format=PCMU_8K)
    return phone.over(profile) if profile is not None else phone


async def refuse(ws: WebSocket, err: DuplexError, count_error: Callable[[str], None]) -> None:
    count_error(err.code)
    code = 1013 if isinstance(err, Capacity) else _CLOSE_FOR.get(err.code, 1008)
    log.warning("twilio stream refused: %s (%s)", err.code, err.message)
    try:
        await ws.close(code=code, reason=err.code)
    except Exception:
        pass
