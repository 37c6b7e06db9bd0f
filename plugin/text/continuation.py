"""The requests on application sessions, read once for every transport:
opening a session, and continuing one (a turn). The HTTP routes, the gRPC
services and the streaming-input core call these; each shell only turns its
wire format into the JSON-shaped body read here (sans-I/O but for the turn's
engine work, which ``SessionTurn`` brackets).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.text.app_sessions import AppSession, Turn, TurnRequest
from vllm_duplex.text.events import TextEvent
from vllm_duplex.text.requests import GenerateSpec, Message, check_model, parse_generate, parse_messages

if TYPE_CHECKING:
    from vllm_duplex.text.service import TextService

OPEN_FIELDS = ("model", "adapter", "session_id", "ttl_s", "instructions", "messages")


@dataclass(frozen=True)
class OpenSpec:
    model: str
    session_id: str | None
    ttl_s: float | None
    messages: tuple[Message, ...]


def _number_or_none(raw: dict[str, Any], name: str, kind: type | tuple[type, ...] = (int, float)) -> Any:
    value = raw.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        what = "an integer" if kind is int else "a number"
        raise DuplexError("invalid_value", f"{name} must be {what}", param=name)
    return value


def parse_open(raw: Any, served_model: str) -> OpenSpec:
    """An open-session body -> ``OpenSpec``; raises the typed error naming the field."""
    if not isinstance(raw, dict):
        raise DuplexError("invalid_value", "the body must be a JSON object", param="body")
    unknown = set(raw) - set(OPEN_FIELDS)
    if unknown:
        name = sorted(unknown)[0]
        raise DuplexError("unsupported_option", f"{name} is not supported here", param=name)
    model = check_model(raw.get("model"), served_model)
    if raw.get("adapter") is not None:
        raise DuplexError("model_not_found", f"adapter {raw['adapter']!r} is not served here "
                          "(this engine serves no adapters)", param="adapter")
    ttl = _number_or_none(raw, "ttl_s")
    messages = parse_messages(raw.get("messages", []), allow_empty=True)
    instructions = raw.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise DuplexError("invalid_value", "instructions must be a string", param="instructions")
        messages = (Message("system", instructions), *messages)
    return OpenSpec(model, raw.get("session_id"), ttl, messages)


def parse_renew(raw: Any) -> tuple[float | None, int | None]:
    raw = raw if isinstance(raw, dict) else {}
    return _number_or_none(raw, "ttl_s"), _number_or_none(raw, "generation", int)


async def open_session(service: TextService, raw: Any, api_key: str | None) -> dict[str, Any]:
    """Open from a body; the session's wire document."""
    spec = parse_open(raw, service.model)
    session, info = await service.sessions.open(api_key=api_key, model=spec.model,
                                                session_id=spec.session_id, ttl_s=spec.ttl_s,
                                                messages=spec.messages)
    return service.sessions.wire(session, info)


async def describe_session(service: TextService, session_id: str, api_key: str | None,
                           owner: str | None, history: bool = False) -> dict[str, Any]:
    """The wire document, also of a closed or expired session (its tombstone)."""
    sessions = service.sessions
    await sessions.reach(session_id, api_key, owner)
    sessions.check_owner(session_id, owner)
    info = sessions.manager.info(session_id, api_key)
    session = sessions.manager.peek(session_id) if info.state.value in ("active", "detached") else None
    body = sessions.wire(session, info)
    if session is not None and history:
        body["history"] = session.wire_messages()
    return body


async def renew_session(service: TextService, session_id: str, raw: Any, api_key: str | None,
                        owner: str | None) -> dict[str, Any]:
    sessions = service.sessions
    ttl, generation = parse_renew(raw)
    await sessions.reach(session_id, api_key, owner)
    sessions.check_owner(session_id, owner)
    sessions.manager.renew(session_id, api_key, ttl_s=ttl, generation=generation)
    await sessions.renewed(session_id)
    session, info = sessions.manager.get(session_id, api_key)
    return sessions.wire(session, info)


async def close_session(service: TextService, session_id: str, api_key: str | None,
                        owner: str | None) -> dict[str, Any]:
    """Idempotent: a closed session's close answers its tombstone again."""
    sessions = service.sessions
    await sessions.reach(session_id, api_key, owner)
    sessions.check_owner(session_id, owner)
    info = await sessions.manager.close(session_id, api_key, "client")
    sessions.forget(session_id)
    return sessions.wire(None, info)


@dataclass
class Continuation:
    session: AppSession
    turn: Turn
    spec: GenerateSpec
    stream: Any  # the body's ``stream`` flag (HTTP only; True when absent)


async def begin_continuation(service: TextService, session_id: str, raw: Any,
                             api_key: str | None, owner: str | None) -> Continuation:
    """A continuation body (``POST /v1/sessions/{id}/generate``, gRPC ``Generate``
    naming a session) -> the session's new turn. Model and adapter are checked
    against the session's binding on every continuation."""
    if not isinstance(raw, dict):
        raise DuplexError("invalid_value", "the body must be a JSON object", param="body")
    raw = dict(raw)
    stream = raw.pop("stream", True)
    if not isinstance(stream, bool):
        raise DuplexError("invalid_value", "stream must be a boolean", param="stream")
    mode = raw.pop("mode", "append")
    replace_from = raw.pop("replace_from", None)
    if not isinstance(mode, str):
        raise DuplexError("invalid_value", "mode must be a string", param="mode")
    if replace_from is not None and (isinstance(replace_from, bool) or not isinstance(replace_from, int)):
        raise DuplexError("invalid_value", "replace_from must be an integer", param="replace_from")
    await service.sessions.reach(session_id, api_key, owner)
    session, _ = service.sessions.get(session_id, api_key, owner)
    if raw.get("model") is not None and raw["model"] != session.model:
        raise DuplexError("model_mismatch", f"session {session_id!r} is bound to model "
                          f"{session.model!r}, not {raw['model']!r}", param="model")
    if raw.get("adapter") is not None:
        raise DuplexError("model_mismatch", f"session {session_id!r} is bound to no adapter",
                          param="adapter")
    raw.pop("adapter", None)
    for unsupported in ("reasoning", "parallel_tool_calls", "instructions"):
        if raw.get(unsupported) not in (None, False):
            raise DuplexError("unsupported_option", f"{unsupported} is not supported on "
                              "session continuations (use /v1/generate)", param=unsupported)
        raw.pop(unsupported, None)
    spec = parse_generate(raw, served_model=session.model, max_tokens_cap=service.max_tokens_cap,
                          model_required=False, messages_required=mode != "replace",
                          owner=service.sessions.instance_id)
    turn = session.begin(TurnRequest(spec.request_id, spec.messages, spec.sampling, spec.tools,
                                     spec.tool_choice, mode, replace_from))
    return Continuation(session, turn, spec, stream)


class SessionTurn:
    """A running turn's hold on its session: pinned (no expiry mid-turn) from
    here until ``release`` (idempotent: a response may end before it started),
    which frees the turn slot and does the resident-cap bookkeeping."""

    def __init__(self, service: TextService, session: AppSession, turn: Turn) -> None:
        self.service = service
        self.session = session
        self.turn = turn
        self._released = False
        service.sessions.manager.pin(session.session_id)

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        session, sessions = self.session, self.service.sessions
        if session.turn is self.turn:
            session.turn = None
        sessions.manager.unpin(session.session_id)
        await sessions.finished_turn(session)

    def events(self, key_id: str | None, deadline_ms: int | None) -> AsyncIterator[TextEvent]:
        """The reply, registered for abort and the deadline; released at its end."""
        rid = self.turn.request.request_id
        return _after(self.service.run(key_id, rid, self.turn, self.turn.events(), deadline_ms),
                      self)


async def _after(events: AsyncIterator[TextEvent], hold: SessionTurn) -> AsyncIterator[TextEvent]:
    try:
        async for ev in events:
            yield ev
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        await hold.release()
