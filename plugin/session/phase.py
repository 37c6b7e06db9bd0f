"""The turn's phase: one value, moved only along the table below.

"Why didn't the reply start?" is answered here: the session is listening,
judging a pause, holding an answer, responding, or paused by speech over
its reply -- and the last move says what moved it.

================  ==============================================================
``LISTENING``     no reply; the user may be speaking (``UserTurn.speaking``)
``PAUSED``        semantic_vad: the VAD's end of speech is held while the pause
                  is judged (``pauses.py``; ``Pause.deadline``); no reply yet
``ANSWER_HELD``   a reply started at the pause, not shown (``Floor.held``; it has
                  no ``ResponseRecord`` yet): it waits for the final transcript
                  to confirm its words (the pause may still be judged meanwhile)
``RESPONDING``    a reply is shown and going out
``BARGE_PAUSED``  speech over the reply paused it; its words (or its length, at
                  the ``barge_in`` timer) decide between resuming and cutting it
================  ==============================================================

A pause the user takes while a reply is shown (e.g. in speech over it) is
data of the pause (``Pause.held``), not a phase: the reply's phase says what
the client hears. Like python-websockets' ``State``, the value has one
writer, ``TurnPhase.to``, and a move the table does not list is a bug
(``AssertionError``), caught by the core's containment and the tests.
"""

from __future__ import annotations

import enum
import logging

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    LISTENING = "listening"
    PAUSED = "paused"
    ANSWER_HELD = "answer_held"
    RESPONDING = "responding"
    BARGE_PAUSED = "barge_paused"


L, P, H, R, B = Phase.LISTENING, Phase.PAUSED, Phase.ANSWER_HELD, Phase.RESPONDING, Phase.BARGE_PAUSED

# Every move, with what makes it. A phase may also stay where it is.
TRANSITIONS: dict[tuple[Phase, Phase], str] = {
    (L, P): "semantic_vad heard a pause: its end of speech is held while judged",
    (P, L): "the user spoke on, or the pause's deadline committed the turn",
    (L, H): "server_vad: a reply started at the pause (or semantic_vad's, after the commit)",
    (P, H): "the words up to the pause look complete: a reply starts, held",
    (H, L): "the held reply was discarded (speech, other words, a fence move)",
    (H, P): "the held reply was discarded while the pause is still judged",
    (L, R): "a reply was asked for (response.create, the policy, the idle timeout)",
    (P, R): "a reply was asked for while a pause is judged",
    (H, R): "the held reply was claimed: shown, its held outputs go out",
    (R, B): "speech over the reply paused it",
    (B, R): "the speech over it was a backchannel or noise: it resumes",
    (R, L): "the reply ended (done, cancelled, failed)",
    (B, L): "the reply ended while paused (the speech was a turn, or a cancel)",
    (R, P): "the reply ended while a pause is judged",
    (B, P): "the reply ended while a pause in the speech over it is judged",
}


class TurnPhase:
    """The session's phase and why it is there."""

    def __init__(self) -> None:
        self.value = Phase.LISTENING
        self.why = "the session started"

    def __repr__(self) -> str:
        return f"TurnPhase({self.value.value}: {self.why})"

    def to(self, phase: Phase) -> None:
        if phase is self.value:
            return
        why = TRANSITIONS.get((self.value, phase))
        assert why is not None, f"no move from {self.value.value} to {phase.value}"
        log.debug("turn phase %s -> %s: %s", self.value.value, phase.value, why)
        self.value, self.why = phase, why
