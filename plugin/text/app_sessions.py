"""Application sessions: multi-turn state kept on the server across requests.

An ``AppSession`` is bound to one model (and adapter) and holds the
conversation's messages plus a port of the shared vLLM stage whose live
streaming-input request keeps the conversation in the KV cache between
turns: a continuation prefills only its new messages (``append``). It is not
a KV-transfer handle; it is the conversation.

``Turn`` is one generation on a session: optional streaming input (text
chunks pushed into the live request as whole words while they arrive), then
one reply as generate-API events. A turn commits its messages to the history
only when it finishes; a cancelled or failed turn leaves the history as it
was. ``AppSessions`` admits sessions through a ``SessionManager`` (leases,
per-key ownership, expiry) and caps how many keep a live request resident:
beyond ``max_resident`` the least recently used idle session's request is
released (its KV freed; its next turn prefills again).

With a durable store (``durability: store: redis``) a ``SessionKeeper``
(``vllm_duplex.durable.app_sessions``) makes a session outlive its worker:
it keeps each session in the store while it lives here, and ``reach`` has it
take over a session whose owner is gone before any route looks it up.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageFailed,
    StageInput,
    TextDelta,
    TextIn,
    ToolCall,
)
from vllm_duplex.leases.manager import SessionInfo, SessionManager
from vllm_duplex.text.events import (
    ErrorEvent,
    FinishEvent,
    TextDeltaEvent,
    TextEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
    Usage,
)
from vllm_duplex.text.requests import Message, ToolCallRecord, check_id

if TYPE_CHECKING:  # vLLM is imported only by deployments that have a vLLM stage
    from vllm_duplex.stages.vllm.llm import VllmLlmPort, VllmLlmStage

CONTINUATION_MODES = {"append": True, "replace": True, "branch": False}  # mode -> supported
_MINTED = re.compile(r"sess_[A-Za-z0-9_-]{24}\.(?P<owner>.+)")
_FINISH = {"abort": "cancelled"}


def minted_owner(session_id: str) -> str | None:
    """The instance that minted ``session_id`` (minted ids name their owner)."""
    m = _MINTED.fullmatch(session_id)
    return m.group("owner") if m else None


@dataclass(frozen=True)
class TurnRequest:
    request_id: str
    messages: tuple[Message, ...]  # what this turn adds (before the reply)
    sampling: SamplingConfig
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    mode: str = "append"
    replace_from: int | None = None  # "replace": history[:replace_from] + messages


class AppSession:
    def __init__(self, session_id: str, stage: VllmLlmStage, *, model: str,
                 messages: Sequence[Message] = (), incarnation: int = 0) -> None:
        self.session_id = session_id
        self.model = model
        self.messages: list[Message] = list(messages)
        self.port: VllmLlmPort = stage.port(session_id)
        self.fence = Fence(session_id, incarnation, incarnation)
        self.turn: Turn | None = None
        self.turns = 0
        self._opened = False
        # With a durable store: ``saved`` returns once the store holds the
        # history as it is now; ``ended`` says the session ended here, and why.
        self.saved: Callable[[], Awaitable[None]] | None = None
        self.ended: Callable[[str], None] | None = None

    async def open(self) -> None:
        if not self._opened:
            self._opened = True
            await self.port.open(self.fence)

    async def close(self, reason: str) -> None:
        turn = self.turn
        if turn is not None:
            await turn.stop("cancelled")
        await self.port.close()
        if self.ended is not None:
            self.ended(reason)

    def begin(self, request: TurnRequest) -> Turn:
        """Start a turn; one at a time (a second one is refused, retryably)."""
        if self.turn is not None:
            raise DuplexError("conversation_already_has_active_response",
                              f"session {self.session_id!r} is generating (request "
                              f"{self.turn.request.request_id!r}); wait or abort it")
        if not CONTINUATION_MODES.get(request.mode, False):
            raise DuplexError("capability_unsupported", f"continuation mode {request.mode!r} is not "
                              f"supported (supported: {supported_modes()})", param="mode")
        base = self.messages
        if request.mode == "replace":
            cut = request.replace_from
            if cut is None or not 0 <= cut <= len(base):
                raise DuplexError("invalid_value", f"replace_from must be within [0, {len(base)}]",
                                  param="replace_from")
            base = base[:cut]
        self.turn = Turn(self, request, tuple(base))
        return self.turn

    def wire_messages(self) -> list[dict[str, Any]]:
        return [m.wire() for m in self.messages]


def supported_modes() -> list[str]:
    return [m for m, ok in CONTINUATION_MODES.items() if ok]


class Turn:
    """One generation on a session. ``push`` streams input text in; ``events``
    runs the reply (once); ``stop`` ends it from anywhere."""

    def __init__(self, session: AppSession, request: TurnRequest, base: tuple[Message, ...]) -> None:
        self.session = session
        self.request = request
        self.base = base
        self.pushed = ""  # streamed input text, all of it
        self._sent = 0  # characters of ``pushed`` already in the model
        self._primed = False
        self._stop_reason: str | None = None
        self._stopped = asyncio.Event()
        self.finished = False

    def _item(self, payload: Any, role: str) -> StageInput:
        fence = self.session.fence
        return StageInput(fence, fence.request_id(role), payload)

    async def push(self, text: str) -> None:
        """Streaming input: the complete words of what arrived go into the live
        request now (a word may still grow, so the tail waits for more)."""
        port = self.session.port
        if not self._primed:
            self._primed = True
            # The live request holds what comes before the streamed words first
            # (a no-op when it does): the history and the start's own messages
            # (``instructions`` is one); without the latter, a stream that had
            # any rebuilt its whole prompt at the end.
            before = (*self.base, *self.request.messages)
            if before:
                await port.submit(self._item(ResetContext(tuple(m.context() for m in before)),
                                             "ctx"))
        self.pushed += text
        cut = max(self.pushed.rfind(" "), self.pushed.rfind("\n"))
        if cut > self._sent:
            piece, self._sent = self.pushed[self._sent:cut], cut
            if piece.strip():
                await port.submit(self._item(TextIn(piece), "in"))

    async def stop(self, reason: str = "cancelled") -> None:
        if self.finished or self._stop_reason is not None:
            return
        self._stop_reason = reason
        session = self.session
        session.fence = session.fence.next_epoch()
        await session.port.cancel(session.fence)  # aborts the reply's vLLM request
        self._stopped.set()

    async def events(self, final_messages: Sequence[Message] = ()) -> AsyncIterator[TextEvent]:
        """The reply to ``request.messages`` + ``final_messages`` (the streamed
        input's user message), as generate-API events ending in one terminal."""
        session, req = self.session, self.request
        added = (*req.messages, *final_messages)
        context = tuple(m.context() for m in (*self.base, *added))
        port = session.port
        rid = session.fence.request_id("resp")
        text, calls, finish = "", [], None
        outputs = port.outputs()
        try:
            if self._stop_reason is None:
                await port.submit(StageInput(session.fence, rid, GenerateRequest(
                    req.request_id, context, req.sampling, req.tools, req.tool_choice)))
            while self._stop_reason is None:
                out = await _next_or_stop(outputs, self._stopped)
                if out is None:
                    break
                p = out.payload
                if out.request_id != rid:
                    continue  # a prefill chunk's failure: the reply reports its own
                if isinstance(p, TextDelta):
                    text += p.text
                    yield TextDeltaEvent(p.text)
                elif isinstance(p, ToolCall):
                    index = len(calls)
                    calls.append(p)
                    yield ToolCallDeltaEvent(index, p.call_id, p.arguments, p.name)
                    yield ToolCallEvent(index, p.call_id, p.name, p.arguments)
                elif isinstance(p, StageFailed):
                    yield ErrorEvent(p.error)
                    return
                elif isinstance(p, GenerationDone):
                    finish = p
                    break
            if self._stop_reason == "deadline":
                yield ErrorEvent(DuplexError("deadline_exceeded", "the request's deadline passed"))
                return
            if finish is None:
                yield _finish(req.request_id, "cancelled", 0, 0)
                return
            reply = Message("assistant", text, tuple(_record(c) for c in calls))
            session.messages = [*self.base, *added, reply]
            session.turns += 1
            if session.saved is not None:
                await session.saved()  # what the client is told, a worker taking over knows
            reason = "tool_calls" if calls else _FINISH.get(finish.finish_reason, finish.finish_reason)
            yield _finish(req.request_id, reason, finish.input_tokens, finish.output_tokens)
        finally:
            self.finished = True
            await outputs.aclose()  # type: ignore[attr-defined]
            if session.turn is self:
                session.turn = None


def _record(call: ToolCall) -> ToolCallRecord:
    return ToolCallRecord(call.call_id, call.name, call.arguments)


def _finish(request_id: str, reason: str, prompt: int, completion: int) -> FinishEvent:
    return FinishEvent(request_id, reason, Usage(prompt, completion))


async def _next_or_stop(outputs: AsyncIterator[Any], stopped: asyncio.Event) -> Any:
    """The next output, or None once ``stopped`` is set (the reply was aborted)."""
    if stopped.is_set():
        return None
    nxt = asyncio.ensure_future(anext(outputs))
    wait = asyncio.ensure_future(stopped.wait())
    try:
        done, _ = await asyncio.wait({nxt, wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in (nxt, wait):
            if not fut.done():
                fut.cancel()
        await asyncio.gather(nxt, wait, return_exceptions=True)
    if nxt in done and not nxt.cancelled() and nxt.exception() is None:
        return nxt.result()
    if nxt in done and nxt.exception() is not None and not isinstance(nxt.exception(), StopAsyncIteration):
        raise nxt.exception()  # type: ignore[misc]
    return None


class SessionKeeper(Protocol):
    """Keeps application sessions beyond this process."""

    async def claim(self, session_id: str) -> None:
        """A chosen id: refused (``duplicate_id``) when any worker has it."""

    async def unclaim(self, session_id: str) -> None:
        """A claimed id whose session could not be opened: free for a retry."""

    async def keep(self, session: AppSession, api_key: str | None) -> None:
        """Keep ``session`` from now on (returns once it is kept)."""

    async def reach(self, session_id: str, api_key: str | None, owner: str | None) -> None:
        """Take ``session_id`` over when it is kept and its owner is gone."""


class AppSessions:
    """The application sessions of one instance."""

    def __init__(self, stage: VllmLlmStage, *, model: str, instance_id: str, max_sessions: int,
                 max_sessions_per_key: int | None, default_ttl_s: float, max_ttl_s: float,
                 max_resident: int, clock: Any) -> None:
        self.stage = stage
        self.model = model
        self.max_resident = max_resident
        self.keeper: SessionKeeper | None = None
        self.manager: SessionManager[AppSession] = SessionManager(
            max_sessions=max_sessions, max_sessions_per_key=max_sessions_per_key,
            default_ttl_s=default_ttl_s, max_ttl_s=max_ttl_s, clock=clock, instance_id=instance_id)
        self._recent: OrderedDict[str, AppSession] = OrderedDict()  # LRU of resident sessions
        self.evictions = 0

    @property
    def instance_id(self) -> str:
        return self.manager.instance_id

    def resident(self) -> int:
        return sum(1 for s in self._recent.values() if s.port.resident)

    def check_owner(self, session_id: str, claimed_owner: str | None) -> None:
        """Refuse (never serve) a session another instance owns, or that the
        caller says another instance owns. With a keeper (a durable store),
        ``reach`` has decided instead: a session held here is this one's
        whatever the caller last knew (it may have been taken over from the
        owner the caller names), one a live worker holds was refused there,
        one no worker keeps is unknown here as anywhere."""
        if self.keeper is not None:
            return
        owner = claimed_owner or minted_owner(session_id)
        if owner is not None and owner != self.instance_id:
            raise DuplexError("wrong_instance", f"session {session_id!r} is owned by instance "
                              f"{owner!r}; this is {self.instance_id!r}", param="session_id",
                              details={"owner_instance_id": owner})

    async def open(self, *, api_key: str | None, model: str, session_id: str | None,
                   ttl_s: float | None, messages: Sequence[Message]) -> tuple[AppSession, SessionInfo]:
        if session_id is None:
            session_id = f"sess_{secrets.token_urlsafe(18)}.{self.instance_id}"
        else:
            check_id(session_id, "session_id")
            if minted_owner(session_id) is not None:
                raise DuplexError("invalid_value", "ids of the form sess_<24 chars>.<instance> are "
                                  "reserved for minted ids", param="session_id")
        claimed = self.keeper is not None and minted_owner(session_id) is None
        if claimed:
            await self.keeper.claim(session_id)  # a chosen id: unused wherever it is kept
        try:
            session, info = self.manager.admit(
                lambda sid: AppSession(sid, self.stage, model=model, messages=messages),
                api_key=api_key, session_id=session_id, ttl_s=ttl_s)
        except BaseException:
            if claimed:
                await self.keeper.unclaim(session_id)
            raise
        try:
            await session.open()
            if self.keeper is not None:
                await self.keeper.keep(session, api_key)
        except BaseException:
            await self.manager.close(session.session_id, api_key, "open_failed")
            if claimed and session.ended is None:  # never kept: nothing else frees the id
                await self.keeper.unclaim(session_id)
            raise
        return session, info

    # ---- a keeper beyond this process (a durable store) ------------------------

    async def reach(self, session_id: str, api_key: str | None, owner: str | None) -> None:
        """Before any route looks ``session_id`` up: a keeper takes over a
        session not held here whose owner is gone; without one nothing changes."""
        if self.keeper is not None and self.manager.held(session_id) is None:
            await self.keeper.reach(session_id, api_key, owner)

    async def renewed(self, session_id: str) -> None:
        """The lease changed (a renew): the keeper gets it before the client."""
        session = self.manager.peek(session_id)
        if session is not None and session.saved is not None:
            await session.saved()

    def get(self, session_id: str, api_key: str | None, owner: str | None = None
            ) -> tuple[AppSession, SessionInfo]:
        self.check_owner(session_id, owner)
        return self.manager.get(session_id, api_key)

    async def finished_turn(self, session: AppSession) -> None:
        """LRU bookkeeping after a turn; release the oldest idle requests over the cap."""
        self._recent.pop(session.session_id, None)
        self._recent[session.session_id] = session
        for sid in list(self._recent):
            if self.resident() <= self.max_resident:
                break
            old = self._recent[sid]
            if old.turn is None and await old.port.release():
                self.evictions += 1
                self._recent.pop(sid, None)

    def forget(self, session_id: str) -> None:
        self._recent.pop(session_id, None)

    def wire(self, session: AppSession | None, info: SessionInfo) -> dict[str, Any]:
        lease = info.lease
        left = lease.expires_at - self.manager.clock.now()
        out: dict[str, Any] = {
            "object": "duplex.session", "id": info.session_id,
            "ref": {"session_id": info.session_id, "owner_instance_id": info.owner_instance_id},
            "model": self.model, "adapter": None, "state": info.state.value,
            "lease": {"ttl_s": lease.ttl_s, "expires_in_s": round(max(0.0, left), 3),
                      "expires_at": round(time.time() + left, 3), "generation": lease.generation},
        }
        if session is not None:
            out.update(turns=session.turns, messages=len(session.messages),
                       resident=session.port.resident,
                       generating=session.turn.request.request_id if session.turn else None)
        if info.close_reason:
            out["close_reason"] = info.close_reason
        return out
