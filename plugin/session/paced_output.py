"""The core's side of paced output and adaptive interruptions.

Like ``rendering.py``, functions of the ``SessionCore`` that call them: they
run inside ``handle`` and only add effects.

- ``deliver_audio``: a reply's ``AudioOut`` goes to its ``OutputPacer``
  (``pacing.py``) and out when due; a ``pacing`` timer wakes the core for the
  next frame. Unpaced sessions render it at once, as before.
- ``pause``: speech over the reply (adaptive mode): sending stops, and a
  ``barge_in`` timer is armed at ``min_speech_ms`` plus the VAD's silence
  window: no ``speech_stopped`` by then means more than ``min_speech_ms`` of
  speech, a real interruption.
- ``dismiss``: the speech was a backchannel or noise: its audio is dropped
  (no user turn), and the reply resumes where it was heard up to
  (``duplex.output_audio.resumed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_duplex.core import events as ev
from vllm_duplex.core.contracts import InterruptReason
from vllm_duplex.core.payloads import AudioOut
from vllm_duplex.session import rendering
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.pacing import Frame, OutputPacer

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore
    from vllm_duplex.session.responses import ActiveResponse

PACING, BARGE_IN = "pacing", "barge_in"  # the timers this module arms


def new_pacer(core: SessionCore) -> OutputPacer | None:
    pacing = core.config.pacing
    return OutputPacer(pacing.lead_ms) if pacing.type == "realtime" else None


def deliver_audio(core: SessionCore, audio: AudioOut) -> None:
    active = core.response
    if active is None or active.id != audio.response_id:
        return
    if active.pacer is None:
        rendering.render(core, audio)
        return
    active.pacer.push(audio)
    release(core)


def release(core: SessionCore) -> None:
    """Send the frames due now; arm the timer for the next, or finish the
    reply once all of it went out."""
    active = core.response
    if active is None or active.pacer is None:
        return
    now = core.now
    for frame in active.pacer.due(now):
        _send(core, active, frame)
    if active.pacer.drained:
        if active.finish_pending and not active.barge_pending:
            core.finish_response()
        return
    at = active.pacer.next_at(now)
    if at is not None:
        core.effect(ArmTimer(PACING, at))


def _send(core: SessionCore, active: ActiveResponse, frame: Frame) -> None:
    if not frame.events:  # first time: render it (on_audio counts the item's audio)
        rendering.audio_going_out(core, active, frame.audio)
        frame.events = active.on_audio(frame.audio)
    core.emit_all(frame.events)


def heard_ms(active: ActiveResponse, now: float) -> int | None:
    """What the client has heard of the reply (None: unpaced, the core estimates)."""
    return active.pacer.heard_ms(now) if active.pacer is not None else None


def pause(core: SessionCore) -> None:
    active = core.response
    if active is None or active.barge_pending:
        return
    active.barge_pending = True
    if active.pacer is not None:
        active.pacer.pause(core.now)
        core.effect(CancelTimer(PACING))
    # The VAD reports the end of speech only after its silence window, so
    # "still speaking at min_speech_ms" is known that much later: a short
    # backchannel followed by silence must not count as long speech.
    td = core.config.turn_detection
    tail_ms = td.silence_duration_ms if td is not None else 0
    wait_s = (core.config.interruption.min_speech_ms + tail_ms) / 1000.0
    core.effect(ArmTimer(BARGE_IN, core.now + wait_s))


def dismiss(core: SessionCore, reason: str, transcript: str) -> None:
    """The speech over the reply was not a turn: forget it, resume the reply."""
    core.input.clear()
    core.user.dismiss()
    core.effect(CancelTimer(BARGE_IN))
    active = core.response
    if active is None or not active.barge_pending:
        return
    active.barge_pending = False
    core.metrics.barge_ins.inc(outcome="dismissed")
    start = active.pacer.resume(core.now) if active.pacer is not None else active.part.audio_ms
    core.emit(ev.OutputAudioResumed(response_id=active.id, item_id=active.item.id,
                                    audio_start_ms=start, reason=reason, transcript=transcript))
    if active.pacer is None and active.finish_pending:
        core.finish_response()
    release(core)


def on_timer(core: SessionCore, name: str) -> None:
    active = core.response
    if active is None:
        return  # the reply ended before its timer fired
    if name == PACING:
        release(core)
    elif (name == BARGE_IN and active.barge_pending and core.user.speaking
          and not core.turns.pausing):
        # Speech longer than min_speech_ms: an interruption, words or not.
        # (A pause semantic_vad is judging is silence, though no
        # speech_stopped went out yet.)
        core.interrupt(InterruptReason.TURN_DETECTED)


def stop_timers(core: SessionCore, active: ActiveResponse) -> None:
    """The reply ended early: cancel the timers it may have armed."""
    if active.pacer is not None and not active.pacer.drained:
        core.effect(CancelTimer(PACING))
    if active.barge_pending:
        core.effect(CancelTimer(BARGE_IN))
