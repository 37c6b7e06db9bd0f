"""What the GPT-Live codec's ``parse`` returns besides the session's own
commands: the start of a session, a key pressed on a call, and a command it
answers itself. Plain data; the shells act on them (``realtime/server/live``)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_duplex.domain.commands import ItemCreate
from vllm_duplex.domain.session_config import SessionPatch


@dataclass(frozen=True)
class LiveStart:
    """``session.start``: the shell opens the session with ``patch``."""

    patch: SessionPatch
    model: str  # as the client named it (the session resource repeats it)
    event_id: str | None = None
    history: tuple[ItemCreate, ...] = ()  # session.input, created before anything is heard


@dataclass(frozen=True)
class LiveDtmf:
    """``transport.dtmf.send``: a sideband presses ``digit`` on a SIP call."""

    digit: str
    event_id: str | None = None


DTMF_KEYS = "0123456789*#ABCD"  # what transport.dtmf.send may press (the SDK's list)


@dataclass(frozen=True)
class LiveAck:
    """A command the codec answers itself, at once (mute, unmute)."""

    type: str
    event_id: str | None = None
