"""The vocabulary between the session core and its runner.

``SessionCore.handle(message, now)`` takes one *message* and returns the
*effects* it causes, in order; the runner (``runner.py``) carries them out
and turns what happens in the world back into messages. The core never
awaits: an effect is a description of I/O, not I/O.

Messages are client commands (``vllm_duplex.domain.commands``), stage outputs
(``StageOutput``) and the few internal ones below. Effects are frozen and
slotted: a 20 ms audio chunk makes one or two of them, so they stay cheap.

Metrics are not effects: they are counters in the process's in-memory
registry, which the core increments directly (no I/O, nothing to order
against the socket), so the hot path does not pay an effect per counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope, ServerEvent
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.payloads import StageOutput, VideoFrame

# ---- messages (beyond commands and stage outputs) ---------------------------


@dataclass(frozen=True, slots=True)
class FrameDecoded:
    """A camera frame or image the runner decoded (after ``DecodeImage``,
    ``PollVideo``): it goes to the policy now."""

    frame: VideoFrame


@dataclass(frozen=True, slots=True)
class Failed:
    """Something the runner did for the session failed with ``error``: the
    client gets it as an error event (e.g. an image that does not decode)."""

    error: DuplexError


# ---- effects ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Emit:
    """Send ``envelope`` to the client (journal it, queue it on the socket)."""

    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Submit:
    """Submit ``payload`` to the stage called ``stage`` under ``fence``;
    ``role`` names the request in its fenced request id."""

    stage: str
    fence: Fence
    role: str
    payload: Any


@dataclass(frozen=True, slots=True)
class Forward:
    """Pass an admitted stage output on to the stage called ``to`` (keeping
    its fence and request id, so what that stage makes of it stays
    attributable to the original request)."""

    output: StageOutput
    to: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Abort, in every stage, the work older than ``fence``."""

    fence: Fence


@dataclass(frozen=True, slots=True)
class Close:
    """End the session (always the last effect of its batch)."""

    reason: CloseReason


@dataclass(frozen=True, slots=True)
class AckEvents:
    """The client holds every event up to ``seq``: the journal may drop them."""

    seq: int


@dataclass(frozen=True, slots=True)
class DecodeImage:
    """Decode an encoded still image off the event loop, then hand the core a
    ``FrameDecoded`` (or a ``Failed`` echoing ``event_id``) before anything
    else: the effects after it in its batch are dropped when it fails (they
    are the next images of the same item, as a raised error stops them)."""

    data: bytes
    timestamp_ms: int
    source: str  # VideoFrame.source: "frame" | "image"
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class FeedVideo:
    """Feed a WebM/MP4 fragment to the session's stream decoder; its frames
    come back through ``PollVideo`` when it wakes the session."""

    data: bytes
    container: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class PollVideo:
    """Take the frames the stream decoder has ready (one ``FrameDecoded`` each)."""


# ---- timers -------------------------------------------------------------------
# The core asks for a wake-up at a time on the session's clock; the runner
# sleeps on that clock (the virtual one in tests) and hands back
# ``TimerFired``. One timer per name: arming a name again replaces it. A fired
# timer the core no longer wants is ignored there, so a cancel racing the
# wake-up is harmless.


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """Hand the core ``TimerFired(name)`` at clock time ``at``."""

    name: str
    at: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """Forget the timer called ``name`` (if armed)."""

    name: str


@dataclass(frozen=True, slots=True)
class TimerFired:
    """Message: the timer called ``name`` is due."""

    name: str


# What the runner carries out (``runner.py``): the effects above and the timers.
Effect = (Emit | Submit | Forward | Cancel | Close | AckEvents | DecodeImage | FeedVideo | PollVideo
          | ArmTimer | CancelTimer)


# ---- the effects of one message, in order ------------------------------------


class EffectLog:
    """What handling one message causes, in order, and the message's time.

    The session core alone writes here (its parts return steps, which it
    carries out, ``carrying.py``); the core's ``handle`` takes the list. Events are numbered here (``seq``) and stamped
    with the gate's fence as it is when they are emitted: an event emitted
    after an epoch bump carries the new epoch."""

    def __init__(self, gate: FenceGate, now: float) -> None:
        self._gate = gate
        self._seq = 0
        self._effects: list[Any] = []
        self.now = now  # the time of the message being handled
        self.received_at = now  # when it entered the mailbox (latencies count from there)

    def add(self, effect: Any) -> None:
        self._effects.append(effect)

    @property
    def seq(self) -> int:
        """The seq of the last event emitted."""
        return self._seq

    def continue_after(self, seq: int) -> None:
        """Number the next event ``seq + 1`` (a session rebuilt from a store)."""
        self._seq = seq

    def emit(self, event: ServerEvent) -> None:
        self._seq += 1
        self._effects.append(Emit(Envelope(self._seq, self._gate.fence, event)))

    def emit_all(self, events: Sequence[ServerEvent]) -> None:
        for event in events:
            self.emit(event)

    def take(self) -> list[Any]:
        effects, self._effects = self._effects, []
        return effects
