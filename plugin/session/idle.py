"""The idle timeout (``turn_detection.idle_timeout_ms``, server_vad): a user
silent that long after the reply's audio has played out is prompted to go on.

As OpenAI Realtime has it: the timeout counts from when the last reply's
audio has finished playing at the client (``response.done`` plus what the
client still had to play); when it passes with no speech detected, the
session emits ``input_audio_buffer.timeout_triggered`` (the silent segment,
``audio_start_ms``..``audio_end_ms`` of the input audio), commits the buffer
as an ``input_audio`` item (``input_audio_buffer.committed``) and makes a
response, in which the model may answer anything it still heard or ask the
user to continue. Speech detected meanwhile (``speech_started``) voids it,
as does any response; the next reply that plays out arms it again. Only
server_vad has it (semantic_vad's turns are the model's judgement; a
transcription session makes no responses).

Pure: functions of the core's ``IdleTimer`` that arm and void it (and return
the timer effects), and ``due``, the prompt when it fires.
"""

from __future__ import annotations

from dataclasses import dataclass
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session.effects import ArmTimer, CancelTimer
from vllm_duplex.session.reply import Reply
from vllm_duplex.session.user_turn import UserTurn

IDLE = "idle_timeout"  # the session's timer
_EPS = 1e-6  # timers fire at float times: "due at t" holds at t


@dataclass
class IdleTimer:
    due_at: float | None = None
    onsets: int = 0  # the user's speech onsets when it was armed: one more voids it


def timeout_ms(config: SessionConfig) -> int | None:
    td = config.turn_detection
    if td is None or td.semantic or not config.responds:
        return None
    return td.idle_timeout_ms


def arm(timer: IdleTimer, config: SessionConfig, reply: Reply, now: float,
        onsets: int) -> list[ArmTimer]:
    """A reply completed: the silence counts from when it has played out
    (``onsets``: the user's speech onsets so far; one more voids it)."""
    ms = timeout_ms(config)
    if ms is None:
        return []
    timer.due_at = reply.played_out_at(now) + ms / 1000.0
    timer.onsets = onsets
    return [ArmTimer(IDLE, timer.due_at)]


def void(timer: IdleTimer) -> list[CancelTimer]:
    """A response starts (or the session stops responding): no prompt due."""
    if timer.due_at is None:
        return []
    timer.due_at = None
    return [CancelTimer(IDLE)]


def due(timer: IdleTimer, config: SessionConfig, now: float, *, replying: bool,
        user: UserTurn, written_ms: int) -> ev.InputAudioBufferTimeoutTriggered | None:
    """The ``idle_timeout`` timer: the prompt to make -- then the core commits
    the buffer and makes a response -- unless the user spoke, a reply is
    under way, or the setting went away meanwhile."""
    if timer.due_at is None or now + _EPS < timer.due_at:
        return None  # voided, or a stray wake-up
    timer.due_at = None
    ms = timeout_ms(config)
    if ms is None or replying or user.speaking or user.onsets != timer.onsets:
        return None
    return ev.InputAudioBufferTimeoutTriggered(
        audio_start_ms=max(0, written_ms - ms), audio_end_ms=written_ms, item_id=user.item_id())
