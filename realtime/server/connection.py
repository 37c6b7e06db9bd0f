"""One realtime WebSocket: a thin I/O loop around its ``SessionPort``
(``port/session_port.py``, the same port every transport stands on).

Each socket has two tasks: the reader hands frames to the port (parsed by
the codec, delivered to the session); the writer sends what the port's
``events`` yield (the socket's ``Attachment``, ``vllm_duplex.replay.outbox``).
Framing errors (bad JSON, oversized events) are answered directly and are
not journaled.

A socket either opens a new session, or — connected with ``?resume=1`` —
sends ``session.resume`` first and is attached to an existing one: it gets
``session.resumed`` (with the rotated token), then exactly the journaled
events after its ``last_seq``, or ``session.resync_required`` with a snapshot
when they are no longer all retained, then live events. When its client
closes the socket cleanly (close code 1000 or 1001) the session ends with it;
when the socket is lost or closed with any other code, the session waits
detached for the grace window (``limits.resume_grace_s``).

``?intent=transcription`` opens a transcription session; the key may be a
client secret (``ek_…``), which opens its own session once.

A *sideband* socket (``?call_id=rtc_…`` or ``sip_…``, with the key that owns
the call) follows a running call's session (WebRTC, beside its data channel;
SIP, the only events the call has: ``telephony/sip_call.py``): it
gets every event from the moment it joined and may send any, including the
call's ``output_audio_buffer.clear``. It never owns the session: when it
ends, the call goes on; when the call ends, it is closed (``hangup``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import SessionResume
from vllm_duplex.domain.errors import Capacity, Closed, DuplexError, FramingError
from vllm_duplex.domain.owner_ids import check_routed_id
from vllm_duplex.domain.session_config import SessionPatch, SessionType
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.http_errors import error_response
from vllm_duplex.realtime.server.port.session_port import Rules, SessionPort, realtime_codec
from vllm_duplex.realtime.server.tracing import turn_spans
from vllm_duplex.realtime.server.websocket_frames import next_frame
from vllm_duplex.realtime.wire.codec import Dialect
from vllm_duplex.replay.outbox import Notice

if TYPE_CHECKING:
    from vllm_duplex.realtime.server.port.calls import Call, Calls

log = logging.getLogger(__name__)

# A socket that ends with its session closes with the session's
# ``CloseReason.code``; these two end a socket while the session lives on
# (4xxx: ours, documented in docs/errors.md).
CLOSE_REPLACED = 4002  # another socket resumed the session
CLOSE_SLOW_CONSUMER = 4008  # this socket stopped reading; the session lives on: resume

# A client's close that ends its session (docs/errors.md): normal closure and
# going away (a page unloading). Anything else keeps the session for a resume:
# no close frame (1006), a frame without a code (1005 -- uvicorn reports a lost
# connection as 1005 too, so the two cannot be told apart), an error code, or
# an application code such as ``RealtimeClient.close(end_session=False)``'s
# 4000. A close the server began carries the session's own end already.
CLEAN_CLOSE_CODES = frozenset({1000, 1001})

# The socket's rules over the port: a resume is only its first event, and
# only a sideband socket has a player to clear (its call's).
_NO_RESUME = "session.resume starts a ?resume=1 socket"
_NO_CLEAR = "output_audio_buffer.clear is for WebRTC calls (and their sideband sockets)"


class RealtimeConnection:
    def __init__(self, sessions: RealtimeSessions, ws: WebSocket,
                 calls: Calls | None = None) -> None:
        self.sessions = sessions
        self.ws = ws
        self.calls = calls
        self.call: Call | None = None  # a sideband socket's call
        beta = "realtime=v1" in ws.headers.get("openai-beta", "")
        self.codec = realtime_codec(sessions, Dialect.BETA if beta else Dialect.GA)
        self._send_lock = asyncio.Lock()
        self.port: SessionPort | None = None
        self.client_close_code: int | None = None  # the disconnect's code, once the socket ended
        self.spans = turn_spans(sessions.now)  # None unless OpenTelemetry is configured

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            await self.ws.send_text(text)

    async def _refuse(self, err: DuplexError, code: int) -> None:
        await self._send(self.codec.render_error(err))
        await self.ws.close(code=code, reason=err.code)

    async def _refused_at_capacity(self, key: str | None) -> bool:
        """A new session past the server's ceiling is refused before the
        upgrade: HTTP 429 with ``Retry-After`` (host/capacity.py), which a
        router in front takes as "try the next worker". A key that would be
        refused anyway hears why after the upgrade, as always."""
        params = self.ws.query_params
        if params.get("call_id") is not None or params.get("resume") in ("1", "true"):
            return False
        try:
            self.sessions.admit(key)  # key, room; a wrong model is an error event after the upgrade
        except DuplexError as err:
            if not isinstance(err, Capacity):
                return False
            if "websocket.http.response" not in self.ws.scope.get("extensions", {}):
                await self.ws.accept()
                await self._refuse(err, 1013)  # a server without denial responses
            else:
                await self.ws.send_denial_response(error_response(err))
            return True
        return False

    async def serve(self) -> None:
        offered = list(self.ws.scope.get("subprotocols") or [])
        key = bearer_key(self.ws.headers, offered)
        if await self._refused_at_capacity(key):
            return
        await self.ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        sessions = self.sessions
        try:
            # The room was asked before the upgrade (a resume and a sideband
            # take no seat; a new session's open asks again as it takes one);
            # an empty ``?model=`` names no model.
            sessions.admit(key, model=self.ws.query_params.get("model") or None, room=False)
            call_id = self.ws.query_params.get("call_id")
            if call_id is not None:
                await self._sideband(call_id, key)
                return
            if self.ws.query_params.get("resume") in ("1", "true"):
                if not await self._resume(sessions.caller_key(key)):
                    return
            else:
                self.port = await SessionPort.open(sessions, self.codec, key, self._intent())
        except DuplexError as err:
            await self._refuse(err, 1013 if isinstance(err, Capacity) else 1008)
            return
        port = self.port
        assert port is not None
        writer = asyncio.create_task(self._write(port),
                                     name=f"duplex-ws-writer-{port.session.session_id}")
        try:
            await self._read(port, Rules(_NO_RESUME, no_clear=_NO_CLEAR))
        finally:
            await port.release(client_closed=self.client_close_code in CLEAN_CLOSE_CODES)
            await asyncio.gather(writer, return_exceptions=True)

    def _intent(self) -> SessionPatch | None:
        intent = self.ws.query_params.get("intent")
        if intent is None:
            return None
        if intent not in ("transcription", "realtime"):
            raise DuplexError("invalid_value", 'intent must be "transcription" (or "realtime")',
                              param="intent")
        return SessionPatch(type=SessionType(intent))

    async def _sideband(self, call_id: str, key: str | None) -> None:
        """Follow and drive a running call's session (see the module docstring)."""
        if self.calls is None:
            raise DuplexError("call_not_found", f"no call {call_id!r}", param="call_id")
        call = self.calls.get(call_id, key)
        port = SessionPort.watch(self.sessions, self.codec, call.session)
        self.call = call
        call.sidebands.add(self._send)
        writer = asyncio.create_task(self._write(port), name=f"duplex-ws-sideband-{call_id}")
        try:
            await self._read(port, Rules(_NO_RESUME, clear=call.clear_output))
        finally:
            call.sidebands.discard(self._send)
            port.unwatch()
            await asyncio.gather(writer, return_exceptions=True)

    async def _resume(self, key: str | None) -> bool:
        """Wait for ``session.resume`` and attach; False when the socket ended
        or the resume was refused (answered and closed)."""
        while True:
            frame = await self._receive()
            if frame is None:
                return False
            try:
                command = self.codec.parse(frame)
                if not isinstance(command, SessionResume):
                    raise DuplexError("invalid_event", "a ?resume=1 socket starts with "
                                      "session.resume", param="type", event_id=command.event_id)
                check_routed_id(self.ws.query_params.get("session_id"), command.session_id)
                port, replay, resumed = await SessionPort.resume(self.sessions, self.codec, key,
                                                                 command)
            except DuplexError as err:
                if isinstance(err, FramingError):
                    await self._send(self.codec.render_error(err))
                    continue  # framing: the client may still send its resume
                await self._refuse(err, 1008)
                return False
            break
        self.port = port
        session = port.session
        fence = session.fence
        await self._send(self.codec.render_notice("session.resumed", fence, **resumed))
        if replay.resync:
            await self._send(self.codec.render_notice(
                "session.resync_required", fence, reason="retention_exceeded",
                first_seq=replay.first_seq, head_seq=replay.head_seq, **session.snapshot()))
        return True

    async def _receive(self) -> str | bytes | None:
        frame, code = await next_frame(self.ws)
        if frame is None:
            self.client_close_code = code
        return frame

    async def _read(self, port: SessionPort, rules: Rules) -> None:
        while (frame := await self._receive()) is not None:
            try:
                port.feed(frame, rules)
            except DuplexError as err:
                try:
                    await self._send(port.error(err))
                except Exception:
                    return
                if isinstance(err, Closed):
                    return

    async def _write(self, port: SessionPort) -> None:
        session = port.session
        try:
            async for item in port.events():
                if self.spans is not None:
                    self.spans.observe(item.event, self.sessions.now())
                text = self.codec.render(item)
                if text is not None:
                    await self._send(text)
            ended = port.ended_by
            if ended is Notice.REPLACED:
                await self._send(self.codec.render_notice(
                    "session.replaced", session.fence, session_id=session.session_id))
                await self.ws.close(code=CLOSE_REPLACED, reason="replaced")
            elif ended is Notice.SLOW_CONSUMER:  # 4008: resume; 1008: the session ended too
                resumable = session.limits.survives_disconnect
                reason = CloseReason.SLOW_CONSUMER
                await self.ws.close(code=CLOSE_SLOW_CONSUMER if resumable else reason.code,
                                    reason=reason.value)
            else:
                reason = session.close_reason or CloseReason.CLIENT
                await self.ws.close(code=reason.code, reason=reason.value)
        except Exception:  # the socket went away under us; the reader will notice
            log.debug("writer for %s stopped", session.session_id, exc_info=True)
        finally:
            if self.spans is not None:
                self.spans.close(self.sessions.now())
