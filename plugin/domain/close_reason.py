"""Why a realtime session ended, and the WebSocket close code that says so.

One enum instead of free strings: the session records a ``CloseReason``, the
transport closes the socket with ``reason.code`` and ``reason.value`` as the
close reason text, and ``/metrics`` labels closes with ``reason.value``. The
values and codes are wire contract (``docs/errors.md``, "WebSocket close
codes"); ``tests/unit/test_close_reason.py`` pins them against that table.

It is a ``str`` enum so the session manager, which is shared with the HTTP
application sessions and speaks plain strings, can pass ``"expired"`` or
``"shutdown"`` and store a member as the string it is.
"""

from __future__ import annotations

import enum


class CloseReason(str, enum.Enum):
    code: int

    def __new__(cls, value: str, code: int) -> CloseReason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.code = code
        return member

    CLIENT = ("client", 1000)  # session.close, a clean close of its socket (1000/1001), a DELETE
    DISCONNECT = ("disconnect", 1000)  # the socket ended and the session cannot wait for a resume
    EXPIRED = ("expired", 1000)  # the lease lapsed (no resume within the grace window)
    SHUTDOWN = ("shutdown", 1001)  # the server is stopping
    SLOW_CONSUMER = ("slow_consumer", 1008)  # the socket stopped reading (without resume)
    ENGINE_DEAD = ("engine_dead", 1011)  # a terminal stage error (``ErrorSpec.terminal``)
    START_FAILED = ("start_failed", 1000)  # the pipeline did not open; the socket is refused
    HANGUP = ("hangup", 1000)  # a call ended (its peer hung up, or the hangup route): WebRTC, SIP
    MAX_DURATION = ("max_duration", 1000)  # the session reached limits.max_session_s
    # Another worker adopted the session (this one lost its lease: stopped, cut
    # off from the store): the socket resumes there (vllm_duplex.durable).
    MOVED = ("moved", 4009)

    def __str__(self) -> str:
        return self.value
