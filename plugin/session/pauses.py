"""A pause, as the session core lives it: heard, judged, answered ahead,
committed or resumed (the ``turn_end`` step of the output chain,
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

In both, the reply starts in the pause (``speculate``), *held* (a ``Reply``
not yet shown, ``Floor.speculate``; the rule: ``speculation.py``): its text
goes to the TTS, its audio waits. It becomes the response only when the
final transcript confirms the words it answers (the policy asks for the
reply then, and ``Floor.respond`` claims the held one), so no reply the
client sees is ever cancelled because the words changed; speech before
that, or other words, discard it (one epoch bump, ``Floor.discard``).
Functions of the core: they compose its parts and only add effects; the
phase (``paused`` while the end of speech is held) is the floor's, moved by
``Floor.rest`` as the pause opens and closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_duplex.core import commands as cmd
from vllm_duplex.core.contracts import OutputDecision
from vllm_duplex.core.payloads import (
    ContextMessage,
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
from vllm_duplex.session import decisions
from vllm_duplex.session.effects import ArmTimer, CancelTimer, Submit
from vllm_duplex.session.replies import reply_context, reply_request, reply_tools
from vllm_duplex.session.reply import Reply
from vllm_duplex.session.speculation import SPECULATE_P
from vllm_duplex.session.turn_end import PAUSE_DETECT_MS, TIMER, log_decision

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore


def take(core: SessionCore, out: StageOutput) -> bool:
    """The chain's ``turn_end`` step: True when ``out`` was the pause's business."""
    p = out.payload
    kind = type(p)
    pause = core.pause
    if kind is TurnEndProbability:
        pause.decider.observe(p.p, p.text)
        if pause.open and pause.decider.judged is not None:
            core.latency.step("p_end", core.now)
            _speculate(core)
        if pause.pausing:
            _rearm(core)
        return True
    if kind is TranscriptPartial and p.at_pause and pause.open and pause.decider.hearing:
        # Every word up to the pause: the policy takes them (pushes them to
        # be judged), and the pause is judged from here on.
        pause.decider.heard(p.text)
        core.latency.step("asr_pause", core.now)
        decisions.decide(core, out)
        _speculate(core)
        if pause.pausing:
            _rearm(core)
        return True
    td = core.config.turn_detection
    if td is None:
        if pause.open:  # the setting changed mid-pause
            _resume(core)
        return kind is VadPaused or kind is VadResumed
    if td.semantic:
        if kind is VadSpeechStopped:
            _paused(core, out, hold=True)
            return True
        if kind is VadSpeechStarted and pause.pausing:
            # The user went on: the pause was not the end of the turn.
            _resume(core)
            core.metrics.turn_end_resumed.inc(eagerness=td.eagerness)
            return True
        if kind is VadPaused or kind is VadResumed:
            return True  # of a server_vad setting that changed since
    else:
        if pause.pausing:  # the setting changed mid-pause
            _resume(core)
        if kind is VadPaused:
            _paused(core, out, hold=False)
            return True
        if kind is VadResumed:
            if pause.open:
                _resume(core)
            return True
        if kind is VadSpeechStopped:
            # The VAD ended the turn: the reply prepared in the pause waits
            # for the final transcript to confirm its words.
            pause.close()
            pause.decider.speech()
            return False
    if kind is VadSpeechStarted:
        # A new turn: a speculation nothing claimed (e.g. the last turn's
        # words were noise) is void.
        core.floor.discard()
    return False


def due(core: SessionCore) -> None:
    """The ``turn_end`` timer fired."""
    if core.pause.due(core.now):
        _commit(core)


def _observe(core: SessionCore, observation: object) -> OutputDecision:
    """Hand the policy a pause observation as the VAD's output, and carry out
    what it decides."""
    fence = core.fence
    return decisions.decide(core, StageOutput(fence, fence.request_id("vad"), "vad", observation))


def _paused(core: SessionCore, out: StageOutput, *, hold: bool) -> None:
    """The VAD heard a pause (``hold``: semantic_vad's end of speech, held
    while the pause is judged)."""
    pause = core.pause
    pause.open = True
    if hold and pause.held is None:
        pause.held = out
        core.floor.rest()
    core.latency.paused(out.payload.audio_ms, core.now)
    decision = _observe(core, UserPaused(out.payload.audio_ms))
    asked = decision.plan.submissions if decision.plan is not None else ()
    # The policy may push the words it held back, and ask its ASR to hear
    # the pause out (UserPaused sent on): then the ASR's answer is judged.
    hearing = any(type(s.payload) is UserPaused for s in asked)
    pushed = any(type(s.payload) is not UserPaused for s in asked)
    pause.decider.pause(core.now - PAUSE_DETECT_MS / 1000.0, words_pending=pushed,
                        hearing=hearing)
    _speculate(core)
    if hold:
        _rearm(core)


def _speculate(core: SessionCore) -> None:
    """Start the reply now, held until the final transcript confirms its
    words: under semantic_vad once the words up to the pause look complete
    (``P(end) >= SPECULATE_P``), under server_vad once they are heard (its
    silence ends the turn whatever they say)."""
    d = core.pause.decider
    td = core.config.turn_detection
    if td is not None and td.semantic:
        if d.judged is not None and d.judged >= SPECULATE_P:
            speculate(core, d.text)
    elif d.words:
        speculate(core, d.heard_text)


def _rearm(core: SessionCore) -> None:
    td = core.config.turn_detection
    assert td is not None
    pause = core.pause
    at = pause.decider.deadline(td.eagerness)
    pause.deadline = at
    if at <= core.now:
        _commit(core)
        return
    core.effect(ArmTimer(TIMER, at))


def _resume(core: SessionCore) -> None:
    """Speech again: the pause did not end the turn."""
    pause = core.pause
    pause.close()
    core.floor.rest()
    pause.decider.speech()
    core.latency.pause_resumed()
    core.effect(CancelTimer(TIMER))
    discarded = core.floor.discard()
    _observe(core, UserResumed(speculation_discarded=discarded))


def _commit(core: SessionCore) -> None:
    pause = core.pause
    held = pause.held
    pause.close()
    core.floor.rest()
    assert held is not None
    td = core.config.turn_detection
    assert td is not None
    decision = pause.decider.decide(core.now, td.eagerness)
    pause.last = decision
    m = core.metrics
    m.turn_end_decisions.inc(eagerness=td.eagerness, reason=decision.reason)
    m.turn_end_silence.observe(decision.silence_ms / 1000.0)
    if decision.p is not None:
        m.turn_end_probability.observe(decision.p)
    log_decision(core.session_id, decision)
    decisions.decide(core, held)  # speech_stopped, the commit: as server VAD does


# ---- the reply started at the pause ----------------------------------------------


def _answering(core: SessionCore, words: str) -> tuple[ContextMessage, ...]:
    """The context of a reply to ``words`` after the conversation so far."""
    return reply_context(core.policy, core, core.conversation.snapshot(),
                         core.config.instructions, (ContextMessage("user", words),))


def speculate(core: SessionCore, words: str) -> None:
    """Answer ``words`` (the user's turn so far) ahead of the commit, held."""
    td = core.config.turn_detection
    if (core.floor.reply is not None or not words.strip()
            or not core.config.responds or td is None or not td.create_response
            or core.generator not in core.stage_names):
        return
    options = cmd.ResponseOptions()
    context = _answering(core, words)
    fence = core.fence
    reply = Reply(core.make_id("resp"), fence.request_id("llm"), answers=words, context=context)
    request = reply_request(core.policy, core, reply.id, context, options,
                            reply_tools(core.config, options))
    core.floor.speculate(reply)
    core.latency.reply_started(reply.id, core.now)
    core.effect(Submit(core.generator, fence, "llm", request))
