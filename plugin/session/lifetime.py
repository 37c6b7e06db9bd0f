"""A realtime session's maximum length (``limits.max_session_s``; OpenAI
Realtime ends its sessions at 60 minutes): the session object carries its
``expires_at``; ``end_warning_s`` before the end the client gets
``duplex.session.expiring {seconds_left}`` (time to wrap up, or to open the
next session and carry the conversation over); at the end an error
``session_expired`` names the limit, then ``session.closed`` and the socket's
close (1000, ``max_duration``).

Pure: functions of the session's limits: the two timers to arm, the warning
and the error the core ends the session with.
"""

from __future__ import annotations

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.session.effects import ArmTimer
from vllm_duplex.session.limits import SessionLimits

WARNING = "session_end_warning"  # the session's timers
END = "session_end"


def arm(limits: SessionLimits, now: float) -> list[ArmTimer]:
    """At the session's start: the warning and the end, when it has a maximum."""
    max_s = limits.max_session_s
    if not max_s:
        return []
    warn_at = max_s - limits.end_warning_s
    timers = [ArmTimer(WARNING, now + warn_at)] if warn_at > 0 else []
    return [*timers, ArmTimer(END, now + max_s)]


def warning(limits: SessionLimits) -> ev.SessionExpiring:
    return ev.SessionExpiring(seconds_left=int(round(limits.end_warning_s)))


def expired(limits: SessionLimits) -> DuplexError:
    """The error the session ends with (then ``session.closed``, ``max_duration``)."""
    max_s = limits.max_session_s
    assert max_s
    minutes = f"{max_s / 60:g} minutes" if max_s >= 60 else f"{max_s:g} s"
    return DuplexError("session_expired", f"the session reached its maximum length of "
                       f"{minutes} (limits.max_session_s); open a new one to go on")
