"""One error table for every surface (WebSocket, HTTP, stages), and the kinds
that code branches on.

Each code maps to an OpenAI-style error ``type``, whether a retry can succeed,
the HTTP status used by HTTP surfaces, and its *kind*: the class of
``DuplexError`` that is raised for it. Raise ``DuplexError(code, ...)``
anywhere — it constructs the kind of that code — and catch the kind where the
control flow depends on it (``except Expired``), never by comparing codes.
Surfaces render every kind alike with ``to_wire``; the wire only ever shows
the code. Hierarchy::

    Exception
    └── DuplexError             one code from ERRORS; carries param, event_id, details
        ├── InvalidRequest      the request is wrong as sent: unchanged, it fails again
        │   ├── FramingError    the frame is not an event we can read (answered by
        │   │                   the transport before the session sees it)
        │   ├── InvalidMedia    audio or image data that does not decode
        │   └── Unsupported     a mode, format or option this engine or policy lacks
        ├── AccessDenied        no valid credentials for it (API key, resume token)
        ├── NotFound            no such thing for this caller (another key's looks
        │                       exactly the same: no existence leak)
        ├── Gone                it existed and can no longer be served
        │   ├── Expired         its lease or retention TTL ran out
        │   ├── Closed          it was closed (or its generation finished)
        │   └── ResyncRequired  the replay cursor fell out of retention
        ├── Conflict            a valid request that does not fit the state now
        │                       (an active response, a sequence gap, a lost CAS,
        │                       another model or another instance owns it)
        ├── Capacity            no room or time for it now: retry later
        └── EngineError         the server failed, not the request
            └── EngineDead      the engine died: terminal for the session

Kinds are for branching; a kind with several codes still tells them apart on
``.code`` for metrics and the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


class DuplexError(Exception):
    """An error with a code from ``ERRORS``; ``DuplexError(code, ...)`` is an
    instance of that code's kind (a subclass of this class)."""

    terminal: ClassVar[bool] = False  # ends the session (the socket closes after the event)

    def __new__(cls, code: str, *args: Any, **kwargs: Any) -> DuplexError:
        spec = ERRORS.get(code)
        if spec is None:
            raise KeyError(f"unknown error code {code!r}; add it to ERRORS")
        if not issubclass(spec.kind, cls):
            raise TypeError(f"error code {code!r} is a {spec.kind.__name__}, not a {cls.__name__}")
        return super().__new__(spec.kind)

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.details = dict(details or {})  # extra wire fields, e.g. owner_instance_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle as ``cls(*self.args)``; ours are rebuilt from the code.
        return DuplexError, (self.code, self.message), self.__dict__

    @property
    def spec(self) -> ErrorSpec:
        return ERRORS[self.code]

    def with_event_id(self, event_id: str | None) -> DuplexError:
        if event_id is not None and self.event_id is None:
            self.event_id = event_id
        return self

    def to_wire(self) -> dict[str, Any]:
        """The ``error`` object of OpenAI Realtime (and of our HTTP bodies)."""
        return {
            "type": self.spec.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "event_id": self.event_id,
            "retryable": self.spec.retryable,
            **self.details,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, param={self.param!r})"


class InvalidRequest(DuplexError):
    """The request is wrong as sent; the same request fails again."""


class FramingError(InvalidRequest):
    """The frame is not an event we can read: answered before it reaches a session."""


class InvalidMedia(InvalidRequest):
    """Audio or image data that does not decode."""


class Unsupported(InvalidRequest):
    """A mode, format or option this engine or policy does not offer (never approximated)."""


class AccessDenied(DuplexError):
    """No valid credentials for it."""


class NotFound(DuplexError):
    """No such thing for this caller (unknown, or another API key's)."""


class Gone(DuplexError):
    """It existed and can no longer be served."""


class Expired(Gone):
    """Its lease or retention TTL ran out (told apart from "unknown")."""


class Closed(Gone):
    """It was closed, or its generation already finished."""


class ResyncRequired(Gone):
    """A replay cursor older than what is still retained."""


class Conflict(DuplexError):
    """A valid request that does not fit the current state."""


class Capacity(DuplexError):
    """No room or time for it now (admission, rate, queue, deadline): retry later."""


class EngineError(DuplexError):
    """The server failed, not the request."""


class EngineDead(EngineError):
    """The engine died: one terminal error, then every affected session ends."""

    terminal = True


@dataclass(frozen=True)
class ErrorSpec:
    code: str
    type: str
    retryable: bool
    http_status: int
    kind: type[DuplexError]

    @property
    def grpc_status(self) -> str:
        """The gRPC status code name (``grpc.StatusCode``) a gRPC surface answers with."""
        return _GRPC_BY_CODE.get(self.code) or next(
            name for kind, name in _GRPC_BY_KIND if issubclass(self.kind, kind))

    @property
    def terminal(self) -> bool:
        """Terminal errors end the session (the socket is closed after the event)."""
        return self.kind.terminal


# gRPC status names (the core does not import grpc): by kind, first match wins,
# with the codes whose kind alone does not say it.
_GRPC_BY_KIND: tuple[tuple[type[DuplexError], str], ...] = (
    (Unsupported, "UNIMPLEMENTED"),  # a capability error: this engine does not offer it
    (InvalidRequest, "INVALID_ARGUMENT"),
    (AccessDenied, "UNAUTHENTICATED"),
    (NotFound, "NOT_FOUND"),
    (Expired, "NOT_FOUND"),  # told apart from unknown by the ErrorInfo reason
    (ResyncRequired, "OUT_OF_RANGE"),
    (Closed, "FAILED_PRECONDITION"),
    (Conflict, "FAILED_PRECONDITION"),
    (Capacity, "RESOURCE_EXHAUSTED"),
    (EngineDead, "UNAVAILABLE"),
    (EngineError, "INTERNAL"),
)
_GRPC_BY_CODE = {
    "payload_too_large": "INVALID_ARGUMENT",
    "duplicate_id": "ALREADY_EXISTS",
    "lease_conflict": "ABORTED",  # a lost compare-and-swap: re-read, then retry
    "conversation_already_has_active_response": "ABORTED",
    "deadline_exceeded": "DEADLINE_EXCEEDED",
    "stage_failed": "UNAVAILABLE",
    "store_unavailable": "UNAVAILABLE",
}

_INVALID = "invalid_request_error"
_SERVER = "server_error"

ERRORS: dict[str, ErrorSpec] = {
    s.code: s
    for s in [
        # framing
        ErrorSpec("invalid_json", _INVALID, False, 400, FramingError),
        ErrorSpec("invalid_event", _INVALID, False, 400, FramingError),
        ErrorSpec("unknown_event", _INVALID, False, 400, FramingError),
        ErrorSpec("event_too_large", _INVALID, False, 413, FramingError),
        ErrorSpec("payload_too_large", _INVALID, False, 413, InvalidRequest),
        ErrorSpec("invalid_audio", _INVALID, False, 400, InvalidMedia),
        ErrorSpec("invalid_image", _INVALID, False, 400, InvalidMedia),
        ErrorSpec("rate_limited", _INVALID, True, 429, Capacity),
        # configuration
        ErrorSpec("invalid_value", _INVALID, False, 400, InvalidRequest),
        ErrorSpec("immutable_field", _INVALID, False, 400, InvalidRequest),
        ErrorSpec("unsupported_audio_format", _INVALID, False, 400, Unsupported),
        ErrorSpec("unsupported_turn_detection", _INVALID, False, 400, Unsupported),
        ErrorSpec("capability_unsupported", _INVALID, False, 400, Unsupported),
        # conversation
        ErrorSpec("input_audio_buffer_empty", _INVALID, False, 400, Conflict),
        ErrorSpec("conversation_already_has_active_response", _INVALID, True, 409, Conflict),
        ErrorSpec("response_cancel_not_active", _INVALID, False, 400, Conflict),
        # GPT-Live: one audio fixture plays at a time (realtime/wire/live/fixtures.py)
        ErrorSpec("fixture_already_playing", _INVALID, False, 409, Conflict),
        ErrorSpec("item_not_found", _INVALID, False, 404, NotFound),
        ErrorSpec("sequence_gap", _INVALID, False, 409, Conflict),
        ErrorSpec("input_after_end", _INVALID, False, 409, Conflict),
        # sessions and access
        ErrorSpec("unauthorized", "authentication_error", False, 401, AccessDenied),
        ErrorSpec("session_not_found", _INVALID, False, 404, NotFound),
        ErrorSpec("session_expired", _INVALID, False, 410, Expired),
        ErrorSpec("session_closed", _INVALID, False, 409, Closed),
        ErrorSpec("invalid_resume_token", _INVALID, False, 401, AccessDenied),
        # ephemeral client keys (POST /v1/realtime/client_secrets)
        ErrorSpec("client_secret_expired", "authentication_error", False, 401, AccessDenied),
        ErrorSpec("client_secret_used", "authentication_error", False, 401, AccessDenied),
        ErrorSpec("client_secret_mismatch", _INVALID, False, 403, AccessDenied),
        # WebRTC calls (POST /v1/realtime/calls)
        ErrorSpec("invalid_sdp", _INVALID, False, 400, InvalidRequest),
        ErrorSpec("unsupported_codec", _INVALID, False, 400, Unsupported),
        ErrorSpec("call_not_found", _INVALID, False, 404, NotFound),
        # phone calls (realtime/server/telephony): a webhook whose signature does not verify
        ErrorSpec("invalid_signature", "authentication_error", False, 403, AccessDenied),
        ErrorSpec("lease_conflict", _INVALID, True, 409, Conflict),
        ErrorSpec("duplicate_id", _INVALID, False, 409, Conflict),
        ErrorSpec("model_not_found", _INVALID, False, 404, NotFound),
        ErrorSpec("model_mismatch", _INVALID, False, 409, Conflict),
        ErrorSpec("wrong_instance", _INVALID, True, 421, Conflict),
        ErrorSpec("stream_not_found", _INVALID, False, 404, NotFound),
        ErrorSpec("stream_expired", _INVALID, False, 410, Expired),
        ErrorSpec("resync_required", _INVALID, False, 410, ResyncRequired),
        ErrorSpec("unsupported_option", _INVALID, False, 400, Unsupported),
        ErrorSpec("request_not_found", _INVALID, False, 404, NotFound),
        ErrorSpec("generation_finished", _INVALID, False, 409, Closed),
        ErrorSpec("deadline_exceeded", _SERVER, True, 504, Capacity),
        ErrorSpec("resource_exhausted", _SERVER, True, 429, Capacity),
        ErrorSpec("at_capacity", _SERVER, True, 429, Capacity),
        # engine
        ErrorSpec("stage_failed", _SERVER, True, 500, EngineError),
        # a session's remote MCP server did not answer as it should (session/mcp_calls.py)
        ErrorSpec("mcp_server_error", _SERVER, True, 502, EngineError),
        # a GPT-Live delegation's external Responses backend failed its run
        # (realtime/server/live/backend.py): the delegation ends, the session goes on
        ErrorSpec("backend_error", _SERVER, True, 502, EngineError),
        ErrorSpec("engine_dead", _SERVER, True, 503, EngineDead),
        # a durable session store (durability: redis) cannot be reached: a session
        # not held here cannot be looked up or taken over now (durable/takeover.py)
        ErrorSpec("store_unavailable", _SERVER, True, 503, EngineError),
        ErrorSpec("internal_error", _SERVER, True, 500, EngineError),
    ]
}
