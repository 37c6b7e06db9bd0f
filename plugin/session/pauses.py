"""``Pauses``: a pause, as the session lives it -- heard, judged, answered
ahead, committed or resumed (the ``turn_end`` step of the output chain,
``decisions.py``).

The VAD reports a pause ~100 ms into the silence after speech. The policy is
told (``UserPaused``): it pushes the words it held back as still being heard
and asks its ASR for every word up to the pause; the LLM's ``P(end)`` of
those words follows. Then:

* under ``semantic_vad`` the session holds the VAD's end of speech
  (``Pause``) while ``turn_end.py``'s judge weighs the silence against
  ``P(end)``, and arms the ``turn_end`` timer at its deadline; when it fires,
  the held end of speech commits the turn as server VAD would;
* under ``server_vad`` the VAD ends the turn itself, after its silence.

In both, the reply starts in the pause (``Speculate``), *held* (a ``Reply``
not yet shown, ``Floor.speculate``; the rule: ``speculation.py``): its text
goes to the TTS, its audio waits. It becomes the response only when the
final transcript confirms the words it answers (the policy asks for the
reply then, and ``Floor.respond`` claims the held one), so no reply the
client sees is ever cancelled because the words changed; speech before
that, or other words, discard it (one epoch bump, ``Floor.discard``).

The pause's state is its own; what only the core may do (ask the policy,
start or discard the held reply, move the phase with the pause: ``Rest``)
comes back as asks (``asks.py``), in order, with the timer effects.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_duplex.domain.contracts import AppendPlan, PolicyStep
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import (
    StageOutput,
    TranscriptPartial,
    TurnEndProbability,
    UserPaused,
    UserResumed,
    VadPaused,
    VadResumed,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.domain.session_config import SessionConfig, TurnDetection
from vllm_duplex.session.asks import Decide, Discard, Observe, Rest, Speculate, Steps
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.speculation import SPECULATE_P
from vllm_duplex.session.turn_end import PAUSE_DETECT_MS, TIMER, Pause, log_decision


class Pauses:
    def __init__(self, *, latency: TurnLatency, metrics: Metrics, session_id: str) -> None:
        self.pause = Pause()  # the pause being heard or judged
        self._latency = latency
        self._metrics = metrics
        self._session_id = session_id

    def take(self, out: StageOutput, config: SessionConfig, now: float) -> Steps | None:
        """The chain's ``turn_end`` step: what ``out`` asks for when it is the
        pause's business; None when it is not."""
        p = out.payload
        kind = type(p)
        pause = self.pause
        td = config.turn_detection
        if kind is TurnEndProbability:
            pause.decider.observe(p.p, p.text)
            steps: Steps = []
            if pause.open and pause.decider.judged is not None:
                self._latency.step("p_end", now)
                steps += self._speculate(td)
            return steps + self._rearm(td, now) if pause.pausing else steps
        if kind is TranscriptPartial and p.at_pause and pause.open and pause.decider.hearing:
            # Every word up to the pause: the policy takes them (pushes them to
            # be judged), and the pause is judged from here on.
            pause.decider.heard(p.text)
            self._latency.step("asr_pause", now)
            steps = [Decide(out), *self._speculate(td)]
            return steps + self._rearm(td, now) if pause.pausing else steps
        if td is None:
            if kind is VadPaused or kind is VadResumed:
                return self._resume() if pause.open else []
            return self._resume() + [Decide(out)] if pause.open else None
        if td.semantic:
            return self._semantic(out, td, now)
        return self._server_vad(out, td, now)

    def _semantic(self, out: StageOutput, td: TurnDetection, now: float) -> Steps | None:
        kind = type(out.payload)
        if kind is VadSpeechStopped:
            return self._paused(out, td, now, hold=True)
        if kind is VadSpeechStarted and self.pause.pausing:
            # The user went on: the pause was not the end of the turn.
            self._metrics.turn_end_resumed.inc(eagerness=td.eagerness)
            return self._resume()
        if kind is VadPaused or kind is VadResumed:
            return []  # of a server_vad setting that changed since
        if kind is VadSpeechStarted:
            return self._new_turn(out)
        return None

    def _server_vad(self, out: StageOutput, td: TurnDetection, now: float) -> Steps | None:
        kind = type(out.payload)
        pause = self.pause
        steps = self._resume() if pause.pausing else []  # the setting changed mid-pause
        if kind is VadPaused:
            return steps + self._paused(out, td, now, hold=False)
        if kind is VadResumed:
            return steps + (self._resume() if pause.open else [])
        if kind is VadSpeechStopped:
            # The VAD ended the turn: the reply prepared in the pause waits
            # for the final transcript to confirm its words.
            pause.close()
            pause.decider.speech()
            return [*steps, Decide(out)]
        if kind is VadSpeechStarted:
            return steps + self._new_turn(out)
        return steps + [Decide(out)] if steps else None

    @staticmethod
    def _new_turn(out: StageOutput) -> Steps:
        # A new turn: a speculation nothing claimed (e.g. the last turn's
        # words were noise) is void; then the policy hears the onset.
        return [Discard(), Decide(out)]

    def due(self, config: SessionConfig, now: float) -> Steps:
        """The ``turn_end`` timer fired."""
        if not self.pause.due(now):
            return []
        return self._commit(config.turn_detection, now)

    # ---- the pause's moves ---------------------------------------------------------

    def _paused(self, out: StageOutput, td: TurnDetection, now: float, *,
                hold: bool) -> Steps:
        """The VAD heard a pause (``hold``: semantic_vad's end of speech, held
        while the pause is judged)."""
        pause = self.pause
        pause.open = True
        steps: Steps = []
        if hold and pause.held is None:
            pause.held = out
            steps.append(Rest())
        self._latency.paused(out.payload.audio_ms, now)

        def observed(decided: Sequence[PolicyStep]) -> Steps:
            # The policy may push the words it held back, and ask its ASR to
            # hear the pause out (UserPaused sent on): then the ASR's answer
            # is judged.
            asked = [sub for step in decided if type(step) is AppendPlan
                     for sub in step.submissions]
            hearing = any(type(s.payload) is UserPaused for s in asked)
            pushed = any(type(s.payload) is not UserPaused for s in asked)
            pause.decider.pause(now - PAUSE_DETECT_MS / 1000.0, words_pending=pushed,
                                hearing=hearing)
            more = self._speculate(td)
            if hold:
                more += self._rearm(td, now)
            return more

        steps.append(Observe(UserPaused(out.payload.audio_ms), then=observed))
        return steps

    def _speculate(self, td: TurnDetection | None) -> Steps:
        """Start the reply now, held until the final transcript confirms its
        words: under semantic_vad once the words up to the pause look complete
        (``P(end) >= SPECULATE_P``), under server_vad once they are heard (its
        silence ends the turn whatever they say)."""
        d = self.pause.decider
        if td is not None and td.semantic:
            if d.judged is not None and d.judged >= SPECULATE_P:
                return [Speculate(d.text)]
        elif d.words:
            return [Speculate(d.heard_text)]
        return []

    def _rearm(self, td: TurnDetection | None, now: float) -> Steps:
        assert td is not None  # a pause is judged only under semantic_vad
        pause = self.pause
        at = pause.decider.deadline(td.eagerness)
        pause.deadline = at
        if at <= now:
            return self._commit(td, now)
        return [ArmTimer(TIMER, at)]

    def _resume(self) -> Steps:
        """Speech again: the pause did not end the turn."""
        pause = self.pause
        pause.close()
        pause.decider.speech()
        self._latency.pause_resumed()
        return [Rest(), CancelTimer(TIMER),
                Discard(then=lambda discarded: [
                    Observe(UserResumed(speculation_discarded=discarded))])]

    def _commit(self, td: TurnDetection | None, now: float) -> Steps:
        assert td is not None
        pause = self.pause
        held = pause.held
        pause.close()
        assert held is not None
        decision = pause.decider.decide(now, td.eagerness)
        pause.last = decision
        m = self._metrics
        m.turn_end_decisions.inc(eagerness=td.eagerness, reason=decision.reason)
        m.turn_end_silence.observe(decision.silence_ms / 1000.0)
        if decision.p is not None:
            m.turn_end_probability.observe(decision.p)
        log_decision(self._session_id, decision)
        return [Rest(), Decide(held)]  # speech_stopped, the commit: as server VAD does
