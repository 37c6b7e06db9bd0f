"""A realtime session's maximum length (``limits.max_session_s``; OpenAI
Realtime ends its sessions at 60 minutes): the session object carries its
``expires_at``; ``end_warning_s`` before the end the client gets
``duplex.session.expiring {seconds_left}`` (time to wrap up, or to open the
next session and carry the conversation over); at the end an error
``session_expired`` names the limit, then ``session.closed`` and the socket's
close (1000, ``max_duration``).

Pure: functions of the core that arm the two timers and carry them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_duplex.core import events as ev
from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.session.effects import ArmTimer, Close

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore

WARNING = "session_end_warning"  # the session's timers
END = "session_end"


def arm(core: SessionCore) -> None:
    """At the session's start: the warning and the end, when it has a maximum."""
    max_s = core.limits.max_session_s
    if not max_s:
        return
    warn_at = max_s - core.limits.end_warning_s
    if warn_at > 0:
        core.effect(ArmTimer(WARNING, core.now + warn_at))
    core.effect(ArmTimer(END, core.now + max_s))


def warn(core: SessionCore) -> None:
    core.emit(ev.SessionExpiring(seconds_left=int(round(core.limits.end_warning_s))))


def end(core: SessionCore) -> None:
    max_s = core.limits.max_session_s
    assert max_s
    minutes = f"{max_s / 60:g} minutes" if max_s >= 60 else f"{max_s:g} s"
    core.error(DuplexError("session_expired",
                           f"the session reached its maximum length of {minutes} "
                           "(limits.max_session_s); open a new one to go on"))
    core.emit(ev.SessionClosed(reason=CloseReason.MAX_DURATION.value))
    core.effect(Close(CloseReason.MAX_DURATION))
