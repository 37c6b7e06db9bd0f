"""The reply's way out, as the session core composes it: what an output
shows the client, paced audio going out at playback speed, and speech over
the reply pausing it until the words (or its length) decide (adaptive
interruptions).

Functions of the core; the parts they compose are pure: ``rendering.py``
(payload -> events), ``pacing.py`` (which frames are due, the next timer) and
``barge_in.py`` (pause, resume, the ``barge_in`` timer's verdict).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_duplex.core import events as ev
from vllm_duplex.core.contracts import InterruptReason
from vllm_duplex.core.payloads import AudioOut, StageFailed
from vllm_duplex.session import barge_in, pacing, rendering
from vllm_duplex.session.effects import CancelTimer
from vllm_duplex.session.phase import Phase

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore


def show(core: SessionCore, payload: Any) -> None:
    """Show the client ``payload``: reply audio through the pacer (or at
    once, unpaced), a stage failure as an error that fails the reply,
    anything else as its events."""
    if type(payload) is StageFailed:
        core.fail(payload.error)
        return
    shown = core.shown
    if type(payload) is AudioOut and shown is not None and shown.pacer is not None:
        if shown.id == payload.response_id:
            shown.pacer.push(payload)
            send_due(core)
        return
    core.emit_all(rendering.render(payload, scope(core)))


def scope(core: SessionCore) -> rendering.Scope:
    return rendering.Scope(core.now, core.user, core.conversation, core.latency, core.shown)


def send_due(core: SessionCore) -> None:
    """Send the paced frames due now (also the ``pacing`` timer's work); arm
    the timer for the next, or finish the reply once all of it went out."""
    shown = core.shown
    if shown is None or shown.pacer is None:
        return
    frames, timer = pacing.due_frames(shown.pacer, core.now)
    for frame in frames:
        if not frame.events:  # first time: render it (resent as it was on resume)
            frame.events = rendering.audio_going_out(scope(core), shown, frame.audio)
        core.emit_all(frame.events)
    if shown.pacer.drained:
        if shown.complete and core.phase.value is Phase.RESPONDING:
            core.finish_response()
    elif timer is not None:
        core.effect(timer)


def pause(core: SessionCore) -> None:
    """Speech over the reply: stop sending it while the words are awaited."""
    shown = core.shown
    if shown is not None and core.phase.value is Phase.RESPONDING:
        core.phase.to(Phase.BARGE_PAUSED)
        for effect in barge_in.pause(shown, core.config, core.now):
            core.effect(effect)


def dismiss(core: SessionCore, reason: str, transcript: str) -> None:
    """The speech over the reply was not a turn: forget it, resume the reply."""
    core.input.clear()
    core.user.dismiss()
    core.effect(CancelTimer(barge_in.BARGE_IN))
    shown = core.shown
    if shown is None or core.phase.value is not Phase.BARGE_PAUSED:
        return
    core.metrics.barge_ins.inc(outcome="dismissed")
    core.phase.to(Phase.RESPONDING)
    start = barge_in.resume(shown, core.now)
    assert shown.record is not None
    core.emit(ev.OutputAudioResumed(response_id=shown.id, item_id=shown.record.item.id,
                                    audio_start_ms=start, reason=reason, transcript=transcript))
    if shown.pacer is None and shown.complete:
        core.finish_response()
    send_due(core)


def barge_in_due(core: SessionCore) -> None:
    """The ``barge_in`` timer: speech still going is an interruption."""
    if core.phase.value is Phase.BARGE_PAUSED and barge_in.interrupts(
            user_speaking=core.user.speaking, pause_judged=core.pause.pausing):
        core.interrupt(InterruptReason.TURN_DETECTED)
