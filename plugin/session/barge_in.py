"""Adaptive interruptions: speech over the reply pauses it, then the words
(or how long the speech lasts) decide.

- ``pause``: speech onset over the reply: its paced sending stops, and a
  ``barge_in`` timer is armed at ``min_speech_ms`` plus the VAD's silence
  window: no ``speech_stopped`` by then means more than ``min_speech_ms`` of
  speech, a real interruption (``interrupts``).
- ``resume``: the speech was a backchannel or noise: the reply goes on from
  where it was heard up to (the session then tells the client,
  ``duplex.output_audio.resumed``).

Pure: functions of the reply (``ActiveResponse``) and the settings, that
return the timer effects to carry out; the session core composes them.
"""

from __future__ import annotations

from vllm_duplex.core.session_config import SessionConfig
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.pacing import PACING
from vllm_duplex.session.responses import ActiveResponse

BARGE_IN = "barge_in"  # the timer that turns long speech into an interruption


def pause(active: ActiveResponse, config: SessionConfig, now: float) -> list[ArmTimer | CancelTimer]:
    """Stop sending the reply (idempotent)."""
    if active.barge_pending:
        return []
    active.barge_pending = True
    effects: list[ArmTimer | CancelTimer] = []
    if active.pacer is not None:
        active.pacer.pause(now)
        effects.append(CancelTimer(PACING))
    # The VAD reports the end of speech only after its silence window, so
    # "still speaking at min_speech_ms" is known that much later: a short
    # backchannel followed by silence must not count as long speech.
    td = config.turn_detection
    tail_ms = td.silence_duration_ms if td is not None else 0
    wait_s = (config.interruption.min_speech_ms + tail_ms) / 1000.0
    effects.append(ArmTimer(BARGE_IN, now + wait_s))
    return effects


def resume(active: ActiveResponse, now: float) -> int:
    """The reply goes on; returns the item position its audio resumes from."""
    active.barge_pending = False
    return active.pacer.resume(now) if active.pacer is not None else active.part.audio_ms


def interrupts(active: ActiveResponse, *, user_speaking: bool, pause_judged: bool) -> bool:
    """At the ``barge_in`` timer: speech longer than ``min_speech_ms`` is an
    interruption, words or not (a pause semantic_vad is judging is silence,
    though no ``speech_stopped`` went out yet)."""
    return active.barge_pending and user_speaking and not pause_judged


def stop_timers(active: ActiveResponse) -> list[CancelTimer]:
    """The reply ended early: the timers it may have armed."""
    stop = []
    if active.pacer is not None and not active.pacer.drained:
        stop.append(CancelTimer(PACING))
    if active.barge_pending:
        stop.append(CancelTimer(BARGE_IN))
    return stop
