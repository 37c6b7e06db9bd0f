"""One error table for every surface (WebSocket, HTTP, stages).

Each code maps to an OpenAI-style error ``type``, whether a retry can succeed,
and the HTTP status used by HTTP surfaces. Raise ``DuplexError(code, ...)``
anywhere; surfaces render it with ``to_wire``.

Hierarchy::

    Exception
    └── DuplexError            one code from ERRORS; carries param/event_id
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ErrorSpec:
    code: str
    type: str
    retryable: bool
    http_status: int
    # Terminal errors end the session (the socket is closed after the event).
    terminal: bool = False


_INVALID = "invalid_request_error"
_SERVER = "server_error"

ERRORS: dict[str, ErrorSpec] = {
    s.code: s
    for s in [
        # framing
        ErrorSpec("invalid_json", _INVALID, False, 400),
        ErrorSpec("invalid_event", _INVALID, False, 400),
        ErrorSpec("unknown_event", _INVALID, False, 400),
        ErrorSpec("event_too_large", _INVALID, False, 413),
        ErrorSpec("payload_too_large", _INVALID, False, 413),
        ErrorSpec("invalid_audio", _INVALID, False, 400),
        ErrorSpec("invalid_image", _INVALID, False, 400),
        ErrorSpec("rate_limited", _INVALID, True, 429),
        # configuration
        ErrorSpec("invalid_value", _INVALID, False, 400),
        ErrorSpec("immutable_field", _INVALID, False, 400),
        ErrorSpec("unsupported_audio_format", _INVALID, False, 400),
        ErrorSpec("unsupported_turn_detection", _INVALID, False, 400),
        ErrorSpec("capability_unsupported", _INVALID, False, 400),
        # conversation
        ErrorSpec("input_audio_buffer_empty", _INVALID, False, 400),
        ErrorSpec("conversation_already_has_active_response", _INVALID, True, 409),
        ErrorSpec("response_cancel_not_active", _INVALID, False, 400),
        ErrorSpec("item_not_found", _INVALID, False, 404),
        ErrorSpec("sequence_gap", _INVALID, False, 409),
        ErrorSpec("input_after_end", _INVALID, False, 409),
        # sessions and access
        ErrorSpec("unauthorized", "authentication_error", False, 401),
        ErrorSpec("session_not_found", _INVALID, False, 404),
        ErrorSpec("session_expired", _INVALID, False, 410),
        ErrorSpec("session_closed", _INVALID, False, 409),
        ErrorSpec("invalid_resume_token", _INVALID, False, 401),
        ErrorSpec("lease_conflict", _INVALID, True, 409),
        ErrorSpec("model_not_found", _INVALID, False, 404),
        ErrorSpec("model_mismatch", _INVALID, False, 409),
        ErrorSpec("wrong_instance", _INVALID, True, 421),
        ErrorSpec("stream_not_found", _INVALID, False, 404),
        ErrorSpec("stream_expired", _INVALID, False, 410),
        ErrorSpec("resync_required", _INVALID, False, 410),
        ErrorSpec("unsupported_option", _INVALID, False, 400),
        ErrorSpec("request_not_found", _INVALID, False, 404),
        ErrorSpec("generation_finished", _INVALID, False, 409),
        ErrorSpec("deadline_exceeded", _SERVER, True, 504),
        ErrorSpec("resource_exhausted", _SERVER, True, 429),
        # engine
        ErrorSpec("stage_failed", _SERVER, True, 500, terminal=False),
        ErrorSpec("engine_dead", _SERVER, True, 503, terminal=True),
        ErrorSpec("internal_error", _SERVER, True, 500),
    ]
}


class DuplexError(Exception):
    """An error with a code from ``ERRORS``."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        if code not in ERRORS:
            raise KeyError(f"unknown error code {code!r}; add it to ERRORS")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.details = dict(details or {})  # extra wire fields, e.g. owner_instance_id

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
        return f"DuplexError({self.code!r}, {self.message!r}, param={self.param!r})"
