"""Streaming input: one generation whose input (the user's next message)
arrives in numbered chunks, shared by ``WS /v1/generate/stream`` and gRPC
``OpenEngineStreaming.GenerateStream`` (each a thin shell that turns its wire
frames into the dicts below and back).

Client frames::

    {"type": "start", "model": ..., "request_id"?, "session_id"?, "messages"?, "instructions"?,
     "tools"?, "tool_choice"?, "options"?, "deadline_ms"?}          first and only once
    {"type": "input", "seq": 1, "text": "What is the"}              seq 1, 2, 3 ...
    {"type": "end", "last_seq"?: 3}                                  end of input: generate
    {"type": "cancel", "close_session"?: false}

Server frames: ``started``, ``ack {seq, duplicate}``, ``error {error, terminal}``,
then the generate events (``text-delta`` ... ``finish``) as ``{"type": <event>, ...}``.

Complete words go into the live vLLM request as they arrive, so at ``end``
only the rest and the assistant prefix are prefilled. No output is sent
before end-of-input (``early_output: false``). Exactly one terminal frame —
``finish`` or an ``error`` with ``terminal: true`` — then ``close``. Cancel,
deadline, disconnect (``finish`` without a terminal) and ``abort`` by request
id stop the engine work; a bound application session stays open unless the
cancel asks to close it. Frame-level errors (gaps, input after end, a second
start) are not terminal: the stream goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.input_sequence import Accepted, InputSequence
from vllm_duplex.text.app_sessions import AppSession, Turn, TurnRequest
from vllm_duplex.text.events import ErrorEvent, FinishEvent, Usage, wire
from vllm_duplex.text.requests import Message, check_id, check_text, parse_generate

if TYPE_CHECKING:
    from vllm_duplex.text.service import TextService

log = logging.getLogger(__name__)

START_FIELDS = ("type", "session_id")


class StreamingInput:
    """One streaming-input generation, transport-free: ``handle`` takes each
    client frame as a JSON-shaped dict, ``emit`` gets each server frame
    (the dicts of the module docstring), ``close`` is called once after the
    terminal frame. ``owner`` is the owner instance the client claims."""

    def __init__(self, service: TextService, api_key: str | None, owner: str | None,
                 emit: Callable[[dict[str, Any]], Awaitable[None]],
                 close: Callable[[], Awaitable[None]]) -> None:
        self.service = service
        self.api_key = api_key
        self.owner = owner
        self._emit = emit
        self._close = close
        self.key_id = service.key_id(api_key)
        limits = service.limits
        self.sequence = InputSequence(limits.max_input_chunk_bytes, limits.max_input_bytes)
        self.session: AppSession | None = None
        self.bound = False
        self.turn: Turn | None = None
        self.generating: asyncio.Task[None] | None = None
        self.terminal_sent = False
        self._send_lock = asyncio.Lock()
        self._deadline: asyncio.TimerHandle | None = None
        self._finished = False

    async def send(self, frame: dict[str, Any]) -> None:
        if self.terminal_sent:
            return
        if frame["type"] == "finish" or (frame["type"] == "error" and frame.get("terminal")):
            self.terminal_sent = True
        async with self._send_lock:
            await self._emit(frame)

    async def error(self, err: DuplexError, terminal: bool = False) -> None:
        await self.send({**wire(ErrorEvent(err)), "terminal": terminal})

    async def handle(self, frame: Any) -> None:
        """One client frame; a frame-level error raises (the caller answers it, non-terminal)."""
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            raise DuplexError("invalid_event", "a frame is a JSON object with a string type")
        kind = frame["type"]
        if kind == "start":
            await self.start(frame)
        elif self.turn is None:
            raise DuplexError("invalid_event", "the first frame must be start", param="type")
        elif kind == "input":
            text = check_text(frame.get("text"), "text")
            seq = frame.get("seq")
            got = self.sequence.accept(seq, len(text.encode()))
            if got is Accepted.NEW:
                await self.turn.push(text)
            await self.send({"type": "ack", "seq": seq, "duplicate": got is Accepted.DUPLICATE})
        elif kind == "end":
            self.sequence.end(frame.get("last_seq"))
            self.generating = asyncio.create_task(self.generate(), name="duplex-generate-stream")
        elif kind == "cancel":
            await self.cancel(bool(frame.get("close_session", False)))
        else:
            raise DuplexError("unknown_event", f"unknown frame type {kind!r}", param="type")

    async def start(self, frame: dict[str, Any]) -> None:
        if self.turn is not None:
            raise DuplexError("invalid_event", "start comes once per stream (one generation)",
                              param="type")
        service = self.service
        sid = frame.get("session_id")
        if sid is not None:
            check_id(sid, "session_id")
            await service.sessions.reach(sid, self.api_key, self.owner)
            session, _ = service.sessions.get(sid, self.api_key, self.owner)
            if frame.get("model") is not None and frame["model"] != session.model:
                raise DuplexError("model_mismatch", f"session {sid!r} is bound to model "
                                  f"{session.model!r}", param="model")
        spec = parse_generate(frame, served_model=service.model,
                              max_tokens_cap=service.max_tokens_cap, extra_fields=START_FIELDS,
                              model_required=sid is None, messages_required=False,
                              owner=service.sessions.instance_id)
        if spec.reasoning or spec.parallel_tool_calls or spec.stream_id:
            raise DuplexError("unsupported_option", "reasoning, parallel_tool_calls and stream_id "
                              "are not supported on streaming input", param="type")
        service.reserve(self.key_id, spec.request_id)
        if sid is None:
            session = AppSession(f"stream.{spec.request_id}", service.generator.stage,
                                 model=service.model)
            await session.open()
        request = TurnRequest(spec.request_id, spec.messages, spec.sampling, spec.tools,
                              spec.tool_choice)
        try:
            turn = session.begin(request)
        except DuplexError:
            if sid is None:
                await session.close("refused")
            raise
        self.session, self.bound, self.turn = session, sid is not None, turn
        if self.bound:
            service.sessions.manager.pin(session.session_id)
        self._tracking = service.track(self.key_id, spec.request_id, turn)
        self._tracking.__enter__()
        if spec.deadline_ms is not None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(spec.deadline_ms / 1000,
                                             lambda: loop.create_task(self.stop("deadline")))
        await self.send({"type": "started", "request_id": spec.request_id,
                         "session_id": session.session_id if self.bound else None,
                         "early_output": False})

    async def generate(self) -> None:
        turn = self.turn
        assert turn is not None
        final = (Message("user", turn.pushed),) if turn.pushed.strip() else ()
        try:
            async for ev in turn.events(final):
                frame = wire(ev)
                if isinstance(ev, ErrorEvent):  # a reply's error ends the generation: terminal
                    frame["terminal"] = True
                await self.send(frame)
        except Exception:  # the socket went away; finish() cleans up
            log.debug("generate stream send failed", exc_info=True)
        if self.terminal_sent:
            await self._close()

    async def stop(self, reason: str) -> None:
        """Cancel or deadline. Before end-of-input the terminal frame is ours to send."""
        turn = self.turn
        if turn is None or self.terminal_sent:
            return
        started = self.generating is not None
        await turn.stop(reason)
        if not started:
            if reason == "deadline":
                await self.error(DuplexError("deadline_exceeded", "the request's deadline passed"),
                                 terminal=True)
            else:
                await self.send(wire(FinishEvent(turn.request.request_id, "cancelled", Usage(0, 0))))
            await self._close()

    async def cancel(self, close_session: bool) -> None:
        await self.stop("cancelled")
        if close_session and self.bound and self.session is not None:
            await self.service.sessions.manager.close(self.session.session_id, self.api_key, "client")

    async def finish(self) -> None:
        """Whatever way the stream ended: no engine work, no registration left.
        Idempotent: a shell may release the session before it sends the terminal
        frame (so a client that reads it can go on at once), and again on exit."""
        if self._finished:
            return
        self._finished = True
        if self._deadline is not None:
            self._deadline.cancel()
        turn, session = self.turn, self.session
        if turn is not None and not turn.finished:
            await turn.stop("cancelled")
        if self.generating is not None:
            await asyncio.gather(self.generating, return_exceptions=True)
        if turn is not None:
            self._tracking.__exit__(None, None, None)
            if session is not None and session.turn is turn:
                session.turn = None
        if session is not None:
            if self.bound:
                self.service.sessions.manager.unpin(session.session_id)
                await self.service.sessions.finished_turn(session)
            else:
                await session.close("stream_end")
