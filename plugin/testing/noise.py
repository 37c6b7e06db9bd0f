"""Sounds that are not speech, for the no-speech gate's tests and bench.

A microphone hears more than its user: a fan, a room of other talkers, music,
a keyboard, the hiss of a phone line. None of them may become words (Whisper
writes "you" or "Thank you." for many of them). Each maker here returns
``seconds`` of int16 16 kHz mono at ``level_dbfs`` RMS (0 dBFS: a full-scale
sine's RMS is -3), seeded, so a test hears the same sound on every machine.

``babble`` needs speech to mix (the caller synthesizes it: Flite, eSpeak NG):
six or more talkers at once, each time-shifted and gain-varied, is the
"cafeteria" background of speech-enhancement corpora -- voices, no words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RATE = 16000


def at_level(x: np.ndarray, level_dbfs: float) -> np.ndarray:
    """``x`` (any float scale) scaled to ``level_dbfs`` RMS, as int16."""
    x = np.asarray(x, np.float64)
    rms = float(np.sqrt(np.mean(x * x))) or 1.0
    target = 32768.0 * 10 ** (level_dbfs / 20)
    return np.clip(x * (target / rms), -32768, 32767).astype(np.int16)


def _samples(seconds: float) -> int:
    return int(round(seconds * RATE))


def _lowpass(x: np.ndarray, cutoff_hz: float) -> np.ndarray:
    spec = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(x.size, 1 / RATE)
    spec[freqs > cutoff_hz] = 0
    return np.fft.irfft(spec, x.size)


def _highpass(x: np.ndarray, cutoff_hz: float) -> np.ndarray:
    spec = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(x.size, 1 / RATE)
    spec[freqs < cutoff_hz] = 0
    return np.fft.irfft(spec, x.size)


def silence(seconds: float, level_dbfs: float = -90.0, seed: int = 0) -> np.ndarray:
    """A quiet room: dither a few LSB up (a real input is never all zeros)."""
    rng = np.random.default_rng(seed)
    return at_level(rng.standard_normal(_samples(seconds)), level_dbfs)


def fan(seconds: float, level_dbfs: float, seed: int = 0) -> np.ndarray:
    """A fan or air conditioner: brown-ish broadband rumble under 2 kHz plus
    the blade tone (about 120 Hz) and its harmonics, slowly wavering."""
    rng = np.random.default_rng(seed)
    n = _samples(seconds)
    rumble = _lowpass(np.cumsum(rng.standard_normal(n)) * 0.02 + rng.standard_normal(n), 2000)
    t = np.arange(n) / RATE
    wobble = 1 + 0.01 * np.sin(2 * np.pi * 0.3 * t)
    blade = sum(np.sin(2 * np.pi * 120 * k * wobble * t) / k for k in (1, 2, 3))
    rumble /= np.std(rumble) or 1.0
    return at_level(rumble + 0.5 * blade, level_dbfs)


def line_hiss(seconds: float, level_dbfs: float, seed: int = 0) -> np.ndarray:
    """A phone line's hiss: white noise over 300 Hz, with a faint 60 Hz hum."""
    rng = np.random.default_rng(seed)
    n = _samples(seconds)
    hiss = _highpass(rng.standard_normal(n), 300)
    hum = 0.1 * np.sin(2 * np.pi * 60 * np.arange(n) / RATE)
    return at_level(hiss / (np.std(hiss) or 1.0) + hum, level_dbfs)


def colored(seconds: float, level_dbfs: float, exponent: float, seed: int = 0) -> np.ndarray:
    """Noise whose power falls as 1/f**``exponent``: 0 white, 1 pink, 2 brown."""
    n = _samples(seconds)
    spec = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / RATE)
    spec[1:] /= f[1:] ** (exponent / 2)
    spec[0] = 0.0
    return at_level(np.fft.irfft(spec, n), level_dbfs)


def hum(seconds: float, level_dbfs: float, mains_hz: float = 50.0) -> np.ndarray:
    """Mains hum: ``mains_hz`` and its first harmonics, falling (a
    transformer's buzz; steady, and no voice, but most of it under 500 Hz)."""
    t = np.arange(_samples(seconds)) / RATE
    return at_level(sum(np.sin(2 * np.pi * mains_hz * k * t + k) / k for k in range(1, 9)),
                    level_dbfs)


def keyboard(seconds: float, level_dbfs: float, seed: int = 0) -> np.ndarray:
    """Typing: clicks (a few ms of decaying band noise, key down and up) at
    five to ten a second, uneven, over a quiet room."""
    rng = np.random.default_rng(seed)
    n = _samples(seconds)
    out = rng.standard_normal(n) * 0.003
    pos = int(rng.uniform(0.02, 0.1) * RATE)
    while pos < n:
        for offset, gain in ((0, 1.0), (int(rng.uniform(0.06, 0.12) * RATE), 0.5)):
            start = pos + offset
            length = min(int(0.012 * RATE), n - start)
            if length <= 0:
                continue
            burst = _highpass(rng.standard_normal(length), 1000)
            out[start:start + length] += gain * burst * np.exp(-np.arange(length) / (0.002 * RATE))
        pos += int(rng.uniform(0.1, 0.2) * RATE)
    return at_level(out, level_dbfs)


def music(seconds: float, level_dbfs: float, seed: int = 0) -> np.ndarray:
    """Instrumental music: a chord change every half second (three notes with
    harmonics and a plucked envelope), a bass line and a kick on the beat."""
    rng = np.random.default_rng(seed)
    n = _samples(seconds)
    t = np.arange(n) / RATE
    out = np.zeros(n)
    beat = int(0.5 * RATE)
    roots = (220.0, 246.9, 196.0, 261.6)
    for i, start in enumerate(range(0, n, beat)):
        end = min(n, start + beat)
        seg = t[start:end] - t[start]
        root = roots[(i + int(rng.integers(0, 4))) % len(roots)]
        env = np.exp(-seg * 4)
        for ratio in (1.0, 1.26, 1.5):  # a major triad
            f = root * ratio
            out[start:end] += env * sum(np.sin(2 * np.pi * f * k * seg) / k ** 1.5 for k in (1, 2, 3, 4))
        out[start:end] += 0.8 * np.exp(-seg * 3) * np.sin(2 * np.pi * root / 4 * seg)  # bass
        kick = np.exp(-seg * 40) * np.sin(2 * np.pi * 60 * seg * np.exp(-seg * 10))
        out[start:end] += 1.5 * kick
    return at_level(out, level_dbfs)


def babble(voices: Sequence[np.ndarray], seconds: float, level_dbfs: float,
           seed: int = 0) -> np.ndarray:
    """Many people talking at once: each of ``voices`` (int16 16 kHz speech,
    six or more) looped from a random offset with its own gain, summed."""
    if len(voices) < 6:
        raise ValueError("babble takes six or more voices: fewer are talkers, not a crowd")
    rng = np.random.default_rng(seed)
    n = _samples(seconds)
    out = np.zeros(n)
    for v in voices:
        v = np.asarray(v, np.float64)
        v = v / (np.std(v) or 1.0)
        reps = -(-(n + v.size) // v.size)
        looped = np.tile(v, reps)
        start = int(rng.integers(0, v.size))
        out += rng.uniform(0.6, 1.0) * looped[start:start + n]
    return at_level(out, level_dbfs)


NoiseMaker = Callable[[float, float], np.ndarray]


def makers(babble_voices: Sequence[np.ndarray]) -> dict[str, NoiseMaker]:
    """Every kind by name: ``maker(seconds, level_dbfs)``."""
    return {
        "fan": lambda s, db: fan(s, db),
        "babble": lambda s, db: babble(babble_voices, s, db),
        "music": lambda s, db: music(s, db),
        "keyboard": lambda s, db: keyboard(s, db),
        "line_hiss": lambda s, db: line_hiss(s, db),
    }


def mixed(speech: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``speech`` over ``noise`` (noise looped or cut to the speech's length)."""
    reps = -(-speech.size // noise.size)
    bed = np.tile(noise, reps)[: speech.size].astype(np.int32)
    return np.clip(speech.astype(np.int32) + bed, -32768, 32767).astype(np.int16)
