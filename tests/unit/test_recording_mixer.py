"""The session recording's mixer (``media/recording.py``): two tracks laid on
the session's clock, a stereo WAV a user opens, bounded."""

from __future__ import annotations

import io
import wave

import numpy as np
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat
from vllm_duplex.media.audio import ulaw_encode
from vllm_duplex.media.recording import Recording

PCM24 = AudioFormat()
RATE = 24000


def tone(seconds: float, value: int = 1000) -> bytes:
    return np.full(int(seconds * RATE), value, dtype="<i2").tobytes()


def opened(wav: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, RATE)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, 2)


def test_the_caller_is_left_and_the_assistant_right_where_each_was_heard():
    rec = Recording(PCM24, PCM24, started_at=100.0)
    rec.heard(tone(0.5, 1000), at=101.0)  # spoken from 0.5 s to 1.0 s
    rec.played(tone(0.25, -2000), at=101.5)  # played from 1.5 s
    frames = opened(rec.wav())
    assert len(frames) == int(1.75 * RATE)
    caller, assistant = frames[:, 0], frames[:, 1]
    assert (caller[:int(0.5 * RATE)] == 0).all() and (caller[int(0.5 * RATE):RATE] == 1000).all()
    assert (caller[RATE:] == 0).all()
    assert (assistant[:int(1.5 * RATE)] == 0).all() and (assistant[int(1.5 * RATE):] == -2000).all()


def test_audio_sent_ahead_of_time_is_laid_end_to_end_never_over_itself():
    rec = Recording(PCM24, PCM24, started_at=0.0)
    for i in range(5):  # five 100 ms chunks sent at once (the pacing's lead)
        rec.played(tone(0.1, 100 * (i + 1)), at=2.0)
    assistant = opened(rec.wav())[:, 1]
    assert len(assistant) == int(2.5 * RATE)
    for i in range(5):
        start = round((2.0 + 0.1 * i) * RATE)
        assert (assistant[start:start + round(0.1 * RATE)] == 100 * (i + 1)).all()


def test_other_formats_are_recorded_at_24khz():
    rec = Recording(AudioFormat(AudioEncoding.PCMU, 8000), AudioFormat(AudioEncoding.PCM16, 16000),
                    started_at=0.0)
    rec.heard(ulaw_encode(np.full(8000, 8000, dtype=np.int16)), at=1.0)  # 1 s at 8 kHz
    rec.played(np.full(16000, 4000, dtype="<i2").tobytes(), at=1.0)  # 1 s at 16 kHz
    frames = opened(rec.wav())
    assert abs(len(frames) - 2 * RATE) < RATE // 50  # the resampler's delay: under 20 ms
    assert abs(np.median(frames[RATE // 4:RATE // 2, 0]) - 8000) < 300
    assert abs(np.median(frames[int(1.25 * RATE):int(1.75 * RATE), 1]) - 4000) < 50


def test_the_recording_keeps_its_first_max_s_and_says_it_was_cut():
    rec = Recording(PCM24, PCM24, started_at=0.0, max_s=2.0)
    rec.heard(tone(1.5), at=1.5)
    assert not rec.truncated
    rec.played(tone(1.0), at=1.5)  # 0.5 s of it fits
    rec.heard(tone(0.5), at=3.0)  # past the end: dropped
    assert rec.truncated
    frames = opened(rec.wav())
    assert len(frames) == 2 * RATE and rec.duration_s == 2.0
    assert (frames[int(1.5 * RATE):, 1] == 1000).all()


def test_an_empty_recording_is_a_valid_empty_wav():
    assert len(opened(Recording(PCM24, PCM24, started_at=0.0).wav())) == 0
