"""Adaptive interruptions: speech over the reply pauses it, then the words
(or how long the speech lasts) decide.

- ``pause``: speech onset over the reply: its paced sending stops, and a
  ``barge_in`` timer is armed at ``min_speech_ms`` plus the VAD's silence
  window: no ``speech_stopped`` by then means more than ``min_speech_ms`` of
  speech, a real interruption (``interrupts``).
- ``resume``: the speech was a backchannel or noise: the reply goes on from
  where it was heard up to (the session then tells the client,
  ``duplex.output_audio.resumed``).

Pure: functions of the reply (``Reply``) and the settings, that return the
timer effects to carry out; whether the reply is paused is the turn's phase
(``phase.py``: ``BARGE_PAUSED``), which the session core moves.
"""

from __future__ import annotations

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.pacing import PACING
from vllm_duplex.session.reply import Reply

BARGE_IN = "barge_in"  # the timer that turns long speech into an interruption


def pause(reply: Reply, config: SessionConfig, now: float) -> list[ArmTimer | CancelTimer]:
    """Stop sending the reply; arm the timer at which speech still going is
    an interruption."""
    effects: list[ArmTimer | CancelTimer] = []
    if reply.pacer is not None:
        reply.pacer.pause(now)
        effects.append(CancelTimer(PACING))
    # The VAD reports the end of speech only after its silence window, so
    # "still speaking at min_speech_ms" is known that much later: a short
    # backchannel followed by silence must not count as long speech.
    td = config.turn_detection
    tail_ms = td.silence_duration_ms if td is not None else 0
    wait_s = (config.interruption.min_speech_ms + tail_ms) / 1000.0
    effects.append(ArmTimer(BARGE_IN, now + wait_s))
    return effects


def resume(reply: Reply, now: float, reason: str, transcript: str) -> ev.ServerEvent:
    """The reply goes on from where it was heard: the client is told where
    (``duplex.output_audio.resumed``) and why (the words that were not a turn)."""
    assert reply.record is not None
    start = reply.pacer.resume(now) if reply.pacer is not None else reply.record.part.audio_ms
    return ev.OutputAudioResumed(response_id=reply.id, item_id=reply.record.item.id,
                                 audio_start_ms=start, reason=reason, transcript=transcript)


def interrupts(*, user_speaking: bool, pause_judged: bool) -> bool:
    """At the ``barge_in`` timer, while the reply is paused: speech longer
    than ``min_speech_ms`` is an interruption, words or not (a pause
    semantic_vad is judging is silence, though no ``speech_stopped`` went
    out yet)."""
    return user_speaking and not pause_judged
