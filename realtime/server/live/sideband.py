"""One GPT-Live sideband (``WS /v1/live/sessions/{session_id}/attach``,
the SDK's ``live.sideband.connect``): a trusted server follows and drives a
live session another transport holds (``lines.py``).

- Attach: the key that owns the session; an unknown or ended session (or
  another key's): the ``error`` event ``session_not_found``, then close 1008.
  The first event is ``session.started`` with the session as it is now (the
  SDK says not to send ``session.start``: the session is running).
- Down: every server event of the session from then on -- the very frames
  the primary gets --, the caller's audio reflected
  (``session.input_audio.append``, PCM16 24 kHz, before the mute) and, on a
  SIP call, ``transport.dtmf.received``; then ``session.closed`` and close
  1000 when the session ends.
- Up: the SDK's ``ConnectClientEvent``s on the session's one codec: a
  ``mute`` gates the primary's microphone and is announced to all, a
  ``session.update`` is answered with this sideband's ``client_event_id``;
  ``transport.dtmf.send`` presses a key on a SIP call (``transport.dtmf.sent``
  once its packets are out; on a WebSocket session: ``capability_unsupported``).
  ``session.start`` and audio are the primary's: ``invalid_event``.
- Detaching never ends the session; attaching again (the SDK's reconnect
  does it, to the same URL) follows it on from then.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket
from vllm_duplex.domain.commands import AudioAppend
from vllm_duplex.domain.errors import Closed, DuplexError
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.live.lines import MAX_QUEUED, LiveLine, LiveLines
from vllm_duplex.realtime.server.websocket_frames import next_frame
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveAck, LiveDtmf, LiveStart
from vllm_duplex.realtime.wire.live.decisions import DecisionRun, ItemReply
from vllm_duplex.realtime.wire.live.delegated import each_command

log = logging.getLogger(__name__)

CLOSE_SLOW_SIDEBAND = 1008  # this sideband fell MAX_QUEUED frames behind; the session goes on


class LiveSideband:
    def __init__(self, sessions: RealtimeSessions, lines: LiveLines, ws: WebSocket) -> None:
        self.sessions = sessions
        self.lines = lines
        self.ws = ws
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._overflowed = False

    def _offer(self, text: str | None) -> None:
        """The line's fan-out into this sideband's queue (never waits)."""
        if self._overflowed:
            return
        if text is not None and self._queue.qsize() >= MAX_QUEUED:
            self._overflowed = True
            text = None
        self._queue.put_nowait(text)

    async def serve(self) -> None:
        key = bearer_key(self.ws.headers, list(self.ws.scope.get("subprotocols") or []))
        await self.ws.accept()
        try:
            self.sessions.check_key(key)
            line = self.lines.get(self.ws.path_params["session_id"], key)
            if not await line.running():  # it ended before its session.started
                raise DuplexError("session_not_found", "the session ended",
                                  param="session_id")
        except DuplexError as err:
            self.sessions.count_error(err.code)
            codec = LiveCodec(max_event_bytes=self.sessions.max_event_bytes,
                              model_aliases=self.sessions.model_aliases, clock=self.sessions.now)
            await self.ws.send_text(codec.render_error(err))
            await self.ws.close(code=1008, reason=err.code)
            return
        self._queue.put_nowait(line.codec.started())
        line.sidebands.add(self._offer)
        writer = asyncio.create_task(self._write(),
                                     name=f"duplex-live-sideband-{line.session_id}")
        try:
            await self._read(line)
        finally:
            line.sidebands.discard(self._offer)
            self._queue.put_nowait(None)
            await asyncio.gather(writer, return_exceptions=True)

    async def _write(self) -> None:
        try:
            while (text := await self._queue.get()) is not None:
                await self.ws.send_text(text)
            if self._overflowed:
                await self.ws.close(code=CLOSE_SLOW_SIDEBAND, reason="slow_consumer")
            else:
                await self.ws.close(code=1000, reason="session_closed")
        except Exception:  # the socket went away; the reader notices
            log.debug("live sideband writer stopped", exc_info=True)

    async def _read(self, line: LiveLine) -> None:
        while (frame := (await next_frame(self.ws))[0]) is not None:
            if line.ended.is_set():
                return
            try:
                await self._command(line, frame)
            except DuplexError as err:
                self.sessions.count_error(err.code)
                self._offer(line.port.error(err))
                if isinstance(err, Closed):
                    return

    async def _command(self, line: LiveLine, frame: str | bytes) -> None:
        command = line.codec.parse(frame)
        if isinstance(command, LiveStart):
            raise DuplexError("invalid_event", "a sideband attaches to a running session: "
                              "no session.start", param="type", event_id=command.event_id)
        if isinstance(command, AudioAppend):
            raise DuplexError("invalid_event", "a sideband sends no audio: the primary "
                              "transport carries the caller's", param="type",
                              event_id=command.event_id)
        if isinstance(command, (LiveAck, ItemReply)):
            line.publish(line.codec.render_ack(command))
            return
        if isinstance(command, DecisionRun):  # the primary socket's runner evaluates them
            raise DuplexError("capability_unsupported", "decision.create on a sideband is not "
                              "supported yet: send it on the primary socket", param="type",
                              event_id=command.event_id)
        if isinstance(command, LiveDtmf):
            try:
                await line.press(command.digit)
            except DuplexError as err:
                raise err.with_event_id(command.event_id) from None
            line.to_sidebands(line.codec.render_dtmf("transport.dtmf.sent", command.digit,
                                                     command.event_id))
            return
        for one in each_command(command):
            line.port.deliver(one)
