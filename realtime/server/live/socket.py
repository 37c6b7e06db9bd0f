"""One GPT-Live WebSocket (``/v1/live/sessions``): a thin I/O loop around a
``SessionPort`` with the GPT-Live codec (``realtime/wire/live/codec.py``).

The same port and ``SessionCore`` as ``/v1/realtime``; what differs is the
dialect's few rules, kept here:

- The first event is ``session.start``; the session opens with its config
  (anything else first is answered with an error, and the socket waits).
- The session is *played here*: the server paces its audio
  (``SessionPatch.played_here``), because a GPT-Live client plays every
  frame it gets and has no ``output_audio_buffer.clear`` or truncate; pacing
  is what makes a barge-in stop the voice the client hears.
- Mute and unmute are the codec's gate, acknowledged on the wire at once.
- One client event may be several commands (``LiveCommands``: an answer to
  a delegation and the reply it asks for), and one session event several
  GPT-Live events (``render_all``); a reply the codec asked for while
  another was shown is delivered when the writer has seen that one end
  (``LiveCodec.due``).
- There is no resume: a GPT-Live reconnect is a new session (the SDK and
  LiveKit start one), so when the socket ends, the session ends with it.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import Capacity, Closed, DuplexError
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.port.session_port import SessionPort
from vllm_duplex.realtime.server.websocket_frames import next_frame
from vllm_duplex.realtime.wire.live.codec import LiveAck, LiveCodec, LiveStart
from vllm_duplex.realtime.wire.live.delegated import LiveCommands

log = logging.getLogger(__name__)


class LiveSocket:
    def __init__(self, sessions: RealtimeSessions, ws: WebSocket) -> None:
        self.sessions = sessions
        self.ws = ws
        self.codec = LiveCodec(max_event_bytes=sessions.max_event_bytes,
                               model_aliases=sessions.model_aliases, clock=sessions.now,
                               default_instructions=sessions.session_config().instructions)
        self._send_lock = asyncio.Lock()

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            await self.ws.send_text(text)

    async def serve(self) -> None:
        offered = list(self.ws.scope.get("subprotocols") or [])
        key = bearer_key(self.ws.headers, offered)
        await self.ws.accept()
        try:
            self.sessions.check_key(key)
        except DuplexError as err:
            await self._send(self.codec.render_error(err))
            await self.ws.close(code=1008, reason=err.code)
            return
        port = await self._start(key)
        if port is None:
            return
        writer = asyncio.create_task(self._write(port),
                                     name=f"duplex-live-writer-{port.session.session_id}")
        try:
            await self._read(port)
        finally:
            # No resume in GPT-Live: the session ends with its socket.
            await port.release(client_closed=True)
            await asyncio.gather(writer, return_exceptions=True)

    async def _start(self, key: str | None) -> SessionPort | None:
        """Wait for ``session.start`` and open the session; None when the
        socket ended first or the session was refused (answered and closed)."""
        while (frame := await self._receive()) is not None:
            try:
                command = self.codec.parse(frame)
                if not isinstance(command, LiveStart):
                    raise DuplexError("invalid_event", "the first event is session.start",
                                      param="type", event_id=getattr(command, "event_id", None))
            except DuplexError as err:
                self.sessions.count_error(err.code)
                await self._send(self.codec.render_error(err))
                continue  # the client may still start its session
            try:
                return await SessionPort.open(self.sessions, self.codec, key, command.patch,
                                              transport=SessionPatch.played_here())
            except DuplexError as err:
                await self._send(self.codec.render_error(err.with_event_id(command.event_id)))
                await self.ws.close(code=1013 if isinstance(err, Capacity) else 1008,
                                    reason=err.code)
                return None
        return None

    async def _receive(self) -> str | bytes | None:
        # The close code does not matter here: the session ends with its socket.
        return (await next_frame(self.ws))[0]

    def _feed(self, port: SessionPort, frame: str | bytes) -> str | None:
        """One frame after the start: delivered to the session, or the reply
        the dialect gives itself (mute, unmute). Refusals raise, counted."""
        try:
            command = self.codec.parse(frame)
            if isinstance(command, LiveStart):
                raise DuplexError("invalid_event", "the session has started already",
                                  param="type", event_id=command.event_id)
            if isinstance(command, LiveAck):
                return self.codec.render_ack(command)
            for one in command.commands if isinstance(command, LiveCommands) else (command,):
                port.deliver(one)
            return None
        except DuplexError as err:
            self.sessions.count_error(err.code)
            raise

    async def _read(self, port: SessionPort) -> None:
        while (frame := await self._receive()) is not None:
            try:
                reply = self._feed(port, frame)
            except DuplexError as err:
                reply = port.error(err)
                if isinstance(err, Closed):
                    await self._try_send(reply)
                    return
            if reply is not None and not await self._try_send(reply):
                return

    async def _try_send(self, text: str) -> bool:
        try:
            await self._send(text)
            return True
        except Exception:
            return False

    async def _write(self, port: SessionPort) -> None:
        session = port.session
        try:
            async for item in port.events():
                for text in self.codec.render_all(item):
                    await self._send(text)
                for command in self.codec.due():
                    try:
                        port.deliver(command)
                    except DuplexError as err:  # the session is closing: nothing to ask of it
                        log.debug("live: %s not delivered: %s", type(command).__name__, err)
            reason = session.close_reason or CloseReason.CLIENT
            await self.ws.close(code=reason.code, reason=reason.value)
        except Exception:  # the socket went away under us; the reader will notice
            log.debug("live writer for %s stopped", session.session_id, exc_info=True)
