"""``Call``: a session whose audio the server plays to a caller -- a WebRTC
call, a SIP call, a Twilio stream -- and ``Calls``, this process's live calls.

What every call does the same way is here, once: its tasks, the
``output_audio_buffer.clear`` that cuts the reply and truncates its item to
what was heard, the call-only events its sideband sockets get
(``/v1/realtime?call_id=…``: ``connection.py``), and the one idempotent
hang-up that ends the session, closes the wire and stops every task. A call
shell writes its wire: what it does with each event (``_follow``), how it
cuts what it plays (``_cut_output``), how its media closes (``_close_wire``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.port.session_port import SessionPort

Sideband = Callable[[str], Awaitable[None]]  # a sideband socket's send


class Call:
    """One call over its ``SessionPort`` (see the module docstring)."""

    task_prefix = "call"  # tasks are named duplex-<prefix>-<what>-<call id>

    def __init__(self, port: SessionPort, call_id: str, *,
                 on_end: Callable[[Any], None]) -> None:
        self.port = port
        self.call_id = call_id
        self.session = port.session
        self.sidebands: set[Sideband] = set()
        self.ended = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._on_end = on_end
        self._ending: asyncio.Task[Any] | None = None

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(f"duplex-{self.task_prefix}-{what}-{self.call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- the session's events ------------------------------------------------------

    async def _deliver(self) -> None:
        """The session's events into the wire (``_follow``) until it ends;
        then the call ends too."""
        async for item in self.port.events():
            await self._follow(item)
        self._hang_up_soon()

    async def _follow(self, item: Envelope) -> None:
        raise NotImplementedError

    # ---- sidebands -----------------------------------------------------------------

    def _notify(self, kind: str, **fields: Any) -> None:
        """A call-only event (no seq, the session's fence): to every sideband."""
        if self.sidebands:
            self._to_sidebands(self.port.codec.render_notice(kind, self.port.fence, **fields))

    def _to_sidebands(self, text: str) -> None:
        for send in list(self.sidebands):
            self._spawn(send(text), "sideband")

    # ---- clear -------------------------------------------------------------------

    def clear_output(self) -> None:
        """``output_audio_buffer.clear``: cut the reply where the caller is,
        and keep only that much of its item (what a client's truncate does)."""
        cut = self._cut_output()
        if cut is not None:
            self.port.truncate(*cut)

    def _cut_output(self) -> tuple[str, int] | None:
        """Stop playing the reply; the item cut and the ms heard of it, if any played."""
        raise NotImplementedError

    # ---- the end -------------------------------------------------------------------

    def _hang_up_soon(self) -> None:
        if self._ending is None and not self.ended.is_set():
            self._ending = asyncio.ensure_future(self.hangup())

    def _hanging_up_here(self) -> bool:
        """Whether this task is the one ending the call (the first to ask)."""
        return self._ending is None or self._ending is asyncio.current_task()

    async def hangup(self, reason: CloseReason = CloseReason.HANGUP) -> None:
        """Idempotent: end the session (with ``reason``, unless it already
        closed with its own), close the wire, stop every task of the call."""
        if self.ended.is_set():
            return
        current = asyncio.current_task()
        if self._ending is not None and self._ending is not current:
            await self._ending
            return
        self._ending = self._ending or current
        self._on_end(self)
        closing = await self.port.end(reason)
        await self._close_wire(closing)
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._after_stop(closing)
        self.ended.set()

    async def _close_wire(self, reason: CloseReason) -> None:
        """Close the call's media (before its tasks stop)."""

    async def _after_stop(self, reason: CloseReason) -> None:
        """What a call says last, once its tasks stopped (SIP's BYE)."""


class Calls:
    """The live calls of this process, by call id -- WebRTC, SIP and Twilio
    alike -- so sideband sockets and ``…/hangup`` reach every one."""

    def __init__(self, sessions: RealtimeSessions) -> None:
        self.sessions = sessions
        self._calls: dict[str, Call] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: Call) -> None:
        self._calls[call.call_id] = call

    def remove(self, call: Call) -> None:
        if self._calls.get(call.call_id) is call:
            del self._calls[call.call_id]

    def get(self, call_id: str, api_key: str | None) -> Call:
        """The call, for the key that owns its session (a client secret acts
        as its minting key); any other key, an unknown or ended call:
        ``call_not_found`` (no existence leak)."""
        call = self._calls.get(call_id)
        try:
            if call is None:
                raise DuplexError("session_not_found", "no such call")
            self.sessions.check_owner(call.session.session_id, api_key)
        except DuplexError:
            raise DuplexError("call_not_found", f"no call {call_id!r} for this key",
                              param="call_id") from None
        return call

    async def close(self) -> None:
        await asyncio.gather(*(c.hangup() for c in list(self._calls.values())),
                             return_exceptions=True)
