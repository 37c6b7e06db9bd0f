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
- There is no resume: a GPT-Live reconnect is a new session (the SDK and
  LiveKit start one), so when the socket ends, the session ends with it.
- Decisions are evaluated beside the session, not in it: the codec makes a
  ``DecisionRun`` (``decision.create``, a trigger firing) and the socket's
  ``DecisionRunner`` (``decisions.py``) answers it on the ``chooser`` (the
  engine's own LLM), or the codec refuses them where there is none.
- Sidebands may attach (``sideband.py``): the socket's ``LiveLine`` sends
  them every frame it sends, the microphone's audio as it came (before the
  mute), and carries a sideband's acknowledgements back to this socket.
  ``transport.dtmf.send`` is a sideband's, for SIP calls: refused here.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import AudioAppend
from vllm_duplex.domain.decisions import Chooser
from vllm_duplex.domain.errors import Capacity, Closed, DuplexError
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.live.decisions import DecisionRunner
from vllm_duplex.realtime.server.live.lines import LiveLine, LiveLines
from vllm_duplex.realtime.server.port.session_port import SessionPort
from vllm_duplex.realtime.server.websocket_frames import next_frame
from vllm_duplex.realtime.wire.live.codec import LiveAck, LiveCodec, LiveDtmf, LiveStart
from vllm_duplex.realtime.wire.live.decisions import DecisionRun, ItemReply

log = logging.getLogger(__name__)


class LiveSocket:
    def __init__(self, sessions: RealtimeSessions, ws: WebSocket,
                 lines: LiveLines | None = None, chooser: Chooser | None = None) -> None:
        self.sessions = sessions
        self.ws = ws
        self.lines = lines
        self.line: LiveLine | None = None
        self._relayed: set[asyncio.Task[None]] = set()  # a sideband's acks on their way here
        self.codec = LiveCodec(max_event_bytes=sessions.max_event_bytes,
                               model_aliases=sessions.model_aliases, clock=sessions.now)
        self.codec.decisions.available = chooser is not None
        self._chooser = chooser
        self.decider: DecisionRunner | None = None
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
        line = self.line = LiveLine(self.codec, port, transport="websocket")
        line.primary = self._relay
        if self.lines is not None:
            self.lines.add(port.session.session_id, line)
        if self._chooser is not None:
            self.decider = DecisionRunner(self._chooser, self.codec, self._send_and_share)
        writer = asyncio.create_task(self._write(port),
                                     name=f"duplex-live-writer-{port.session.session_id}")
        try:
            await self._read(port)
        finally:
            if self.decider is not None:  # a decision under way is aborted with its socket
                await self.decider.close()
            # No resume in GPT-Live: the session ends with its socket.
            await port.release(client_closed=True)
            await asyncio.gather(writer, return_exceptions=True)
            line.end()
            for task in list(self._relayed):
                task.cancel()
            await asyncio.gather(*self._relayed, return_exceptions=True)

    def _relay(self, text: str | None) -> None:
        """A frame a sideband caused (its mute's acknowledgement) to this socket."""
        if text is None:
            return
        task = asyncio.create_task(self._try_send(text), name="duplex-live-relay")
        self._relayed.add(task)
        task.add_done_callback(self._relayed.discard)

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
            if isinstance(command, LiveDtmf):
                raise DuplexError("capability_unsupported", "transport.dtmf.send is a sideband "
                                  "command for SIP calls; this socket is a primary WebSocket",
                                  param="type", event_id=command.event_id)
            assert self.line is not None
            if isinstance(command, (LiveAck, ItemReply)):
                ack = self.codec.render_ack(command)
                self.line.to_sidebands(ack)
                return ack
            if isinstance(command, DecisionRun):
                assert self.decider is not None  # the codec refuses runs without a chooser
                self.decider.submit(command)
                delegated = self.codec.render_delegated(command)
                self.line.to_sidebands(delegated)
                return delegated
            if isinstance(command, AudioAppend):
                self.line.reflect(self.codec.raw_audio, port.config.input_format)
            port.deliver(command)
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

    async def _send_and_share(self, text: str) -> bool:
        """A decision's answer: to this socket and to the sidebands."""
        if self.line is not None:
            self.line.to_sidebands(text)
        return await self._try_send(text)

    async def _write(self, port: SessionPort) -> None:
        session = port.session
        try:
            async for item in port.events():
                text = self.codec.render(item)
                if text is not None:
                    await self._send(text)
                if self.line is not None:
                    self.line.share(item, text)
                for run in self.codec.decisions.take_runs():  # triggers this event fired
                    if self.decider is not None:
                        self.decider.offer(run)
            reason = session.close_reason or CloseReason.CLIENT
            await self.ws.close(code=reason.code, reason=reason.value)
        except Exception:  # the socket went away under us; the reader will notice
            log.debug("live writer for %s stopped", session.session_id, exc_info=True)
