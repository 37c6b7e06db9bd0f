"""A pause, as the session core lives it: judged, answered ahead, committed
or resumed (the ``turn_end`` step of the output chain, ``decisions.py``).

Under ``semantic_vad`` the VAD reports every pause; the session holds its end
of speech (``Pause``) while ``turn_end.py``'s judge weighs the silence
against ``P(end)`` of the words up to the pause, and arms the ``turn_end``
timer at its deadline. Meanwhile the reply may start, held
(``speculation.py``): ``speculate`` asks for it, ``release_speculation`` makes
it the response at the commit, and a discard voids it (one epoch
bump, ``SessionCore.discard_speculation``) when the user goes on or the words
change. Functions of the core: they compose its parts and only add effects.
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
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.session.effects import ArmTimer, CancelTimer, Submit
from vllm_duplex.session.replies import reply_context, reply_request, reply_tools
from vllm_duplex.session.speculation import SPECULATE_P, Held
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
        if pause.pausing:
            _speculate(core)
            _rearm(core)
        return True
    if kind is TranscriptPartial and p.at_pause and pause.pausing and pause.decider.hearing:
        # Every word up to the pause: the policy takes them (pushes them to
        # be judged), and the pause is judged from here on.
        pause.decider.heard(p.text)
        core.decide(out)
        _speculate(core)
        _rearm(core)
        return True
    td = core.config.turn_detection
    if td is None or not td.semantic:
        if pause.pausing:  # the setting changed mid-pause
            _resume(core)
        return False
    if kind is VadSpeechStopped:
        _paused(core, out)
        return True
    if kind is VadSpeechStarted and pause.pausing:
        # The user went on: the pause was not the end of the turn.
        _resume(core)
        core.metrics.turn_end_resumed.inc(eagerness=td.eagerness)
        return True
    if kind is VadSpeechStarted:
        # A new turn: a speculation nothing claimed (e.g. the last turn's
        # words were noise) is void.
        core.discard_speculation()
    return False



def due(core: SessionCore) -> None:
    """The ``turn_end`` timer fired."""
    if core.pause.due(core.now):
        _commit(core)


def _observe(core: SessionCore, observation: object) -> OutputDecision:
    """Hand the policy a pause observation as the VAD's output, and carry out
    what it decides."""
    fence = core.fence
    return core.decide(StageOutput(fence, fence.request_id("vad"), "vad", observation))


def _paused(core: SessionCore, out: StageOutput) -> None:
    pause = core.pause
    if pause.held is None:
        pause.held = out
    decision = _observe(core, UserPaused(out.payload.audio_ms))
    asked = decision.plan.submissions if decision.plan is not None else ()
    # The policy may push the words it held back, and ask its ASR to hear
    # the pause out (UserPaused sent on): then the ASR's answer is judged.
    hearing = any(type(s.payload) is UserPaused for s in asked)
    pushed = any(type(s.payload) is not UserPaused for s in asked)
    pause.decider.pause(core.now - PAUSE_DETECT_MS / 1000.0, words_pending=pushed,
                        hearing=hearing)
    _speculate(core)
    _rearm(core)


def _speculate(core: SessionCore) -> None:
    """The words look complete: start the reply now, held until the commit."""
    d = core.pause.decider
    if d.judged is not None and d.judged >= SPECULATE_P:
        speculate(core, d.text)


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
    pause.held = None
    pause.decider.speech()
    core.effect(CancelTimer(TIMER))
    discarded = core.discard_speculation()
    _observe(core, UserResumed(speculation_discarded=discarded))


def _commit(core: SessionCore) -> None:
    pause = core.pause
    held, pause.held = pause.held, None
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
    core.decide(held)  # speech_stopped, the commit: as server VAD does
    release_speculation(core)  # the reply started at the pause goes out now


# ---- the reply started at the pause ----------------------------------------------


def _answering(core: SessionCore, words: str) -> tuple[ContextMessage, ...]:
    """The context of a reply to ``words`` after the conversation so far."""
    return reply_context(core.policy, core, core.conversation.snapshot(),
                         core.config.instructions, (ContextMessage("user", words),))


def speculate(core: SessionCore, words: str) -> None:
    """Answer ``words`` (the user's turn so far) ahead of the commit, held."""
    td = core.config.turn_detection
    if (core.speculation.held is not None or core.response is not None or not words.strip()
            or td is None or not td.create_response or core.generator not in core.stage_names):
        return
    options = cmd.ResponseOptions()
    context = _answering(core, words)
    fence = core.fence
    held = Held(core.make_id("resp"), fence.request_id("llm"), words, context)
    request = reply_request(core.policy, core, held.response_id, context, options,
                            reply_tools(core.config, options))
    core.speculation.held = held
    core.metrics.speculations.inc(outcome="started")
    core.effect(Submit(core.generator, fence, "llm", request))


def release_speculation(core: SessionCore) -> None:
    """The turn was committed: the speculation becomes the reply now (its
    held output goes out at once) -- unless the conversation changed under
    it, then it is discarded and the reply waits for the transcript. The
    final transcript still checks it (the policy cancels a reply to words
    the final revised)."""
    held = core.speculation.held
    if held is None or core.response is not None:
        return
    if _answering(core, held.words) != held.context:
        core.discard_speculation()
        return
    held.committed = True
    core.create_response(cmd.ResponseOptions())
