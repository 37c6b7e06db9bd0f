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
and decisions out); ``SemanticTurn`` is the session core's side of it: it
holds the VAD's end of speech while the pause lasts, tells the policy
(``UserPaused``), which pushes the words it held back (so the model judges
them while the ASR works) and may ask its ASR for every word up to the
pause -- then only a ``P(end)`` of exactly the ASR's answer
(``TranscriptPartial(at_pause=True)``) is judged: a hypothesis that missed
the last word ("what is the capital of your st...") must not end the turn,
nor start the reply. It arms the core's ``turn_end`` timer at the decider's
deadline (the cap until the words are judged; re-armed when a new
``P(end)`` arrives) and, when it fires, lets the held end of speech through:
the turn commits exactly as under server VAD. Speech before the deadline
drops the hold: the pause did not take the turn, and the client never heard
of it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_duplex.core.contracts import OutputDecision
from vllm_duplex.core.payloads import (
    StageOutput,
    TranscriptPartial,
    TurnEndProbability,
    UserPaused,
    UserResumed,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.session import rendering
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.speculation import SPECULATE_P, spoken_words

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore

log = logging.getLogger(__name__)

TIMER = "turn_end"

# The VAD's silence before it reports a pause under semantic_vad (it reports
# every pause this long; the decider says which ones end the turn).
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
        self.words = spoken_words(text)
        if spoken_words(self.text) != self.words:
            self.p = None

    def speech(self) -> None:
        self.paused_at = None
        self.hearing, self.words = False, None

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
        self.hearing, self.words = False, None
        return decision


class SemanticTurn:
    """The session core's side of ``semantic_vad`` (see the module doc)."""

    def __init__(self) -> None:
        self.decider = TurnEndDecider()
        self.held: StageOutput | None = None  # the VAD's end of speech, while the pause lasts
        self.deadline = 0.0  # of the armed timer; one that fires before it is stale
        self.last: TurnEndDecision | None = None

    @property
    def pausing(self) -> bool:
        """The user has stopped speaking and the pause is being judged."""
        return self.held is not None

    def intercept(self, core: SessionCore, out: StageOutput) -> bool:
        """Take ``out`` when it is semantic_vad's business; True: consumed."""
        p = out.payload
        kind = type(p)
        if kind is TurnEndProbability:
            self.decider.observe(p.p, p.text)
            if self.held is not None:
                self._speculate(core)
                self._rearm(core)
            return True
        if kind is TranscriptPartial and p.at_pause and self.held is not None and self.decider.hearing:
            # Every word up to the pause: the policy takes them (pushes them
            # to be judged), and the pause is judged from here on.
            self.decider.heard(p.text)
            core.decide(out)
            self._speculate(core)
            self._rearm(core)
            return True
        td = core.config.turn_detection
        if td is None or not td.semantic:
            if self.held is not None:  # the setting changed mid-pause
                self._drop(core)
            return False
        if kind is VadSpeechStopped:
            self._pause(core, out)
            return True
        if kind is VadSpeechStarted and self.held is not None:
            # The user went on: the pause was not the end of the turn.
            self._drop(core)
            core.metrics.turn_end_resumed.inc(eagerness=td.eagerness)
            return True
        if kind is VadSpeechStarted:
            # A new turn: a speculation nothing claimed (e.g. the last turn's
            # words were noise) is void.
            core.speculation.discard(core)
        return False

    def fired(self, core: SessionCore) -> None:
        if self.held is None or core.now < self.deadline - 1e-6:
            return  # dropped since, or re-armed later (that timer fires then)
        self._commit(core)

    # ---- inside ---------------------------------------------------------------

    def _pause(self, core: SessionCore, out: StageOutput) -> None:
        if self.held is None:
            self.held = out
        decision = self._tell(core, UserPaused(out.payload.audio_ms))
        asked = decision.plan.submissions if decision.plan is not None else ()
        # The policy may push the words it held back, and ask its ASR to hear
        # the pause out (UserPaused sent on): then the ASR's answer is judged.
        hearing = any(type(s.payload) is UserPaused for s in asked)
        pushed = any(type(s.payload) is not UserPaused for s in asked)
        self.decider.pause(core.now - PAUSE_DETECT_MS / 1000.0, words_pending=pushed,
                           hearing=hearing)
        self._speculate(core)
        self._rearm(core)

    def _speculate(self, core: SessionCore) -> None:
        """The words look complete: start the reply now, held until the commit."""
        d = self.decider
        if d.judged is not None and d.judged >= SPECULATE_P:
            core.speculation.start(core, d.text)

    def _rearm(self, core: SessionCore) -> None:
        td = core.config.turn_detection
        assert td is not None
        at = self.decider.deadline(td.eagerness)
        self.deadline = at
        if at <= core.now:
            self._commit(core)
            return
        core.effect(ArmTimer(TIMER, at))

    def _drop(self, core: SessionCore) -> None:
        self.held = None
        self.decider.speech()
        core.effect(CancelTimer(TIMER))
        discarded = core.speculation.discard(core)
        self._tell(core, UserResumed(speculation_discarded=discarded))

    def _tell(self, core: SessionCore, observation: object) -> OutputDecision:
        """Hand the policy a pause observation; carry out what it decides."""
        out = StageOutput(core.fence, core.fence.request_id("vad"), "vad", observation)
        decision = core.policy.decide_output(core, out)
        if decision.emit and decision.render is not None:  # e.g. the last word's transcript delta
            rendering.render(core, decision.render)
        if decision.plan is not None:
            core.execute(decision.plan)
        return decision

    def _commit(self, core: SessionCore) -> None:
        held, self.held = self.held, None
        assert held is not None
        td = core.config.turn_detection
        assert td is not None
        decision = self.decider.decide(core.now, td.eagerness)
        self.last = decision
        m = core.metrics
        m.turn_end_decisions.inc(eagerness=td.eagerness, reason=decision.reason)
        m.turn_end_silence.observe(decision.silence_ms / 1000.0)
        if decision.p is not None:
            m.turn_end_probability.observe(decision.p)
        log.info("session %s: turn end (%s) after %d ms of silence (needed %d ms, eagerness %s); "
                 "P(end)=%s for %r", core.session_id, decision.reason, decision.silence_ms,
                 decision.needed_ms, td.eagerness,
                 "unknown" if decision.p is None else f"{decision.p:.4f}", decision.text)
        core.decide(held)  # speech_stopped, the commit: as server VAD does
        if core.speculation.held is not None:
            core.speculation.release(core)  # the reply started at the pause goes out now
