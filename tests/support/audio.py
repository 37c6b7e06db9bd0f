"""Synthetic audio for tests: tones, silence, chunking, base64 (the wire's
encoding). Real speech (Flite) is in ``speech_fixtures``."""

from __future__ import annotations

import base64

import numpy as np


def tone(seconds: float, *, rate: int = 24000, freq: float = 220.0, dbfs: float = -10.0) -> bytes:
    """A speech-like sine, PCM16 little-endian (peak at ``dbfs``)."""
    t = np.arange(int(rate * seconds)) / rate
    amp = 32767.0 * 10.0 ** (dbfs / 20.0)
    return np.round(amp * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def pcm16(seconds: float, amplitude: float = 0.0, *, rate: int = 24000) -> bytes:
    """A 220 Hz sine at ``amplitude`` (0..1 of full scale; 0: silence), PCM16."""
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * 32767 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()


def silence(seconds: float, *, rate: int = 24000) -> bytes:
    return np.zeros(int(rate * seconds), "<i2").tobytes()


def utterance(*, rate: int = 24000, speech_s: float = 0.8, silence_s: float = 1.0) -> bytes:
    return tone(speech_s, rate=rate) + silence(silence_s, rate=rate)


def chunks(pcm: bytes, *, rate: int = 24000, ms: int = 20) -> list[bytes]:
    step = rate * ms // 1000 * 2
    return [pcm[i:i + step] for i in range(0, len(pcm), step)]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
