"""server_vad's idle_timeout_ms, through the session core at chosen times: a
user silent that long after the reply has played out is prompted to go on
(``input_audio_buffer.timeout_triggered``, a commit of the silence, a
response), as OpenAI Realtime documents; speech or a response voids it."""

from __future__ import annotations

import numpy as np
from support.session_core import TEN_MS, create_response, make_core, output, types
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.interruption import OutputPacing
from vllm_duplex.domain.payloads import AudioOut, GenerationDone, SpeechDone, VadSpeechStarted
from vllm_duplex.domain.session_config import TurnDetection
from vllm_duplex.session.effects import ArmTimer, CancelTimer, TimerFired
from vllm_duplex.session.idle import IDLE


def idle_core(ms: int | None = 2000, **config):
    config.setdefault("turn_detection", TurnDetection(idle_timeout_ms=ms))
    core = make_core(**config)
    core.start("tok", 0.0)
    return core


def play_a_reply(core, at: float, seconds: float = 1.0):
    """A reply of ``seconds`` of audio, its first audio sent at ``at``; the effects of its end."""
    rid = create_response(core, at)
    output(core, AudioOut(rid, np.zeros(int(16000 * seconds), np.int16), text="hello there"),
           stage="tts", now=at)
    output(core, GenerationDone(rid, "stop", 3, 1), now=at + 0.05)
    return output(core, SpeechDone(rid), stage="tts", now=at + 0.1)


def listen(core, seconds: float, start: float) -> None:
    for k in range(int(seconds * 100)):  # silence, 10 ms a chunk, as a microphone sends it
        core.handle(cmd.AudioAppend(audio=TEN_MS), start + k * 0.01)


def test_silence_after_the_reply_played_out_prompts_the_user():
    core = idle_core(2000)
    done = play_a_reply(core, at=10.0)
    assert types(done)[-2:] == ["response.done", "ArmTimer"]
    assert done[-1] == ArmTimer(IDLE, 13.0)  # unpaced: 1 s of audio from 10.0 plays out at 11.0
    listen(core, 3.0, start=10.0)
    fired = core.handle(TimerFired(IDLE), 13.0)
    names = types(fired)
    assert names[:4] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed",
                         "conversation.item.added", "conversation.item.done"]
    assert "response.created" in names and names[-1] == "Submit"
    triggered = fired[0].envelope.event
    # the input written (3 s, less what the resampler still holds) ...
    assert 2950 <= triggered.audio_end_ms <= 3000
    # ... and the silent segment before it: the timeout's length
    assert triggered.audio_start_ms == triggered.audio_end_ms - 2000
    assert triggered.item_id == fired[1].envelope.event.item_id  # the item it commits
    assert core.shown is not None  # the model prompts the user now


def test_paced_audio_counts_from_when_the_client_runs_dry():
    core = idle_core(1000, pacing=OutputPacing("realtime", lead_ms=200))
    rid = create_response(core, 10.0)
    output(core, AudioOut(rid, np.zeros(8000, np.int16), text="hi"), stage="tts", now=10.0)
    output(core, GenerationDone(rid, "stop", 1, 1), now=10.0)
    output(core, SpeechDone(rid), stage="tts", now=10.0)
    armed = []
    t = 10.0
    while not armed and t < 12.0:  # the pacer's frames go out; response.done after the last
        t += 0.05
        armed = [e for e in core.handle(TimerFired("pacing"), t) if isinstance(e, ArmTimer)
                 and e.name == IDLE]
    assert armed and armed[0].at >= 10.5 + 1.0 - 1e-6  # 500 ms of audio, then the timeout


def test_speech_voids_the_timeout():
    core = idle_core(2000)
    play_a_reply(core, at=10.0)
    output(core, VadSpeechStarted(audio_ms=500), stage="vad", now=12.0)
    assert core.handle(TimerFired(IDLE), 13.0) == []


def test_a_response_voids_it_and_a_stray_wake_up_does_nothing():
    core = idle_core(2000)
    play_a_reply(core, at=10.0)
    assert core.handle(TimerFired(IDLE), 12.0) == []  # early: not due yet
    effects = core.handle(cmd.ResponseCreate(), 12.5)
    assert CancelTimer(IDLE) in effects
    assert core.handle(TimerFired(IDLE), 13.0) == []


def test_only_server_vad_has_it():
    for core in (idle_core(None), idle_core(2000, turn_detection=None),
                 idle_core(2000, turn_detection=TurnDetection(type="semantic_vad"))):
        done = play_a_reply(core, at=10.0)
        assert not any(isinstance(e, ArmTimer) and e.name == IDLE for e in done)
