"""``Reply``: everything about one reply, from its request to its end.

A session has at most one reply (``Floor.reply``). It starts in one of two
ways (``Floor.speculate``, ``Floor.respond``):

* **asked for** (``response.create``, or the policy's ``Respond``):
  shown at once -- ``response.created`` goes out and its outputs follow;
* **speculated** at a pause (``pauses.py``): *held*, not shown. The policy
  decides each of its outputs as they come (its text goes on to the TTS, so
  the audio is made too) and the reply keeps them with the policy's steps.
  Claiming it (a response asked for with exactly the context it was started
  on, ``claimable``) shows it: ``response.created``, then the held outputs
  are carried out in order, and the rest streams as usual.

The reply owns what is about it alone: its request, the words and context
it answers, its held outputs, what the client has seen of it
(``ResponseRecord``: the response, its items, their events and the text the
client received), its pacer (paced audio and what was heard), its latency
figures (``ResponseTimes``) and the trace of the turn it answers (its
outputs stamp the critical path, ``critical_path.py``), when its first audio went out, and whether it
is complete and waits only for its audio to play out and its MCP calls
(``mcp_calls.py``) to come back, and its MCP side: whether a follow-up
answers their results once it completes, whether it is one, and what its own
MCP servers offer.

It ends one way, ``Floor.end(End...)`` (``floor.py``) -- completed, cancelled
by the client, cut by the user's speech (barge-in, or words that changed
under it), failed, or discarded unseen (a speculation nothing claimed, or
one a response asked differently supersedes) -- which moves the fence where
the reply is void, ends it here (``finish``: the ``response.done`` events,
cut to what was heard), cancels the stage requests and clears its timers.
Whether speech is pausing it is the turn's phase (``phase.py``), not a flag
of the reply.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.contracts import InterruptReason, PolicyStep
from vllm_duplex.domain.conversation import ResponseStatus
from vllm_duplex.domain.payloads import AudioOut, ContextMessage, StageFailed, StageOutput
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.critical_path import TurnTrace
from vllm_duplex.session.latency import ResponseTimes
from vllm_duplex.session.pacing import PACING, OutputPacer, due_frames
from vllm_duplex.session.rendering import Scope, audio_going_out
from vllm_duplex.session.responses import ResponseRecord
from vllm_duplex.session.speculation import same_context


class End(enum.Enum):
    """How a reply ends, and what that means for the client and the stages."""

    COMPLETED = "completed"  # all of it went out: response.done(completed)
    CANCELLED = "client_cancelled"  # response.cancel, or the client cut its item
    TURN_DETECTED = "turn_detected"  # speech over it, or its words changed: cut to the heard
    FAILED = "failed"  # a stage failed it: response.done(failed)
    DISCARDED = "discarded"  # never shown: a speculation nothing claimed, or one superseded

    @property
    def voids(self) -> bool:
        """The fence moves past it: nothing more of it reaches the client,
        and its stage requests are aborted."""
        return self in (End.CANCELLED, End.TURN_DETECTED, End.DISCARDED)

    @property
    def interrupt(self) -> InterruptReason | None:
        return {End.CANCELLED: InterruptReason.CLIENT_CANCELLED,
                End.TURN_DETECTED: InterruptReason.TURN_DETECTED}.get(self)


@dataclass(frozen=True)
class Ending:
    """What ending a reply sends: its events (``response.done`` and the
    item's end, the truncation) and the timers it stops."""

    events: list[ev.ServerEvent]
    timers: list[CancelTimer]


class Reply:
    def __init__(self, response_id: str, request_id: str, *, trace: TurnTrace,
                 answers: str = "", context: tuple[ContextMessage, ...] = ()) -> None:
        self.id = response_id
        self.request_id = request_id
        self.trace = trace  # the critical path of the turn it answers, its outputs stamped in
        self.answers = answers  # speculated: the user's words it answers
        self.context = context  # ... and the context it was started on
        self.held: list[tuple[StageOutput, Sequence[PolicyStep]]] = []  # its outputs while unseen
        self.record: ResponseRecord | None = None  # what the client sees of it, once shown
        self.pacer: OutputPacer | None = None  # paced audio (None: as fast as made)
        # Unpaced: the audio made while speech over it is judged (BARGE_PAUSED),
        # sent if the reply resumes, dropped if it is cut.
        self.paused_audio: list[AudioOut] = []
        self.times = ResponseTimes(created_at=0.0, turn_end_at=None)
        self.first_audio_at: float | None = None  # when the client got its first audio
        self.complete = False  # generated to the end; response.done waits for its audio ...
        # Its MCP side (mcp_calls.py): the calls it made that its end waits on
        # (their item ids), whether a follow-up answers their results once it
        # completes, whether it is such a follow-up, and what its own MCP
        # servers offer (None: the session's, by tool name -> server, annotations).
        self.calls: set[str] = set()
        self.answered = False
        self.follows_up = False
        self.mcp_tools: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] | None = None

    # ---- held (speculated) ------------------------------------------------------

    def owns(self, out: StageOutput) -> bool:
        """``out`` is this reply's: its text, audio and end, or the failure of its request."""
        p = out.payload
        return (getattr(p, "response_id", None) == self.id
                or (type(p) is StageFailed and out.request_id == self.request_id))

    def keep(self, out: StageOutput, steps: Sequence[PolicyStep]) -> None:
        """An output of the reply while it is unseen, with the policy's steps for it."""
        self.held.append((out, steps))

    def claimable(self, context: tuple[ContextMessage, ...]) -> bool:
        """A response asked with ``context`` may be this held reply (the same
        conversation, and the words it answers are the ones heard)."""
        return same_context(self.context, context)

    def show(self, record: ResponseRecord, times: ResponseTimes,
             pacer: OutputPacer | None) -> list[tuple[StageOutput, Sequence[PolicyStep]]]:
        """The client sees the reply from now on; returns what it held, to be
        carried out in order."""
        self.record, self.times, self.pacer = record, times, pacer
        held, self.held = self.held, []
        return held

    # ---- shown --------------------------------------------------------------

    def audio_sent(self, p: AudioOut, now: float) -> list[ev.ServerEvent]:
        """Reply audio goes to the client now (unpaced, or a paced frame)."""
        assert self.record is not None
        if self.first_audio_at is None:
            self.first_audio_at = now
        return self.record.on_audio(p)

    def send_due(self, scope: Scope) -> tuple[list[ev.ServerEvent], ArmTimer | None]:
        """Its paced frames due now, rendered (a frame keeps its events: resent
        as they were after a resume), and the timer of the next frame or
        silence (None: drained, and nothing to keep fed)."""
        assert self.pacer is not None
        frames, timer = due_frames(self.pacer, scope.now, more_coming=not self.complete)
        events: list[ev.ServerEvent] = []
        for frame in frames:
            if not frame.events:
                frame.events = audio_going_out(scope, self, frame.audio)
            events += frame.events
        return events, timer

    @property
    def drained(self) -> bool:
        """All its audio went out (unpaced: as it was made)."""
        return self.pacer is None or self.pacer.drained

    def heard_ms(self, now: float) -> int | None:
        """How much of its audio the client has played: exact when paced; unpaced,
        the client plays from the first delta, so no more than the time since."""
        if self.pacer is not None:
            return self.pacer.heard_ms(now)
        if self.first_audio_at is None:
            return None
        return int((now - self.first_audio_at) * 1000)

    def played_out_at(self, now: float) -> float:
        """When the client finishes playing its audio."""
        if self.pacer is not None:
            return max(now, self.pacer.play_end or now)
        if self.first_audio_at is None or self.record is None:
            return now
        return max(now, self.first_audio_at + self.record.part.audio_ms / 1000.0)

    def finish(self, end: End, now: float, error: dict | None = None) -> Ending:
        """End it here: the client's events (none for a reply never shown)
        and its pacing timer. (The barge-in timer is the turn's: the core
        stops it when it leaves the barge-paused phase.)"""
        # (drained, a pacer keeping the player fed may still have its timer)
        timers = [CancelTimer(PACING)] if self.pacer is not None else []
        record = self.record
        if record is None:
            return Ending([], timers)
        truncated = None
        heard = self.heard_ms(now)
        if end is End.TURN_DETECTED and self.first_audio_at is not None and heard is not None:
            truncated = record.cut_to_heard(heard)
        if end is End.COMPLETED:
            events = record.finish(ResponseStatus.COMPLETED, self.times)
        elif end is End.FAILED:
            events = record.finish(ResponseStatus.FAILED, self.times,
                                   {"type": "failed", "error": error})
        else:
            assert end.interrupt is not None
            events = record.finish(ResponseStatus.CANCELLED, self.times,
                                   {"type": "cancelled", "reason": end.interrupt.value})
        return Ending(events + ([truncated] if truncated is not None else []), timers)
