"""Semantic end of turn (``semantic_vad``): when a pause ends the user's turn.

Silence alone is a poor judge: a thinking pause inside "what is the capital
of ... France" is as long as the one after the question. So the session
weighs the silence against what was said: ``P(end)``, the probability the
served LLM gives the chat template's end-of-turn token right after the words
heard so far (``TurnEndProbability``, read for free from the live request's
prefill chunks -- the way LiveKit's turn detector uses a SmolLM2 fine-tune).

``needed_silence_ms(p, eagerness)`` is the whole rule, pure:

* a phrase the model is sure is complete (``p >= P_SURE``) commits after the
  eagerness's *fast* silence (150-400 ms);
* an unfinished one (``p <= P_UNSURE``, e.g. "what is the capital of":
  P < 0.001 with SmolLM2-135M) waits for the *cap* (1.2-3 s), where silence
  alone ends the turn, as server VAD would;
* in between, on a log scale of ``p`` and eased (squared) so that a likely
  ending ("tell me a joke", P ~ 0.05) is still quick and a filler ("so um",
  P ~ 0.02) waits noticeably longer.

``TurnEndDecider`` is the state of one pause (sans-I/O: times in, deadlines
and decisions out) and ``Pause`` what the session holds while it lasts: the
VAD's end of speech and the deadline of the timer armed for it. ``Pauses``
composes them (``pauses.py``, the ``turn_end`` step of ``decisions.py``'s
chain): it holds the VAD's end of speech while the pause lasts, tells the
policy (``UserPaused``), which pushes the words it held back (so the model
judges them while the ASR works) and may ask its ASR for every word up to
the pause -- then only a ``P(end)`` of exactly the ASR's answer
(``TranscriptPartial(at_pause=True)``) is judged: a hypothesis that missed
the last word ("what is the capital of your st...") must not end the turn,
nor start the reply. It arms the ``turn_end`` timer at the decider's
deadline (the cap until the words are judged; re-armed when the words up to
the pause or a new ``P(end)`` arrive) and, when it fires, lets the held end
of speech through: the turn commits exactly as under server VAD. Speech
before the deadline drops the hold (and any reply started in the pause): the
pause did not take the turn, and the client never heard of it.

Under ``server_vad`` the decider still follows each pause (the VAD's
``VadPaused``), so a reply can start on the words up to it; nothing is held
and no timer is armed -- the VAD ends the turn itself.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from vllm_duplex.domain.payloads import StageOutput
from vllm_duplex.domain.words import spoken_words

log = logging.getLogger(__name__)

TIMER = "turn_end"  # the session's timer at a pause's deadline


# The VAD's silence before it reports a pause (semantic_vad: every pause this
# long, the decider says which ones end the turn; server_vad: the pause before
# its silence ends the turn, where the reply is prepared). Three of
# Silero's 32 ms windows (96 ms) heard the pause ~30 ms sooner but put the
# words at the pause on the reply's path (see silero_vad.SUGGESTED_QUIET_DBFS) and
# paused mid-sentence in one utterance in twenty (at 64 ms: one in four).
PAUSE_DETECT_MS = 100

P_SURE = 0.1  # at or above: the words are a complete turn
P_UNSURE = 0.001  # at or below: the words are unfinished


@dataclass(frozen=True)
class Timing:
    fast_ms: int  # silence that ends a surely complete turn
    cap_ms: int  # silence that ends any turn


# auto is medium, as in OpenAI's semantic_vad.
EAGERNESS_TIMING = {
    "high": Timing(150, 1200),
    "auto": Timing(200, 2000),
    "medium": Timing(200, 2000),
    "low": Timing(400, 3000),
}


def needed_silence_ms(p: float | None, eagerness: str) -> int:
    """The silence after which the turn ends, given ``P(end) = p`` (None:
    not known yet -- the cap, until the model has judged the words)."""
    t = EAGERNESS_TIMING[eagerness]
    if p is None or p <= P_UNSURE:
        return t.cap_ms
    sure = min(1.0, math.log(p / P_UNSURE) / math.log(P_SURE / P_UNSURE))
    return round(t.fast_ms + (t.cap_ms - t.fast_ms) * (1.0 - sure) ** 2)


@dataclass(frozen=True)
class TurnEndDecision:
    """Why a turn ended: what the model said (``p``, about ``text``), the
    silence heard and the silence that was needed."""

    p: float | None
    text: str
    silence_ms: int
    needed_ms: int
    eagerness: str

    @property
    def reason(self) -> str:
        """``semantic``: the words ended it before the cap; ``silence``: the cap did."""
        return "silence" if self.needed_ms >= EAGERNESS_TIMING[self.eagerness].cap_ms else "semantic"

    def wire(self) -> dict[str, object]:
        return {"p_end": self.p, "text": self.text, "silence_ms": self.silence_ms,
                "needed_ms": self.needed_ms, "eagerness": self.eagerness, "reason": self.reason}


class TurnEndDecider:
    """One pause at a time: its start, the words heard up to it, and the
    newest ``P(end)``."""

    def __init__(self) -> None:
        self.paused_at: float | None = None
        self.p: float | None = None
        self.text = ""
        # The ASR is still hearing the pause out: the words are not all known.
        self.hearing = False
        self.words: list[str] | None = None  # every word up to the pause, once heard
        self.heard_text = ""  # ... as the ASR wrote them

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def judged(self) -> float | None:
        """``P(end)`` of the words up to the pause; None: not known yet."""
        return None if self.hearing else self.p

    def pause(self, started_at: float, *, words_pending: bool, hearing: bool = False) -> None:
        """A pause began at ``started_at``; ``words_pending``: words were just
        pushed to the model, so its last judgement is about fewer words;
        ``hearing``: the ASR is asked for every word up to the pause, and
        until it answers (``heard``) nothing is judged."""
        self.paused_at = started_at
        self.hearing, self.words = hearing, None
        if words_pending:
            self.p = None

    def heard(self, text: str) -> None:
        """The ASR's words up to the pause: only a ``P(end)`` of exactly these
        counts from now on (one of fewer words, still on its way, does not)."""
        self.hearing = False
        self.words, self.heard_text = spoken_words(text), text
        if spoken_words(self.text) != self.words:
            self.p = None

    def speech(self) -> None:
        self.paused_at = None
        self.hearing, self.words, self.heard_text = False, None, ""

    def observe(self, p: float, text: str) -> None:
        if self.words is not None and spoken_words(text) != self.words:
            return  # about other words than those heard up to the pause
        self.p, self.text = p, text

    def deadline(self, eagerness: str) -> float:
        assert self.paused_at is not None
        return self.paused_at + needed_silence_ms(self.judged, eagerness) / 1000.0

    def decide(self, now: float, eagerness: str) -> TurnEndDecision:
        assert self.paused_at is not None
        silence = round((now - self.paused_at) * 1000)
        p = self.judged
        decision = TurnEndDecision(p, self.text if p is not None else "", silence,
                                   needed_silence_ms(p, eagerness), eagerness)
        # The next turn is judged on its own words only.
        self.paused_at, self.p, self.text = None, None, ""
        self.hearing, self.words, self.heard_text = False, None, ""
        return decision


class Pause:
    """What the session holds while a pause lasts: under ``semantic_vad`` the
    VAD's end of speech while the pause is judged; under ``server_vad`` only
    the words heard up to it (the VAD ends the turn itself)."""

    def __init__(self) -> None:
        self.decider = TurnEndDecider()
        self.open = False  # a pause is being heard (either mode)
        self.held: StageOutput | None = None  # semantic_vad: the VAD's end of speech
        self.deadline = 0.0  # of the armed timer; one that fires before it is stale
        self.last: TurnEndDecision | None = None  # the last turn's decision

    @property
    def pausing(self) -> bool:
        """semantic_vad: the user has stopped speaking and the pause is being judged."""
        return self.held is not None

    def close(self) -> None:
        """The pause is over (the user went on, or the turn ended)."""
        self.open, self.held = False, None

    def due(self, now: float) -> bool:
        """A fired timer is this pause's (not dropped since, nor re-armed later)."""
        return self.held is not None and now >= self.deadline - 1e-6


def log_decision(session_id: str, decision: TurnEndDecision) -> None:
    log.info("session %s: turn end (%s) after %d ms of silence (needed %d ms, eagerness %s); "
             "P(end)=%s for %r", session_id, decision.reason, decision.silence_ms,
             decision.needed_ms, decision.eagerness,
             "unknown" if decision.p is None else f"{decision.p:.4f}", decision.text)
